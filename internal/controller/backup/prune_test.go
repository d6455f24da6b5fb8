package backup_test

import (
	"context"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/chartpilot/chartpilot/internal/agentargs"
	"github.com/chartpilot/chartpilot/internal/api/v1alpha1"
	"github.com/chartpilot/chartpilot/internal/backup/backuptest"
	"github.com/chartpilot/chartpilot/internal/controller/backup"
	"github.com/chartpilot/chartpilot/internal/testing/testpg"
	"github.com/chartpilot/chartpilot/internal/testing/testwait"
)

// TestArchivePrunedToItsWindow: with walArchive.recoveryWindow, the
// schedule starts a Job of the agent's wal-prune against the archive's
// store and prefix; run against a real S3 server holding a real base
// backup, its report becomes status.backup.archive (what the archive can
// recover to: from the base backup's end, one base backup) and the
// result says what was pruned; the next is a day later.
func TestArchivePrunedToItsWindow(t *testing.T) {
	cluster.Skip(t)
	agent := buildAgent(t)
	s3 := backuptest.StartS3(t, t.TempDir())
	pg := testpg.Start(t)
	ns := cluster.Namespace(t)
	clk := &clock{t: time.Now()}
	ctx, c := startControllers(t, func(mgr ctrl.Manager) []controller {
		stores := &backup.StoreReconciler{Deps: backup.Deps{Client: mgr.GetClient(), Reader: mgr.GetAPIReader(), Recorder: mgr.GetEventRecorderFor("test"), Stores: storeHelper(t),
			Endpoints: []string{"http://127.0.0.1:*"}, SkipNameValidation: true}}
		schedules := &backup.ScheduleReconciler{Deps: backup.Deps{Client: mgr.GetClient(), Reader: mgr.GetAPIReader(), Recorder: mgr.GetEventRecorderFor("test"),
			Image: "chartpilot:test", SkipNameValidation: true, Now: clk.now}}
		return []controller{stores, schedules}
	})
	if err := cluster.Cordon(ctx, true); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cluster.Cordon(context.Background(), false) })
	for _, o := range []client.Object{
		&corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "s3"}, Data: map[string][]byte{"accessKeyID": []byte(s3.AccessKeyID), "secretAccessKey": []byte(s3.SecretAccessKey)}},
		&v1alpha1.BackupStore{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "s3"}, Spec: v1alpha1.BackupStoreSpec{S3: &v1alpha1.S3Store{
			Endpoint: s3.Endpoint, Bucket: s3.Bucket, Prefix: "team", ForcePathStyle: true, CredentialsSecretRef: v1alpha1.SecretRef{Name: "s3"}}}},
	} {
		if err := c.Create(ctx, o); err != nil {
			t.Fatal(err)
		}
	}
	// A base backup in the archive, as the agent takes one.
	prefix := ns + "/db/pg15"
	store := agentargs.Store{Kind: agentargs.S3, S3Endpoint: s3.Endpoint, S3Bucket: s3.Bucket, S3Prefix: "team", S3Region: agentargs.DefaultS3Region, S3ForcePathStyle: true}
	cmd := exec.CommandContext(ctx, agent, agentargs.WAL{Command: agentargs.BaseBackup, Store: store, Prefix: prefix}.Line()...)
	cmd.Env = append(os.Environ(), "PATH="+testpg.Bin(t)+":"+os.Getenv("PATH"), "PGHOST=127.0.0.1", "PGPORT="+strconv.Itoa(pg.Port), "PGUSER=postgres",
		agentargs.EnvS3AccessKeyID+"="+s3.AccessKeyID, agentargs.EnvS3SecretAccessKey+"="+s3.SecretAccessKey)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("base-backup: %v\n%s", err, out)
	}

	db := &v1alpha1.Postgres{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "db"}, Spec: v1alpha1.PostgresSpec{Version: "15", Storage: v1alpha1.PostgresStorage{Size: "1Gi"},
		Backup: &v1alpha1.PostgresBackup{Store: v1alpha1.StoreRef{Name: "s3"}, Schedule: "0 3 29 2 *", WALArchive: &v1alpha1.PostgresWALArchive{RecoveryWindow: "7d"}}}}
	if err := c.Create(ctx, db); err != nil {
		t.Fatal(err)
	}
	key := client.ObjectKeyFromObject(db)
	status := func() *v1alpha1.PostgresBackupStatus {
		got := &v1alpha1.Postgres{}
		if c.Get(ctx, key, got) != nil || got.Status.Backup == nil {
			return &v1alpha1.PostgresBackupStatus{}
		}
		return got.Status.Backup
	}
	if !testwait.Until(2*time.Minute, 200*time.Millisecond, func() bool { return status().PruneJob != "" }) {
		t.Fatalf("no prune Job started: %+v", status())
	}
	job := &batchv1.Job{}
	if err := c.Get(ctx, client.ObjectKey{Namespace: ns, Name: status().PruneJob}, job); err != nil {
		t.Fatal(err)
	}
	args := job.Spec.Template.Spec.Containers[0].Args
	if args[0] != agentargs.WALPrune || !strings.Contains(strings.Join(args, " "), "--prefix "+prefix+" --recovery-window 7d") {
		t.Fatalf("the prune Job runs %q, want wal-prune of %s to 7d", args, prefix)
	}
	// Its command is the image's chartpilot: the test's agent here.
	finishPod(t, ctx, c, job, runJobWith(t, ctx, c, job, agent, "", 0, nil))
	var st *v1alpha1.PostgresBackupStatus
	if !testwait.Until(2*time.Minute, 200*time.Millisecond, func() bool {
		st = status()
		return st.PruneJob == "" && st.Archive != nil
	}) {
		t.Fatalf("the prune's report never reached status: %+v", status())
	}
	if a := st.Archive; a.BaseBackups != 1 || a.FirstRecoverableTime == nil || a.CheckedAt == nil || !strings.HasPrefix(st.LastPruneResult, "Succeeded: 0 base backups") {
		t.Errorf("status.backup.archive %+v, result %q: want one base backup, recoverable from its end, nothing pruned", a, st.LastPruneResult)
	}
	// The next prune is a day later, not sooner.
	clk.add(time.Hour)
	if err := c.Patch(ctx, &v1alpha1.Postgres{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "db"}}, client.RawPatch("application/merge-patch+json", []byte(`{"metadata":{"annotations":{"test/poke":"1"}}}`))); err != nil {
		t.Fatal(err)
	}
	if !testwait.Holds(3*time.Second, 200*time.Millisecond, func() bool { return status().PruneJob == "" }) {
		t.Errorf("a second prune an hour after the first: %+v", status())
	}
}
