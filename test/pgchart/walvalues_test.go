package pgchart

import (
	"strings"
	"testing"
)

// TestChartRendersArchiveValues: the walArchive values the Postgres kind's
// backup hook gives (an S3 store with a CA, encryption, failover on)
// render, with archive_command and restore_command naming the store.
func TestChartRendersArchiveValues(t *testing.T) {
	r := render(t, map[string]any{
		"replicas": 2, "failover": map[string]any{"enabled": true},
		"walArchive": map[string]any{"enabled": true, "prefix": "shop/orders/pg15", "timeout": "10s",
			"storeArgs": []any{"--store=s3", "--s3-bucket=backups", "--s3-endpoint=http://198.18.0.1:9000", "--s3-prefix=tenant-a", "--s3-force-path-style"},
			"secretEnv": []any{map[string]any{"name": "CHARTPILOT_S3_ACCESS_KEY_ID", "secretName": "s3-creds", "key": "accessKeyID"},
				map[string]any{"name": "CHARTPILOT_AGE_KEY", "secretName": "wal-key", "key": "age"}}},
	})
	conf := r.config["postgresql.conf"]
	for _, want := range []string{"wal-push --prefix=shop/orders/pg15 --parallel=4 --store=s3", "restore_command = '/chartpilot/bin/chartpilot wal-fetch --prefix=shop/orders/pg15 --store=s3", "%f %p'", "archive_timeout = '10s'"} {
		if !strings.Contains(conf, want) {
			t.Errorf("postgresql.conf lacks %q:\n%s", want, conf)
		}
	}
}
