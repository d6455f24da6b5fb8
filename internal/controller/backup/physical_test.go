package backup_test

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/chartpilot/chartpilot/internal/agentargs"
	"github.com/chartpilot/chartpilot/internal/api/v1alpha1"
	"github.com/chartpilot/chartpilot/internal/backup/backuptest"
	"github.com/chartpilot/chartpilot/internal/controller/backup"
	"github.com/chartpilot/chartpilot/internal/testing/testpg"
	"github.com/chartpilot/chartpilot/internal/testing/testwait"
)

// TestPhysicalBackupIntoTheArchive: a Backup with method physical of a
// Postgres with spec.backup.walArchive is a base backup (pg_basebackup,
// through the agent) into the archive's prefix of the archive's store,
// which the archive then counts as a base backup a recovery can start
// from. A physical Backup of a Postgres without an archive, or to another
// store, fails naming the field; a logical restore refuses it.
func TestPhysicalBackupIntoTheArchive(t *testing.T) {
	cluster.Skip(t)
	agent := buildAgent(t)
	s3 := backuptest.StartS3(t, t.TempDir())
	pg := testpg.Start(t)
	pg.Query(t, "postgres", "create table items (id int primary key); insert into items select generate_series(1, 1000)")
	ns := cluster.Namespace(t)
	ctx, c := startControllers(t, func(mgr ctrl.Manager) []controller {
		stores := &backup.StoreReconciler{Deps: backup.Deps{Client: mgr.GetClient(), Reader: mgr.GetAPIReader(), Recorder: mgr.GetEventRecorderFor("test"), Stores: storeHelper(t),
			Endpoints: []string{"http://127.0.0.1:*"}, SkipNameValidation: true}}
		backups := &backup.BackupReconciler{Deps: backup.Deps{Client: mgr.GetClient(), Reader: mgr.GetAPIReader(), Recorder: mgr.GetEventRecorderFor("test"), Stores: storeHelper(t),
			Endpoints: []string{"http://127.0.0.1:*"}, Image: "chartpilot:test", SkipNameValidation: true}}
		restores := &backup.RestoreReconciler{Deps: backup.Deps{Client: mgr.GetClient(), Reader: mgr.GetAPIReader(), Recorder: mgr.GetEventRecorderFor("test"),
			Image: "chartpilot:test", SkipNameValidation: true}}
		return []controller{stores, backups, restores}
	})
	if err := cluster.Cordon(ctx, true); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cluster.Cordon(context.Background(), false) })
	mustCreate := func(o client.Object) {
		t.Helper()
		if err := c.Create(ctx, o); err != nil {
			t.Fatalf("creating %s: %v", o.GetName(), err)
		}
	}
	mustCreate(&corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "s3"}, Data: map[string][]byte{"accessKeyID": []byte(s3.AccessKeyID), "secretAccessKey": []byte(s3.SecretAccessKey)}})
	mustCreate(&corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "db-auth"}, Data: map[string][]byte{"username": []byte("postgres"), "password": []byte("unused")}})
	for _, name := range []string{"s3", "other"} {
		mustCreate(&v1alpha1.BackupStore{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}, Spec: v1alpha1.BackupStoreSpec{S3: &v1alpha1.S3Store{
			Endpoint: s3.Endpoint, Bucket: s3.Bucket, Prefix: "team-" + name, ForcePathStyle: true, CredentialsSecretRef: v1alpha1.SecretRef{Name: "s3"}}}})
	}
	noTLS := false // the test's server takes none
	ready := func(name string, sb *v1alpha1.PostgresBackup) *v1alpha1.Postgres {
		p := &v1alpha1.Postgres{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}, Spec: v1alpha1.PostgresSpec{Version: "15", Storage: v1alpha1.PostgresStorage{Size: "1Gi"},
			Backup: sb}}
		mustCreate(p)
		p.Status.Conditions = []metav1.Condition{
			{Type: v1alpha1.ConditionReady, Status: metav1.ConditionTrue, Reason: "InstallSucceeded", Message: "ok", LastTransitionTime: metav1.Now()},
			{Type: v1alpha1.ConditionReleased, Status: metav1.ConditionTrue, Reason: "InstallSucceeded", Message: "ok", LastTransitionTime: metav1.Now()}}
		p.Status.Endpoints = &v1alpha1.PostgresEndpoints{ReadWrite: name, ReadOnly: name + "-ro", Secret: "db-auth", TLS: &noTLS}
		if err := c.Status().Update(ctx, p); err != nil {
			t.Fatal(err)
		}
		return p
	}
	ready("db", &v1alpha1.PostgresBackup{Store: v1alpha1.StoreRef{Name: "s3"}, Schedule: "0 3 29 2 *", WALArchive: &v1alpha1.PostgresWALArchive{}})
	ready("plain", &v1alpha1.PostgresBackup{Store: v1alpha1.StoreRef{Name: "s3"}, Schedule: "0 3 29 2 *"})
	physical := func(name, target, store string) {
		mustCreate(&v1alpha1.Backup{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}, Spec: v1alpha1.BackupSpec{
			Target: v1alpha1.BackupTarget{Kind: "Postgres", Name: target}, Store: v1alpha1.StoreRef{Name: store}, Method: v1alpha1.BackupPhysical}})
	}

	physical("no-archive", "plain", "s3")
	waitBackup(t, ctx, c, ns, "no-archive", v1alpha1.BackupFailed, "spec.backup.walArchive")
	physical("elsewhere", "db", "other")
	waitBackup(t, ctx, c, ns, "elsewhere", v1alpha1.BackupFailed, "spec.store: a physical backup goes to the store of the WAL archive, BackupStore s3")

	physical("base", "db", "s3")
	running := waitBackup(t, ctx, c, ns, "base", v1alpha1.BackupRunning, "")
	prefix := ns + "/db/pg15"
	if !strings.HasPrefix(running.Status.Location, prefix+"/base/") {
		t.Fatalf("location %q, want one below %s/base/ (the archive's prefix)", running.Status.Location, prefix)
	}
	job := &batchv1.Job{}
	if err := c.Get(ctx, client.ObjectKey{Namespace: ns, Name: running.Status.Job}, job); err != nil {
		t.Fatal(err)
	}
	if args := job.Spec.Template.Spec.Containers[0].Args; len(args) == 0 || args[0] != agentargs.BaseBackup {
		t.Fatalf("the Job runs %q, want the agent's base-backup", args)
	}
	finishPod(t, ctx, c, job, runJob(t, ctx, c, job, agent, "127.0.0.1", pg.Port))
	done := waitBackup(t, ctx, c, ns, "base", v1alpha1.BackupCompleted, "")
	if done.Status.SHA256 == "" || done.Status.Size == 0 {
		t.Errorf("a completed base backup with no checksum or size: %+v", done.Status)
	}

	// The archive counts it: a recovery can start from it.
	w := agentargs.WAL{Command: agentargs.WALStatus, Store: agentargs.Store{Kind: agentargs.S3, S3Endpoint: s3.Endpoint, S3Bucket: s3.Bucket, S3Prefix: "team-s3",
		S3Region: agentargs.DefaultS3Region, S3ForcePathStyle: true}, Prefix: prefix}
	cmd := exec.CommandContext(ctx, agent, w.Line()...)
	cmd.Env = append(os.Environ(), agentargs.EnvS3AccessKeyID+"="+s3.AccessKeyID, agentargs.EnvS3SecretAccessKey+"="+s3.SecretAccessKey)
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("wal-status: %v", err)
	}
	var window struct {
		Bases int
		First time.Time
	}
	if err := json.Unmarshal(out, &window); err != nil || window.Bases != 1 || window.First.IsZero() {
		t.Errorf("the archive's window %s (%v): want one base backup, recoverable from its end", out, err)
	}

	// A logical restore refuses a base backup.
	ready("copy", nil)
	if err := c.Patch(ctx, &v1alpha1.Postgres{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "copy"}},
		client.RawPatch(types.MergePatchType, []byte(`{"spec":{"restore":{"fromBackup":"base"}}}`))); err != nil {
		t.Fatal(err)
	}
	got := &v1alpha1.Postgres{}
	if !testwait.Until(2*time.Minute, 200*time.Millisecond, func() bool {
		return c.Get(ctx, client.ObjectKey{Namespace: ns, Name: "copy"}, got) == nil && got.Status.Restore != nil &&
			got.Status.Restore.Phase == v1alpha1.BackupFailed && strings.Contains(got.Status.Restore.Message, "physical base backup")
	}) {
		t.Fatalf("a restore from a base backup: %+v, want Failed naming the physical base backup", got.Status.Restore)
	}
}
