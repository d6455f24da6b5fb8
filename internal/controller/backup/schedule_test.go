package backup_test

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/retry"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/chartpilot/chartpilot/internal/api/v1alpha1"
	"github.com/chartpilot/chartpilot/internal/controller/backup"
	"github.com/chartpilot/chartpilot/internal/hooks"
	"github.com/chartpilot/chartpilot/internal/testing/testwait"
)

// clock is a test clock the schedule reads.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *clock) add(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

// TestScheduledBackups: an hourly schedule on a Postgres, driven by a test
// clock against the real API server. Five hours of downtime give one
// catch-up Backup, not five; no second Backup is made while one is
// unfinished; retention {count: 2} deletes the oldest completed Backup
// once a third completes; LastBackupSucceeded follows the newest finished
// Backup (completed, then failed); a bad schedule is named on the
// condition; removing spec.backup removes the condition and status.backup.
func TestScheduledBackups(t *testing.T) {
	cluster.Skip(t)
	ns := cluster.Namespace(t)
	clk := &clock{t: time.Now()}
	ctx, c := startControllers(t, func(mgr ctrl.Manager) []controller {
		r := &backup.ScheduleReconciler{Deps: backup.Deps{Client: mgr.GetClient(), Recorder: mgr.GetEventRecorderFor("test"), SkipNameValidation: true, Now: clk.now}}
		return []controller{r}
	})
	pg := &v1alpha1.Postgres{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "db"}, Spec: v1alpha1.PostgresSpec{
		Version: "15", Storage: v1alpha1.PostgresStorage{Size: "1Gi"},
		Backup: &v1alpha1.PostgresBackup{Store: v1alpha1.StoreRef{Name: "s3"}, Schedule: "0 * * * *", Retention: &v1alpha1.BackupRetention{Count: 2}},
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
	backups := func() []v1alpha1.Backup {
		t.Helper()
		l := &v1alpha1.BackupList{}
		if err := c.List(ctx, l, client.InNamespace(ns)); err != nil {
			t.Fatal(err)
		}
		sort.Slice(l.Items, func(i, j int) bool { return l.Items[i].Name < l.Items[j].Name })
		return l.Items
	}
	eventually := func(what string, ok func() bool) {
		t.Helper()
		if !testwait.Until(2*time.Minute, 200*time.Millisecond, ok) {
			t.Fatalf("never: %s; Backups %v", what, names(backups()))
		}
	}
	cond := func(status metav1.ConditionStatus, reason, msg string) {
		t.Helper()
		eventually(fmt.Sprintf("LastBackupSucceeded %s/%s with %q", status, reason, msg), func() bool {
			got := &v1alpha1.Postgres{}
			if err := c.Get(ctx, key, got); err != nil {
				return false
			}
			cd := apimeta.FindStatusCondition(got.Status.Conditions, v1alpha1.ConditionLastBackupSucceeded)
			return cd != nil && cd.Status == status && cd.Reason == reason && strings.Contains(cd.Message, msg) && got.Status.Backup != nil
		})
	}
	finish := func(name, phase string) {
		t.Helper()
		b := &v1alpha1.Backup{}
		if err := c.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, b); err != nil {
			t.Fatal(err)
		}
		now := metav1.NewTime(clk.now().Truncate(time.Second))
		b.Status = v1alpha1.BackupStatus{Phase: phase, CompletedAt: &now, Size: 42, Message: "the dump ended early"}
		if err := c.Status().Update(ctx, b); err != nil {
			t.Fatal(err)
		}
	}

	cond(metav1.ConditionUnknown, "NoBackupYet", "no backup")
	if n := len(backups()); n != 0 {
		t.Fatalf("%d Backups before the first schedule time", n)
	}

	// Five hours down: one Backup for the newest schedule time. The clock
	// moves to one minute past the fifth full hour after the Postgres was
	// made, so that five schedule times are missed whatever the minute the
	// test started at (five hours and a minute from 00:59 would cross six).
	clk.add(pg.CreationTimestamp.Truncate(time.Hour).Add(5*time.Hour + time.Minute).Sub(clk.now()))
	poke()
	eventually("one catch-up Backup", func() bool { return len(backups()) == 1 })
	first := backups()[0]
	if want := "db-" + clk.now().UTC().Truncate(time.Hour).Format("200601021504"); first.Name != want || first.Labels[v1alpha1.LabelScheduledBy] != "db" || !metav1.IsControlledBy(&first, pg) {
		t.Errorf("catch-up Backup %s (labels %v), want %s owned by the Postgres", first.Name, first.Labels, want)
	}
	// Another hour while it is unfinished: still one.
	clk.add(time.Hour)
	poke()
	n := 1
	if !testwait.Holds(2*time.Second, 200*time.Millisecond, func() bool { n = len(backups()); return n == 1 }) {
		t.Fatalf("%d Backups while the first is unfinished, want 1", n)
	}
	finish(first.Name, v1alpha1.BackupCompleted)
	cond(metav1.ConditionTrue, "BackupCompleted", first.Name)
	// Its completion lets the due one be made at once.
	eventually("the second Backup", func() bool { return len(backups()) == 2 })

	second := newest(backups())
	finish(second.Name, v1alpha1.BackupCompleted)
	clk.add(time.Hour)
	poke()
	eventually("the third Backup", func() bool { return len(backups()) == 3 })
	third := newest(backups())
	finish(third.Name, v1alpha1.BackupCompleted)
	eventually("retention keeping two", func() bool {
		got := names(backups())
		return len(got) == 2 && !strings.Contains(strings.Join(got, ","), first.Name)
	})

	clk.add(time.Hour)
	poke()
	eventually("the fourth Backup", func() bool { return len(backups()) == 3 })
	fourth := newest(backups())
	finish(fourth.Name, v1alpha1.BackupFailed)
	cond(metav1.ConditionFalse, "BackupFailed", fourth.Name+" failed: the dump ended early")
	got := &v1alpha1.Postgres{}
	if err := c.Get(ctx, key, got); err != nil {
		t.Fatal(err)
	}
	if st := got.Status.Backup; st.LastSuccessfulBackup != third.Name || st.NextScheduleTime == nil || st.LastScheduleTime == nil {
		t.Errorf("status.backup %+v: want lastSuccessfulBackup %s and both schedule times", st, third.Name)
	}

	// The controller writes the status meanwhile: each change is made on
	// a fresh read.
	change := func(f func(*v1alpha1.Postgres)) {
		t.Helper()
		if err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
			if err := c.Get(ctx, key, got); err != nil {
				return err
			}
			f(got)
			return c.Update(ctx, got)
		}); err != nil {
			t.Fatal(err)
		}
	}
	change(func(pg *v1alpha1.Postgres) { pg.Spec.Backup.Schedule = "61 * * * *" })
	cond(metav1.ConditionFalse, "InvalidSchedule", "spec.backup.schedule")

	change(func(pg *v1alpha1.Postgres) { pg.Spec.Backup = nil })
	eventually("status.backup and the condition gone", func() bool {
		g := &v1alpha1.Postgres{}
		return c.Get(ctx, key, g) == nil && g.Status.Backup == nil && apimeta.FindStatusCondition(g.Status.Conditions, v1alpha1.ConditionLastBackupSucceeded) == nil
	})

	// Events are written asynchronously: wait for it.
	eventually("a BackupScheduled event saying five schedule times were made up by one backup", func() bool {
		evs := &corev1.EventList{}
		if err := c.List(ctx, evs, client.InNamespace(ns)); err != nil {
			return false
		}
		for _, e := range evs.Items {
			if e.Reason == "BackupScheduled" && strings.Contains(e.Message, "one backup for 5 schedule times missed") {
				return true
			}
		}
		return false
	})
}

func names(bs []v1alpha1.Backup) []string {
	var out []string
	for _, b := range bs {
		out = append(out, b.Name+"="+b.Status.Phase)
	}
	return out
}

// newest is the Backup with the latest name (names sort by schedule time).
func newest(bs []v1alpha1.Backup) v1alpha1.Backup {
	return bs[len(bs)-1]
}

// TestBackupBeforeMajorUpgrade: the backup hook holds a PostgreSQL major
// upgrade of a Postgres with spec.backup until a Backup made for it has
// completed; a failed one holds it with its name until it is deleted,
// which makes a new one. No spec.backup, or no major change: nothing held.
func TestBackupBeforeMajorUpgrade(t *testing.T) {
	cluster.Skip(t)
	ns := cluster.Namespace(t)
	c := directClient(t)
	ctx := context.Background()
	pg := &v1alpha1.Postgres{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "db"}, Spec: v1alpha1.PostgresSpec{
		Version: "17", Storage: v1alpha1.PostgresStorage{Size: "1Gi"},
		Backup: &v1alpha1.PostgresBackup{Store: v1alpha1.StoreRef{Name: "s3"}, Schedule: "0 3 * * *"},
	}}
	if err := c.Create(ctx, pg); err != nil {
		t.Fatal(err)
	}
	pg.Status.Version = "16.4"
	if err := c.Status().Update(ctx, pg); err != nil {
		t.Fatal(err)
	}
	hook := backup.Hook(c, nil, nil, nil)
	pre := func(p *v1alpha1.Postgres) error {
		return hook.PreUpgrade.PreUpgrade(ctx, hooks.Object{Resource: toUnstructured(t, p)}, "0.2.0", "0.2.0")
	}
	expect := func(err error, reason, msg string) {
		t.Helper()
		rej, ok := hooks.AsRejection(err)
		if !ok || rej.Reason != reason || !strings.Contains(rej.Message, msg) {
			t.Fatalf("PreUpgrade: %v, want %s naming %q", err, reason, msg)
		}
	}
	expect(pre(pg), "BackupBeforeMajorUpgrade", "the PostgreSQL 16 → 17 upgrade waits for Backup db-before-major-17, started now")
	b := &v1alpha1.Backup{}
	key := client.ObjectKey{Namespace: ns, Name: "db-before-major-17"}
	if err := c.Get(ctx, key, b); err != nil {
		t.Fatalf("the Backup before the upgrade: %v", err)
	}
	if b.Spec.Target.Name != "db" || b.Spec.Store.Name != "s3" || b.Labels[v1alpha1.LabelBeforeMajor] != "17" {
		t.Errorf("Backup %+v %v", b.Spec, b.Labels)
	}
	expect(pre(pg), "BackupBeforeMajorUpgrade", "waits for Backup db-before-major-17 (Pending)")
	b.Status = v1alpha1.BackupStatus{Phase: v1alpha1.BackupFailed, Message: "Job backup-x failed: connection refused"}
	if err := c.Status().Update(ctx, b); err != nil {
		t.Fatal(err)
	}
	expect(pre(pg), "BackupFailed", "Backup db-before-major-17 failed (Job backup-x failed: connection refused)")
	if err := c.Delete(ctx, b); err != nil {
		t.Fatal(err)
	}
	testwait.Until(time.Minute, 100*time.Millisecond, func() bool { return c.Get(ctx, key, &v1alpha1.Backup{}) != nil })
	expect(pre(pg), "BackupBeforeMajorUpgrade", "started now")
	if err := c.Get(ctx, key, b); err != nil {
		t.Fatal(err)
	}
	b.Status = v1alpha1.BackupStatus{Phase: v1alpha1.BackupCompleted}
	if err := c.Status().Update(ctx, b); err != nil {
		t.Fatal(err)
	}
	if err := pre(pg); err != nil {
		t.Errorf("PreUpgrade after the Backup completed: %v", err)
	}
	minor := pg.DeepCopy()
	minor.Status.Version = "17.1"
	noBackup := pg.DeepCopy()
	noBackup.Spec.Backup = nil
	noBackup.Spec.Version = "18"
	for _, p := range []*v1alpha1.Postgres{minor, noBackup} {
		if err := pre(p); err != nil {
			t.Errorf("PreUpgrade of %s→%s (spec.backup %v): %v", p.Status.Version, p.Spec.Version, p.Spec.Backup != nil, err)
		}
	}
}
