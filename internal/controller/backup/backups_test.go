package backup_test

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"filippo.io/age"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/chartpilot/chartpilot/internal/api/v1alpha1"
	"github.com/chartpilot/chartpilot/internal/backup/backuptest"
	"github.com/chartpilot/chartpilot/internal/controller/backup"
	"github.com/chartpilot/chartpilot/internal/hooks"
	"github.com/chartpilot/chartpilot/internal/testing/testpg"
	"github.com/chartpilot/chartpilot/internal/testing/testwait"
)

// buildAgent builds the chartpilot command the backup Jobs run.
func buildAgent(t *testing.T) string { return backup.BuildAgent(t) }

// runJob plays the kubelet for a backup Job whose pod the (cordoned)
// cluster cannot start: it runs the pod's command, the real agent, with
// the environment the Job names (Secrets resolved), reaching the database
// at host:port as the Service's name would.
func runJob(t *testing.T, ctx context.Context, c client.Client, job *batchv1.Job, agent, pgHost string, pgPort int) string {
	return runJobWith(t, ctx, c, job, agent, pgHost, pgPort, nil)
}

// runJobWith is runJob with the command's arguments rewritten after the
// kubelet's $(VAR) expansion (a Service name and port to loopback's).
func runJobWith(t *testing.T, ctx context.Context, c client.Client, job *batchv1.Job, agent, pgHost string, pgPort int, rewrite func([]string) []string) string {
	t.Helper()
	ctr := job.Spec.Template.Spec.Containers[0]
	env := []string{"PATH=" + testpg.Bin(t) + ":" + os.Getenv("PATH")}
	vars := jobEnv(t, ctx, c, job)
	vars["PGHOST"], vars["PGPORT"] = pgHost, strconv.Itoa(pgPort)
	// A drill starts a server of its own, which refuses root: the pod's
	// user is the test servers' one.
	var cred *syscall.Credential
	tmp := t.TempDir
	if slices.Contains(ctr.Args, "--scratch") && os.Geteuid() == 0 {
		r := testpg.NewRunner(t, testpg.Bin(t))
		cred = &syscall.Credential{Uid: uint32(r.UID), Gid: uint32(r.GID)}
		tmp = func() string { return r.TempDir(t) }
		copied := filepath.Join(tmp(), "chartpilot")
		b, err := os.ReadFile(agent)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(copied, b, 0o755); err != nil {
			t.Fatal(err)
		}
		agent = copied
	}
	if _, ok := vars["CHARTPILOT_STAGE_DIR"]; ok {
		vars["CHARTPILOT_STAGE_DIR"] = tmp() // the Job's emptyDir
	}
	for k, v := range vars {
		env = append(env, k+"="+v)
	}
	termination := filepath.Join(tmp(), "termination-log")
	args := append([]string{}, ctr.Command[1:]...)
	for _, a := range ctr.Args {
		// The kubelet expands $(VAR) of the container's environment.
		for _, e := range ctr.Env {
			if e.ValueFrom == nil {
				a = strings.ReplaceAll(a, "$("+e.Name+")", e.Value)
			}
		}
		args = append(args, strings.Replace(a, "/dev/termination-log", termination, 1))
	}
	if rewrite != nil {
		args = rewrite(args)
	}
	cmd := exec.CommandContext(ctx, agent, args...)
	cmd.Env = env
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: cred}
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("the Job's command %v: %v\n%s", ctr.Args, err, stderr.String())
	}
	msg, err := os.ReadFile(termination)
	if err != nil {
		t.Fatalf("the agent wrote no termination message: %v", err)
	}
	return string(msg)
}

// jobEnv is the environment of job's container as the kubelet gives it:
// values, and Secret references resolved.
func jobEnv(t *testing.T, ctx context.Context, c client.Client, job *batchv1.Job) map[string]string {
	t.Helper()
	out := map[string]string{}
	for _, e := range job.Spec.Template.Spec.Containers[0].Env {
		v := e.Value
		if ref := e.ValueFrom; ref != nil && ref.SecretKeyRef != nil {
			s := &corev1.Secret{}
			if err := c.Get(ctx, client.ObjectKey{Namespace: job.Namespace, Name: ref.SecretKeyRef.Name}, s); err != nil {
				t.Fatalf("env %s: %v", e.Name, err)
			}
			v = string(s.Data[ref.SecretKeyRef.Key])
		}
		out[e.Name] = v
	}
	return out
}

// waitBackup waits (3 minutes at most) for Backup ns/name to be in phase
// with message containing msg, and returns it.
func waitBackup(t *testing.T, ctx context.Context, c client.Client, ns, name, phase, msg string) *v1alpha1.Backup {
	t.Helper()
	b := &v1alpha1.Backup{}
	if testwait.Until(3*time.Minute, 200*time.Millisecond, func() bool {
		err := c.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, b)
		return err == nil && b.Status.Phase == phase && strings.Contains(b.Status.Message, msg)
	}) {
		return b
	}
	t.Fatalf("Backup %s never %s with %q; last status %+v", name, phase, msg, b.Status)
	return nil
}

// finishPod plays the kubelet at the end of job's pod (which the cordoned
// cluster never started): Succeeded, with the agent's termination message.
func finishPod(t *testing.T, ctx context.Context, c client.Client, job *batchv1.Job, message string) {
	t.Helper()
	endPod(t, ctx, c, job, message, 0)
}

// endPod ends job's pod with the container's exit code and termination
// message: Succeeded for 0, Failed otherwise.
func endPod(t *testing.T, ctx context.Context, c client.Client, job *batchv1.Job, message string, exitCode int32) {
	t.Helper()
	pods := &corev1.PodList{}
	var listErr error
	if !testwait.Until(2*time.Minute, 200*time.Millisecond, func() bool {
		listErr = c.List(ctx, pods, client.InNamespace(job.Namespace), client.MatchingLabels{"batch.kubernetes.io/job-name": job.Name})
		return listErr != nil || len(pods.Items) > 0
	}) {
		t.Fatalf("Job %s made no pod", job.Name)
	}
	if listErr != nil {
		t.Fatal(listErr)
	}
	p := &pods.Items[0]
	now := metav1.Now()
	reason := "Completed"
	p.Status.Phase = corev1.PodSucceeded
	if exitCode != 0 {
		p.Status.Phase, reason = corev1.PodFailed, "Error"
	}
	p.Status.ContainerStatuses = []corev1.ContainerStatus{{Name: job.Spec.Template.Spec.Containers[0].Name, Image: job.Spec.Template.Spec.Containers[0].Image,
		State: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: exitCode, Reason: reason, Message: message, StartedAt: now, FinishedAt: now}}}}
	if err := c.Status().Update(ctx, p); err != nil {
		t.Fatalf("finishing pod %s: %v", p.Name, err)
	}
}

// serverTakesNoTLS reports pg's StatefulSet as seen without a certificate
// (the test's servers take no TLS), so its Jobs need no CA to connect.
func serverTakesNoTLS(t *testing.T, ctx context.Context, c client.Client, pg *v1alpha1.Postgres) {
	t.Helper()
	patch := []byte(`{"status":{"endpoints":{"tls":false}}}`)
	if err := c.Status().Patch(ctx, pg, client.RawPatch(types.MergePatchType, patch)); err != nil {
		t.Fatal(err)
	}
}

func toUnstructured(t *testing.T, o *v1alpha1.Postgres) *unstructured.Unstructured {
	t.Helper()
	m, err := runtime.DefaultUnstructuredConverter.ToUnstructured(o)
	if err != nil {
		t.Fatal(err)
	}
	u := &unstructured.Unstructured{Object: m}
	u.SetKind("Postgres")
	return u
}

// TestBackupRunsAsJob: a Backup of a Postgres becomes a Job whose pod has
// no API token and gets its credentials only from Secrets; the Job's own
// command (the real agent, pg_dump of a real server, a real S3 server)
// stores the backup and the Backup completes with the size and checksum
// read back from the store, which a restore of the stored data matches. A
// new Postgres with spec.restore naming the Backup is filled from it by
// its restore Job's own command against a second real server (every row
// matches, the checksum is the Backup's, Restored turns True); an hourly
// restore drill (test clock) restores it into a throwaway database of the
// first server by its Job's command and records it. A
// second Backup of the same target waits for the first; a Job that
// "succeeds" without storing anything fails its Backup; a store not
// offered to the namespace is named in the Backup's status; the spec
// cannot change; no secret reaches a status or an event.
func TestBackupRunsAsJob(t *testing.T) {
	cluster.Skip(t)
	agent := buildAgent(t)
	s3 := backuptest.StartS3(t, t.TempDir())
	pg := testpg.Start(t)
	pg.Query(t, "postgres", "create table items (id int primary key, name text); insert into items select i, 'item ' || i from generate_series(1, 3000) i")
	ns := cluster.Namespace(t)
	clk := &clock{t: time.Now()}
	ctx, c := startControllers(t, func(mgr ctrl.Manager) []controller {
		stores := &backup.StoreReconciler{Deps: backup.Deps{Client: mgr.GetClient(), Reader: mgr.GetAPIReader(), Recorder: mgr.GetEventRecorderFor("test"), Stores: storeHelper(t),
			Endpoints: []string{"http://127.0.0.1:*"}, SkipNameValidation: true}}
		backups := &backup.BackupReconciler{Deps: backup.Deps{Client: mgr.GetClient(), Reader: mgr.GetAPIReader(), Recorder: mgr.GetEventRecorderFor("test"), Stores: storeHelper(t),
			Endpoints: []string{"http://127.0.0.1:*"}, Image: "chartpilot:test", SkipNameValidation: true}}
		restores := &backup.RestoreReconciler{Deps: backup.Deps{Client: mgr.GetClient(), Reader: mgr.GetAPIReader(), Recorder: mgr.GetEventRecorderFor("test"),
			Image: "chartpilot:test", SkipNameValidation: true}}
		schedules := &backup.ScheduleReconciler{Deps: backup.Deps{Client: mgr.GetClient(), Reader: mgr.GetAPIReader(), Recorder: mgr.GetEventRecorderFor("test"),
			Image: "chartpilot:test", SkipNameValidation: true, Now: clk.now}}
		return []controller{stores, backups, restores, schedules}
	})
	mustCreate := func(o client.Object) {
		t.Helper()
		if err := c.Create(ctx, o); err != nil {
			t.Fatalf("creating %s: %v", o.GetName(), err)
		}
	}
	// The cluster's simulated pods would "complete" the Jobs at once:
	// until the agent has run here, nothing is scheduled.
	if err := cluster.Cordon(ctx, true); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cluster.Cordon(context.Background(), false) })

	mustCreate(&corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "s3"}, Data: map[string][]byte{"accessKeyID": []byte(s3.AccessKeyID), "secretAccessKey": []byte(s3.SecretAccessKey)}})
	mustCreate(&corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "db-auth"}, Data: map[string][]byte{"username": []byte("postgres"), "password": []byte("db-password-never-shown")}})
	mustCreate(&v1alpha1.BackupStore{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "s3"}, Spec: v1alpha1.BackupStoreSpec{S3: &v1alpha1.S3Store{
		Endpoint: s3.Endpoint, Bucket: s3.Bucket, Prefix: "backups", ForcePathStyle: true, CredentialsSecretRef: v1alpha1.SecretRef{Name: "s3"}}}})
	key, err := age.GenerateX25519Identity()
	if err != nil {
		t.Fatal(err)
	}
	mustCreate(&corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "backup-key"}, Data: map[string][]byte{"age": []byte(key.String())}})
	// Encrypted for the key of spec.backup.encryption, also on demand.
	db := &v1alpha1.Postgres{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "db"}, Spec: v1alpha1.PostgresSpec{Version: "15", Storage: v1alpha1.PostgresStorage{Size: "1Gi"},
		// Scheduled backups on February 29th only; a restore drill hourly.
		Backup: &v1alpha1.PostgresBackup{Store: v1alpha1.StoreRef{Name: "s3"}, Schedule: "0 3 29 2 *", Verify: "@hourly",
			Encryption: &v1alpha1.BackupEncryption{KeySecretRef: v1alpha1.LocalSecretKeyRef{Name: "backup-key", Key: "age"}}}}}
	mustCreate(db)

	newBackup := func(name, store, storeKind string) *v1alpha1.Backup {
		b := &v1alpha1.Backup{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}, Spec: v1alpha1.BackupSpec{
			Target: v1alpha1.BackupTarget{Kind: "Postgres", Name: "db"}, Store: v1alpha1.StoreRef{Kind: storeKind, Name: store}}}
		mustCreate(b)
		return b
	}
	wait := func(name, phase, message string) *v1alpha1.Backup {
		t.Helper()
		return waitBackup(t, ctx, c, ns, name, phase, message)
	}

	first := newBackup("first", "s3", "")
	wait("first", v1alpha1.BackupPending, "Postgres db is not Ready")
	// What the release reconciler reports for a Ready Postgres.
	if err := c.Get(ctx, client.ObjectKeyFromObject(db), db); err != nil {
		t.Fatal(err)
	}
	dbBase := db.DeepCopy()
	db.Status.Conditions = []metav1.Condition{
		{Type: v1alpha1.ConditionReady, Status: metav1.ConditionTrue, Reason: "InstallSucceeded", Message: "ok", LastTransitionTime: metav1.Now()},
		{Type: v1alpha1.ConditionReleased, Status: metav1.ConditionTrue, Reason: "InstallSucceeded", Message: "ok", LastTransitionTime: metav1.Now()},
	}
	db.Status.Endpoints = &v1alpha1.PostgresEndpoints{ReadWrite: "db", ReadOnly: "db-ro", Secret: "db-auth"}
	db.Status.Release = &v1alpha1.ReleaseInfo{Name: "db", ChartVersion: "1.4.0"}
	// A merge patch: the schedule writes this status too.
	if err := c.Status().Patch(ctx, db, client.MergeFrom(dbBase)); err != nil {
		t.Fatal(err)
	}
	// Ready, but with no CA reported for a server that takes TLS (the
	// chart's default): no Job, so no password offered to an unproven
	// server.
	wait("first", v1alpha1.BackupPending, "status.endpoints.caSecret")
	if jobs := (&batchv1.JobList{}); c.List(ctx, jobs, client.InNamespace(ns)) != nil || len(jobs.Items) != 0 {
		t.Fatalf("a Job was made before the server's CA was known: %d", len(jobs.Items))
	}
	// The test's server takes no TLS: its status says so.
	serverTakesNoTLS(t, ctx, c, db)
	got := wait("first", v1alpha1.BackupRunning, "")
	if got.Status.ChartVersion != "1.4.0" || got.Status.DatabaseVersion != "15" || !strings.HasPrefix(got.Status.Location, ns+"/postgres/db/") {
		t.Errorf("running Backup's status: %+v", got.Status)
	}
	newBackup("second", "s3", "")
	wait("second", v1alpha1.BackupPending, "backup first of the same Postgres is running")

	job := &batchv1.Job{}
	if err := c.Get(ctx, client.ObjectKey{Namespace: ns, Name: got.Status.Job}, job); err != nil {
		t.Fatalf("the Backup's Job: %v", err)
	}
	pod := job.Spec.Template.Spec
	if pod.AutomountServiceAccountToken == nil || *pod.AutomountServiceAccountToken || *job.Spec.BackoffLimit != 0 || !metav1.IsControlledBy(job, got) {
		t.Errorf("Job %s: token mounted, retried, or not owned by its Backup", job.Name)
	}
	// The database's own image (its pg_dump is the server's major) runs the
	// agent that an init container of chartpilot's image copied in.
	if img := pod.Containers[0].Image; !strings.HasPrefix(img, "postgres:") || len(pod.InitContainers) != 1 || pod.InitContainers[0].Image != "chartpilot:test" ||
		pod.Containers[0].Command[0] != backup.AgentDir+"/chartpilot" {
		t.Errorf("Job %s runs %s %v after %+v; want postgres:<version> running the agent copied from chartpilot:test", job.Name, img, pod.Containers[0].Command, pod.InitContainers)
	}
	for _, e := range pod.Containers[0].Env {
		if (strings.Contains(e.Name, "PASSWORD") || strings.Contains(e.Name, "KEY")) && (e.Value != "" || e.ValueFrom == nil || e.ValueFrom.SecretKeyRef == nil) {
			t.Errorf("Job env %s is not a reference to a Secret", e.Name)
		}
	}
	msg := runJob(t, ctx, c, job, agent, "127.0.0.1", pg.Port)
	if err := cluster.Cordon(ctx, false); err != nil {
		t.Fatal(err)
	}
	done := wait("first", v1alpha1.BackupCompleted, "encrypted with age")
	var m struct {
		SHA256 string `json:"sha256"`
		Size   int64  `json:"size"`
	}
	if err := json.Unmarshal([]byte(msg), &m); err != nil || m.SHA256 != done.Status.SHA256 || m.Size != done.Status.Size || m.Size == 0 {
		t.Errorf("Backup status %+v does not match the manifest the agent wrote: %s", done.Status, msg)
	}

	// The second starts once the first is done; its pod "completes" here
	// without the agent having run, so the store has no backup for it.
	failed := wait("second", v1alpha1.BackupFailed, "the store has no complete backup at")
	if failed.Status.Location == done.Status.Location {
		t.Errorf("two Backups share location %s", failed.Status.Location)
	}

	// spec.restore: a new Postgres is filled from the first Backup by the
	// restore Job's own command, run here against a second real server.
	if err := cluster.Cordon(ctx, true); err != nil {
		t.Fatal(err)
	}
	pg2 := testpg.Start(t)
	copyDB := &v1alpha1.Postgres{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "copy"}, Spec: v1alpha1.PostgresSpec{Version: "15", Storage: v1alpha1.PostgresStorage{Size: "1Gi"},
		Restore: &v1alpha1.PostgresRestore{FromBackup: "first", Encryption: &v1alpha1.BackupEncryption{KeySecretRef: v1alpha1.LocalSecretKeyRef{Name: "backup-key", Key: "age"}}}}}
	mustCreate(copyDB)
	restoreIs := func(phase, message string) *v1alpha1.Postgres {
		t.Helper()
		got := &v1alpha1.Postgres{}
		if testwait.Until(3*time.Minute, 200*time.Millisecond, func() bool {
			err := c.Get(ctx, client.ObjectKeyFromObject(copyDB), got)
			return err == nil && got.Status.Restore != nil && got.Status.Restore.Phase == phase && strings.Contains(got.Status.Restore.Message, message)
		}) {
			return got
		}
		t.Fatalf("status.restore never %s with %q; last %+v", phase, message, got.Status.Restore)
		return nil
	}
	if c := backup.Hook(c, nil, nil, nil).Report(ctx, hooks.Object{Resource: toUnstructured(t, restoreIs(v1alpha1.BackupPending, "once the release is installed"))}); c == nil || c.Status != metav1.ConditionFalse || c.Reason != "Restoring" {
		t.Errorf("Restored while the restore waits: %+v, want False/Restoring (the resource is not Ready)", c)
	}
	if err := c.Get(ctx, client.ObjectKeyFromObject(copyDB), copyDB); err != nil {
		t.Fatal(err)
	}
	copyBase := copyDB.DeepCopy()
	copyDB.Status.Conditions = []metav1.Condition{{Type: v1alpha1.ConditionReleased, Status: metav1.ConditionTrue, Reason: "InstallSucceeded", Message: "ok", LastTransitionTime: metav1.Now()}}
	copyDB.Status.Endpoints = &v1alpha1.PostgresEndpoints{ReadWrite: "copy", ReadOnly: "copy-ro", Secret: "db-auth"}
	if err := c.Status().Patch(ctx, copyDB, client.MergeFrom(copyBase)); err != nil {
		t.Fatal(err)
	}
	restoreIs(v1alpha1.BackupPending, "status.endpoints.caSecret")
	serverTakesNoTLS(t, ctx, c, copyDB)
	running := restoreIs(v1alpha1.BackupRunning, "restores "+done.Status.Location)
	restoreJob := &batchv1.Job{}
	if err := c.Get(ctx, client.ObjectKey{Namespace: ns, Name: running.Status.Restore.Job}, restoreJob); err != nil {
		t.Fatal(err)
	}
	finishPod(t, ctx, c, restoreJob, runJob(t, ctx, c, restoreJob, agent, "127.0.0.1", pg2.Port))
	restored := restoreIs(v1alpha1.BackupCompleted, "checked before pg_restore")
	sum := "select count(*) || ' ' || md5(string_agg(name, ',' order by id)) from items"
	if a, b := pg2.Query(t, "postgres", sum), pg.Query(t, "postgres", sum); a != b {
		t.Errorf("restored %q, backed up %q", a, b)
	}
	if restored.Status.Restore.SHA256 != done.Status.SHA256 || restored.Annotations[v1alpha1.AnnotationReconcileRequestedAt] == "" {
		t.Errorf("restore status %+v (want sha256 %s) and a reconcile request %q", restored.Status.Restore, done.Status.SHA256, restored.Annotations[v1alpha1.AnnotationReconcileRequestedAt])
	}
	if c := backup.Hook(c, nil, nil, nil).Report(ctx, hooks.Object{Resource: toUnstructured(t, restored)}); c == nil || c.Status != metav1.ConditionTrue {
		t.Errorf("Restored after the restore: %+v, want True", c)
	}

	// The hourly restore drill of db: the newest completed backup restored
	// into a throwaway database of its server, by the drill Job's command.
	clk.add(61 * time.Minute)
	if err := c.Patch(ctx, &v1alpha1.Postgres{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "db"}}, client.RawPatch(types.MergePatchType, []byte(`{"metadata":{"annotations":{"test/poke":"drill"}}}`))); err != nil {
		t.Fatal(err)
	}
	drillStatus := func(want string) *v1alpha1.PostgresBackupStatus {
		t.Helper()
		got := &v1alpha1.Postgres{}
		if testwait.Until(3*time.Minute, 200*time.Millisecond, func() bool {
			err := c.Get(ctx, client.ObjectKeyFromObject(db), got)
			return err == nil && got.Status.Backup != nil && strings.Contains(got.Status.Backup.LastVerifyResult, want)
		}) {
			return got.Status.Backup
		}
		t.Fatalf("status.backup never says %q; last %+v", want, got.Status.Backup)
		return nil
	}
	drill := drillStatus("Running: Job verify-db-")
	drillJob := &batchv1.Job{}
	if err := c.Get(ctx, client.ObjectKey{Namespace: ns, Name: drill.VerifyJob}, drillJob); err != nil {
		t.Fatal(err)
	}
	finishPod(t, ctx, c, drillJob, runJob(t, ctx, c, drillJob, agent, "127.0.0.1", pg.Port))
	verified := drillStatus("Succeeded: Backup first")
	if verified.LastVerifiedBackup != "first" || !strings.Contains(verified.LastVerifyResult, "with 1 tables") {
		t.Errorf("drill status %+v", verified)
	}
	if left := pg.Query(t, "postgres", "select count(*) from pg_database where datname like 'chartpilot_verify_%'"); left != "0" {
		t.Errorf("%s throwaway databases left after the drill", left)
	}
	if err := cluster.Cordon(ctx, false); err != nil {
		t.Fatal(err)
	}

	// A ClusterBackupStore that does not select the namespace.
	cs := &v1alpha1.ClusterBackupStore{ObjectMeta: metav1.ObjectMeta{Name: ns + "-shared"}, Spec: v1alpha1.ClusterBackupStoreSpec{
		Volume: &v1alpha1.VolumeStore{ClaimName: "backups"}, NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"backups": "shared"}}}}
	mustCreate(cs)
	t.Cleanup(func() { _ = c.Delete(context.Background(), cs) })
	newBackup("unoffered", cs.Name, "ClusterBackupStore")
	wait("unoffered", v1alpha1.BackupPending, "does not serve namespace "+ns)

	if err := c.Get(ctx, client.ObjectKeyFromObject(first), first); err != nil {
		t.Fatal(err)
	}
	first.Spec.Target.Name = "other"
	if err := c.Update(ctx, first); err == nil || !strings.Contains(err.Error(), "cannot change") {
		t.Errorf("changing a Backup's spec: %v", err)
	}

	// Events are written asynchronously: wait until every kind expected is
	// there (3 minutes at most), then look at all of them.
	wantEvents := []string{"BackupStarted", "BackupCompleted", "BackupFailed", "BackupWaiting"}
	var all string
	testwait.Until(3*time.Minute, 200*time.Millisecond, func() bool {
		evs := &corev1.EventList{}
		if err := c.List(ctx, evs, client.InNamespace(ns)); err != nil {
			t.Fatal(err)
		}
		var seen []string
		for _, e := range evs.Items {
			seen = append(seen, e.Reason+": "+e.Message)
		}
		for _, name := range []string{"first", "second", "unoffered"} {
			b := &v1alpha1.Backup{}
			_ = c.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, b)
			st, _ := json.Marshal(b.Status)
			seen = append(seen, string(st))
		}
		all = strings.Join(seen, "\n")
		missing := false
		for _, want := range wantEvents {
			missing = missing || !strings.Contains(all, want+": ")
		}
		return !missing
	})
	for _, secret := range []string{s3.SecretAccessKey, "db-password-never-shown", key.String()} {
		if strings.Contains(all, secret) {
			t.Errorf("a secret reached a Backup's status or events")
		}
	}
	for _, want := range wantEvents {
		if !strings.Contains(all, want+": ") {
			t.Errorf("no %s event:\n%s", want, all)
		}
	}
}
