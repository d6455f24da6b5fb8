package pgchart

import (
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
)

// TestChartRendersArchiveValues: the walArchive values the Postgres kind's
// backup hook gives (an S3 store with a CA, encryption, failover on)
// render: archive_command and restore_command ask the WAL service of the
// wal-agent container, which names the store and alone has the Secrets'
// references; the server's container has none of them.
func TestChartRendersArchiveValues(t *testing.T) {
	r := render(t, map[string]any{
		"replicas": 2, "failover": map[string]any{"enabled": true},
		"walArchive": map[string]any{"enabled": true, "prefix": "shop/orders/pg15", "timeout": "10s",
			"storeArgs": []any{"--store=s3", "--s3-bucket=backups", "--s3-endpoint=http://198.18.0.1:9000", "--s3-prefix=tenant-a", "--s3-force-path-style", "--s3-ca-file=/etc/chartpilot/ca/ca.pem"},
			"secretEnv": []any{map[string]any{"name": "CHARTPILOT_S3_ACCESS_KEY_ID", "secretName": "s3-creds", "key": "accessKeyID"},
				map[string]any{"name": "CHARTPILOT_AGE_KEY", "secretName": "wal-key", "key": "age"}},
			"ca": map[string]any{"secretName": "s3-ca"}},
	})
	conf := r.config["postgresql.conf"]
	for _, want := range []string{"archive_command = '/chartpilot/bin/chartpilot wal-push --via=/var/run/postgresql/.chartpilot-wal %p'",
		"restore_command = '/chartpilot/bin/chartpilot wal-fetch --via=/var/run/postgresql/.chartpilot-wal %f %p'", "archive_timeout = '10s'"} {
		if !strings.Contains(conf, want) {
			t.Errorf("postgresql.conf lacks %q:\n%s", want, conf)
		}
	}
	var server, agent *corev1.Container
	for i, c := range r.sts.Spec.Template.Spec.Containers {
		switch c.Name {
		case "postgresql":
			server = &r.sts.Spec.Template.Spec.Containers[i]
		case "wal-agent":
			agent = &r.sts.Spec.Template.Spec.Containers[i]
		}
	}
	if server == nil || agent == nil {
		t.Fatalf("containers %v: want postgresql and wal-agent", r.sts.Spec.Template.Spec.Containers)
	}
	if got := strings.Join(agent.Command, " "); got != "/usr/local/bin/chartpilot wal-serve --socket=/var/run/postgresql/.chartpilot-wal --data-dir=/var/lib/postgresql/data/pgdata --prefix=shop/orders/pg15 --parallel=4 --store=s3 --s3-bucket=backups --s3-endpoint=http://198.18.0.1:9000 --s3-prefix=tenant-a --s3-force-path-style --s3-ca-file=/etc/chartpilot/ca/ca.pem" {
		t.Errorf("wal-agent runs %s", got)
	}
	refs := map[string]string{}
	for _, e := range agent.Env {
		if e.ValueFrom != nil && e.ValueFrom.SecretKeyRef != nil {
			refs[e.Name] = e.ValueFrom.SecretKeyRef.Name + "/" + e.ValueFrom.SecretKeyRef.Key
		}
	}
	if refs["CHARTPILOT_S3_ACCESS_KEY_ID"] != "s3-creds/accessKeyID" || refs["CHARTPILOT_AGE_KEY"] != "wal-key/age" {
		t.Errorf("wal-agent's Secret references: %v", refs)
	}
	for _, e := range server.Env {
		if strings.HasPrefix(e.Name, "CHARTPILOT_") {
			t.Errorf("the server's container has %s", e.Name)
		}
	}
	mounts := map[string]string{}
	for _, m := range agent.VolumeMounts {
		mounts[m.MountPath] = m.Name
	}
	for _, m := range server.VolumeMounts {
		if m.Name == "store-ca" {
			t.Error("the server's container mounts the store's CA")
		}
	}
	if mounts["/var/run/postgresql"] != "run" || mounts["/var/lib/postgresql/data"] != "data" || mounts["/etc/chartpilot/ca"] != "store-ca" {
		t.Errorf("wal-agent's mounts: %v", mounts)
	}
}
