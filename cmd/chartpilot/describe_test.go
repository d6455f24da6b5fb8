package main

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/chartpilot/chartpilot/internal/api/v1alpha1"
)

// describe shows a Postgres's backups: the last logical one and the
// next, the base backups, and what its WAL archive can recover to.
func TestDescribeShowsTheArchive(t *testing.T) {
	now := time.Date(2026, 12, 7, 12, 0, 0, 0, time.UTC)
	u := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "chartpilot.dev/v1alpha1", "kind": "Postgres",
		"metadata": map[string]any{"namespace": "shop", "name": "orders", "creationTimestamp": "2026-12-01T00:00:00Z"},
		"status": map[string]any{"backup": map[string]any{
			"lastSuccessfulBackup": "orders-202612070300", "lastSuccessTime": "2026-12-07T03:05:00Z", "nextScheduleTime": "2026-12-08T03:00:00Z",
			"lastBaseBackup": "orders-base-202612070000", "lastBaseBackupTime": "2026-12-07T00:04:00Z", "nextBaseBackupTime": "2026-12-08T00:00:00Z",
			"lastPruneResult": "Succeeded: 1 base backups and 312 WAL files pruned; 7 base backups and 2016 files left",
			"archive": map[string]any{"firstRecoverableTime": "2026-11-30T00:04:00Z", "lastArchivedTime": "2026-12-07T11:59:00Z",
				"lastArchivedWAL": "0000000200000004000000A1", "baseBackups": int64(7), "files": int64(2016), "checkedAt": "2026-12-07T01:00:00Z"},
		},
			"archiving": map[string]any{"state": "Failing", "message": "archiving 0000000200000004000000A2 failed; the server keeps its WAL", "member": "orders-1"},
			"recovery": map[string]any{"phase": "Completed", "target": "time 2026-12-01T10:00:00Z", "baseBackup": "shop/old/pg17/base/x",
				"timeline": int64(3), "lastTransactionTime": "2026-12-01 09:59:58.1+00"}},
	}}
	var out bytes.Buffer
	if err := printDescription(&out, "Postgres", u, &v1alpha1.ReleaseStatus{}, nil, now); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"Logical:      last orders-202612070300 at 2026-12-07T03:05:00Z (8h ago), next 2026-12-08T03:00:00Z (in 15h)",
		"Base backup:  last orders-base-202612070000 at 2026-12-07T00:04:00Z",
		"Recoverable:  from 2026-11-30T00:04:00Z",
		"to 2026-12-07T11:59:00Z (60s ago) (last WAL 0000000200000004000000A1; 7 base backups, 2016 files",
		"Prune:        Succeeded: 1 base backups",
		"Archiving:    Failing: archiving 0000000200000004000000A2 failed",
		"Phase:        Completed, to time 2026-12-01T10:00:00Z",
		"From:         shop/old/pg17/base/x",
		"Reached:      timeline 3, last transaction committed at 2026-12-01 09:59:58.1+00",
	} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("describe lacks %q:\n%s", want, out.String())
		}
	}
}
