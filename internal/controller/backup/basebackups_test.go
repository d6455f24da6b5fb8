package backup_test

import (
	"fmt"
	"sort"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/chartpilot/chartpilot/internal/api/v1alpha1"
	"github.com/chartpilot/chartpilot/internal/controller/backup"
	"github.com/chartpilot/chartpilot/internal/testing/testwait"
)

// TestBaseBackupsScheduled: a Postgres with a WAL archive gets a physical
// Backup as soon as it serves (its archive has no base backup), none
// while one runs, then one at each time of baseBackupSchedule; after a
// major upgrade (the newest base backup is of the old major) one at once
// again; a failed one is retried after a quarter of an hour, not at
// once; status.backup names the newest base backup of the major and the
// next schedule time. Before the Postgres serves, none is made.
func TestBaseBackupsScheduled(t *testing.T) {
	cluster.Skip(t)
	ns := cluster.Namespace(t)
	clk := &clock{t: time.Now()}
	ctx, c := startControllers(t, func(mgr ctrl.Manager) []controller {
		return []controller{&backup.ScheduleReconciler{Deps: backup.Deps{Client: mgr.GetClient(), Recorder: mgr.GetEventRecorderFor("test"), SkipNameValidation: true, Now: clk.now}}}
	})
	pg := &v1alpha1.Postgres{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "db"}, Spec: v1alpha1.PostgresSpec{
		Version: "15", Storage: v1alpha1.PostgresStorage{Size: "1Gi"},
		Backup: &v1alpha1.PostgresBackup{Store: v1alpha1.StoreRef{Name: "s3"}, Schedule: "0 3 29 2 *",
			WALArchive: &v1alpha1.PostgresWALArchive{BaseBackupSchedule: "0 * * * *"}},
	}}
	if err := c.Create(ctx, pg); err != nil {
		t.Fatal(err)
	}
	key := client.ObjectKeyFromObject(pg)
	poke := func() {
		t.Helper()
		patch := fmt.Sprintf(`{"metadata":{"annotations":{"test/poke":%q}}}`, clk.now().String())
		if err := c.Patch(ctx, &v1alpha1.Postgres{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "db"}}, client.RawPatch(types.MergePatchType, []byte(patch))); err != nil {
			t.Fatal(err)
		}
	}
	physical := func() []v1alpha1.Backup {
		t.Helper()
		l := &v1alpha1.BackupList{}
		if err := c.List(ctx, l, client.InNamespace(ns)); err != nil {
			t.Fatal(err)
		}
		var out []v1alpha1.Backup
		for _, b := range l.Items {
			if b.Spec.Method == v1alpha1.BackupPhysical {
				out = append(out, b)
			}
		}
		sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
		return out
	}
	eventually := func(what string, ok func() bool) {
		t.Helper()
		if !testwait.Until(2*time.Minute, 200*time.Millisecond, ok) {
			t.Fatalf("never: %s; physical Backups %v", what, names(physical()))
		}
	}
	complete := func(name, version string) {
		t.Helper()
		b := &v1alpha1.Backup{}
		if err := c.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, b); err != nil {
			t.Fatal(err)
		}
		now := metav1.NewTime(clk.now().Truncate(time.Second))
		b.Status = v1alpha1.BackupStatus{Phase: v1alpha1.BackupCompleted, CompletedAt: &now, Size: 42, DatabaseVersion: version}
		if err := c.Status().Update(ctx, b); err != nil {
			t.Fatal(err)
		}
	}
	serve := func() {
		t.Helper()
		cur := &v1alpha1.Postgres{}
		if err := c.Get(ctx, key, cur); err != nil {
			t.Fatal(err)
		}
		cur.Status.Conditions = append(cur.Status.Conditions, metav1.Condition{Type: v1alpha1.ConditionReady, Status: metav1.ConditionTrue, Reason: "InstallSucceeded", Message: "ok", LastTransitionTime: metav1.Now()})
		if err := c.Status().Update(ctx, cur); err != nil {
			t.Fatal(err)
		}
	}

	// Not serving yet: nothing, though the archive has no base backup.
	eventually("the next base backup time in status", func() bool {
		got := &v1alpha1.Postgres{}
		return c.Get(ctx, key, got) == nil && got.Status.Backup != nil && got.Status.Backup.NextBaseBackupTime != nil
	})
	if n := len(physical()); n != 0 {
		t.Fatalf("%d physical Backups of a Postgres that does not serve yet", n)
	}
	serve()
	eventually("a base backup at once", func() bool { return len(physical()) == 1 })
	// It fails: the next waits a quarter of an hour, not a minute.
	failed := physical()[0].Name
	fb := &v1alpha1.Backup{}
	if err := c.Get(ctx, client.ObjectKey{Namespace: ns, Name: failed}, fb); err != nil {
		t.Fatal(err)
	}
	failedAt := metav1.NewTime(clk.now().Truncate(time.Second))
	fb.Status = v1alpha1.BackupStatus{Phase: v1alpha1.BackupFailed, CompletedAt: &failedAt, Message: "the store did not answer"}
	if err := c.Status().Update(ctx, fb); err != nil {
		t.Fatal(err)
	}
	clk.add(2 * time.Minute)
	poke()
	if !testwait.Holds(3*time.Second, 200*time.Millisecond, func() bool { return len(physical()) == 1 }) {
		t.Fatalf("physical Backups %v two minutes after a failed one, want no retry yet", names(physical()))
	}
	clk.add(15 * time.Minute)
	poke()
	eventually("a base backup again after the failed one", func() bool { return len(physical()) == 2 })
	var first string
	for _, b := range physical() {
		if b.Name != failed {
			first = b.Name
		}
	}
	// While it runs, no other, however much time passes.
	clk.add(2 * time.Hour)
	poke()
	if !testwait.Holds(3*time.Second, 200*time.Millisecond, func() bool { return len(physical()) == 2 }) {
		t.Fatalf("physical Backups %v while one runs, want no other", names(physical()))
	}
	complete(first, "15")
	eventually("status names the newest base backup", func() bool {
		got := &v1alpha1.Postgres{}
		return c.Get(ctx, key, got) == nil && got.Status.Backup != nil && got.Status.Backup.LastBaseBackup == first
	})
	// The next schedule time (hourly here) makes the next.
	clk.add(time.Hour)
	poke()
	eventually("a base backup at the schedule time", func() bool { return len(physical()) == 3 })
	for _, b := range physical() {
		if b.Name != first && b.Name != failed {
			complete(b.Name, "15")
		}
	}
	// A major upgrade: the archive of 17 has none, so one at once.
	// A merge patch, not an update: the controller writes status meanwhile.
	if err := c.Patch(ctx, &v1alpha1.Postgres{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "db"}}, client.RawPatch(types.MergePatchType, []byte(`{"spec":{"version":"17"}}`))); err != nil {
		t.Fatal(err)
	}
	eventually("a base backup of the new major at once", func() bool { return len(physical()) == 4 })
	eventually("status names no base backup of PostgreSQL 17 (the newest is of 15)", func() bool {
		got := &v1alpha1.Postgres{}
		return c.Get(ctx, key, got) == nil && got.Status.Backup != nil && got.Status.Backup.LastBaseBackup == "" && got.Spec.Version == "17"
	})
}
