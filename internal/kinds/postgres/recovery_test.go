package postgres

import (
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"

	"github.com/chartpilot/chartpilot/internal/api/v1alpha1"
)

// TestArchivingState: the newest attempt failing is Failing, naming the
// file; many files waiting is Behind; else Archiving. The message holds
// nothing that changes with every file (it is written to status).
func TestArchivingState(t *testing.T) {
	for _, tc := range []struct {
		r     v1alpha1.ArchiveReport
		state string
		in    string
	}{
		{v1alpha1.ArchiveReport{WAL: "000000010000000000000003", At: 200}, v1alpha1.ArchivingOK, ""},
		{v1alpha1.ArchiveReport{WAL: "000000010000000000000003", At: 200, Failed: 3, FailedWAL: "000000010000000000000002", FailedAt: 100}, v1alpha1.ArchivingOK, ""},
		{v1alpha1.ArchiveReport{WAL: "000000010000000000000003", At: 200, Failed: 4, FailedWAL: "000000010000000000000004", FailedAt: 260}, v1alpha1.ArchivingFailing, "archiving 000000010000000000000004 failed"},
		{v1alpha1.ArchiveReport{Failed: 1, FailedWAL: "000000010000000000000001", FailedAt: 5}, v1alpha1.ArchivingFailing, "pod db-0"},
		{v1alpha1.ArchiveReport{WAL: "000000010000000000000003", At: 200, Pending: 40}, v1alpha1.ArchivingBehind, "more than 16 WAL files"},
	} {
		got := archivingState(tc.r, "db-0")
		if got.State != tc.state || !strings.Contains(got.Message, tc.in) || got.Member != "db-0" {
			t.Errorf("%+v: %+v, want %s with %q", tc.r, got, tc.state, tc.in)
		}
		if strings.Contains(got.Message, "40") {
			t.Errorf("%+v: the message %q carries a figure that changes with every file", tc.r, got.Message)
		}
	}
}

// TestRecoveryOutcomeRead: the recover container's outcome (its
// termination message) is status.recovery: completed with where it
// stopped, or failed with the agent's words and what happens next.
func TestRecoveryOutcomeRead(t *testing.T) {
	st := &v1alpha1.PostgresRecoveryStatus{}
	readOutcome(st, &corev1.ContainerStateTerminated{ExitCode: 0, Message: `{"phase":"Completed","message":"recovered to time X","target":"time X","base":"p/base/b","timeline":3,"lastTransactionTime":"2026-12-07 08:48:39.483464+00"}`})
	if st.Phase != v1alpha1.RecoveryCompleted || st.Timeline != 3 || st.BaseBackup != "p/base/b" || st.LastTransactionTime == "" || st.Target != "time X" {
		t.Errorf("completed: %+v", st)
	}
	st = &v1alpha1.PostgresRecoveryStatus{}
	readOutcome(st, &corev1.ContainerStateTerminated{ExitCode: 1, Message: `{"phase":"Failed","message":"the archive has a gap at segment 000000010000000000000004"}`})
	if st.Phase != v1alpha1.RecoveryFailed || !strings.Contains(st.Message, "000000010000000000000004") || !strings.Contains(st.Message, "tries again") {
		t.Errorf("failed: %+v", st)
	}
	st = &v1alpha1.PostgresRecoveryStatus{}
	readOutcome(st, &corev1.ContainerStateTerminated{ExitCode: 0, Message: `{"phase":"Skipped","message":"the cluster had a primary (Lease db-primary was held)"}`})
	if st.Phase != v1alpha1.RecoverySkipped || !strings.Contains(st.Message, "did not run: the cluster had a primary") {
		t.Errorf("skipped: %+v", st)
	}
	st = &v1alpha1.PostgresRecoveryStatus{}
	readOutcome(st, &corev1.ContainerStateTerminated{ExitCode: 2, Message: "panic: something\nexit status 2"})
	if st.Phase != v1alpha1.RecoveryFailed || !strings.HasPrefix(st.Message, "exit status 2") {
		t.Errorf("a log tail: %+v", st)
	}
}

// TestArchivingCondition: ContinuousArchiving follows status.archiving,
// and goes when the Postgres reports no archiving.
func TestArchivingCondition(t *testing.T) {
	for _, tc := range []struct {
		archiving      any
		status, reason string
	}{
		{map[string]any{"state": "Archiving", "member": "db-1"}, "True", "Archiving"},
		{map[string]any{"state": "Failing", "message": "archiving X failed"}, "False", "ArchiveFailing"},
		{map[string]any{"state": "Behind", "message": "more than 16"}, "False", "ArchiveBehind"},
		{nil, "", ""},
	} {
		got := Conditions(map[string]any{"archiving": tc.archiving})
		c, ok := got[v1alpha1.ConditionContinuousArchiving]
		if !ok {
			t.Fatalf("%v: no ContinuousArchiving entry", tc.archiving)
		}
		if tc.status == "" {
			if c != nil {
				t.Errorf("no archiving: %+v, want the condition removed", c)
			}
			continue
		}
		if c == nil || string(c.Status) != tc.status || c.Reason != tc.reason || c.Message == "" {
			t.Errorf("%v: %+v, want %s %s with a message", tc.archiving, c, tc.status, tc.reason)
		}
	}
}

// TestRawValuesCannotReadAStore: spec.values cannot carry the chart's
// walArchive or bootstrap values, which would read a store past the
// checks of the typed fields; the error names the field to use.
func TestRawValuesCannotReadAStore(t *testing.T) {
	for key, field := range map[string]string{"walArchive": "spec.backup.walArchive", "bootstrap": "spec.bootstrap.recovery"} {
		obj := pgObject(map[string]any{"version": "15", "storage": map[string]any{"size": "1Gi"},
			"values": map[string]any{key: map[string]any{"enabled": true, "prefix": "other-namespace/db/pg15"}}})
		if _, err := Values(obj); err == nil || !strings.Contains(err.Error(), "spec.values."+key) || !strings.Contains(err.Error(), field) {
			t.Errorf("spec.values.%s: %v, want an error naming it and %s", key, err, field)
		}
	}
}

// TestArchiveReportParsed: what a member's Lease says is used only when it
// is what an instance manager writes: WAL file names, counts that are not
// negative, a short annotation. A forged one is left out.
func TestArchiveReportParsed(t *testing.T) {
	good := `{"wal":"000000010000000000000003","at":200,"failed":1,"failedWAL":"00000002.history","failedAt":100,"pending":2}`
	if r, ok := parseArchiveReport(good); !ok || r.WAL != "000000010000000000000003" || r.Pending != 2 {
		t.Errorf("a member's report: %+v, %v", r, ok)
	}
	for _, bad := range []string{
		"", "not json",
		`{"wal":"000000010000000000000003","failedWAL":"` + strings.Repeat("A", 40000) + `"}`,
		`{"failedWAL":"../../etc/passwd","failedAt":5}`,
		`{"wal":"000000010000000000000003","at":-1}`,
		`{"pending":-5}`,
	} {
		if _, ok := parseArchiveReport(bad); ok {
			t.Errorf("%.80q: taken", bad)
		}
	}
}
