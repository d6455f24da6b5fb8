package backup_test

import (
	"context"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	authorizationv1 "k8s.io/api/authorization/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/chartpilot/chartpilot/internal/api/v1alpha1"
	"github.com/chartpilot/chartpilot/internal/backup/backuptest"
	"github.com/chartpilot/chartpilot/internal/controller/backup"
	"github.com/chartpilot/chartpilot/internal/hooks"
	"github.com/chartpilot/chartpilot/internal/testing/testpg"
	"github.com/chartpilot/chartpilot/internal/testing/testwait"
	"github.com/chartpilot/chartpilot/internal/watches"
)

// startRedis runs a real redis-server (Debian's, installed by .ci/run) on
// a loopback port with a password, stopped when the test ends.
func startRedis(t *testing.T, dir, password string, extra ...string) int {
	t.Helper()
	if _, err := exec.LookPath("redis-server"); err != nil {
		t.Fatal("redis-server is not installed: .ci/run installs Debian's redis-server")
	}
	port := testpg.FreePort(t)
	args := append([]string{"--port", strconv.Itoa(port), "--bind", "127.0.0.1", "--dir", dir, "--save", "", "--requirepass", password}, extra...)
	cmd := exec.Command("redis-server", args...)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	if !testwait.Until(30*time.Second, 100*time.Millisecond, func() bool {
		return exec.Command("redis-cli", "-p", strconv.Itoa(port), "-a", password, "--no-auth-warning", "ping").Run() == nil
	}) {
		t.Fatal("redis-server did not answer within 30 s")
	}
	return port
}

func redisCLI(t *testing.T, port int, password string, args ...string) string {
	t.Helper()
	out, err := exec.Command("redis-cli", append([]string{"-p", strconv.Itoa(port), "-a", password, "--no-auth-warning"}, args...)...).CombinedOutput()
	if err != nil {
		t.Fatalf("redis-cli %v: %v\n%s", args, err, out)
	}
	return strings.TrimSpace(string(out))
}

// TestPassthroughBackup: a Backup of a Redis (a passthrough kind) runs the
// backup block of the repository's watches.yaml: its Job copies the agent
// in with an init container and runs redis-cli --rdb - in the block's
// image, the password by reference to the release's Secret. The Job's
// command, run here against a real redis-server, stores an RDB snapshot
// in an Azure Blob Storage container (Azurite) the Backup completes with; a second redis-server started on that
// snapshot has every key.
func TestPassthroughBackup(t *testing.T) {
	cluster.Skip(t)
	ws, err := watches.Load(filepath.Join("..", "..", "..", "watches.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	kinds := backup.KindsOf(ws)
	if _, ok := kinds["Redis"]; !ok {
		t.Fatal("watches.yaml has no backup block for Redis")
	}
	agent := buildAgent(t)
	az := backuptest.StartAzure(t, t.TempDir())
	const password = "redis-password-never-shown"
	port := startRedis(t, t.TempDir(), password)
	for i := range 200 {
		redisCLI(t, port, password, "set", "key:"+strconv.Itoa(i), "value "+strconv.Itoa(i))
	}

	ns := cluster.Namespace(t)
	ctx, c := startControllers(t, func(mgr ctrl.Manager) []controller {
		stores := &backup.StoreReconciler{Deps: backup.Deps{Client: mgr.GetClient(), Reader: mgr.GetAPIReader(), Recorder: mgr.GetEventRecorderFor("test"), Stores: storeHelper(t),
			Endpoints: []string{"http://127.0.0.1:*"}, SkipNameValidation: true}}
		backups := &backup.BackupReconciler{Deps: backup.Deps{Client: mgr.GetClient(), Reader: mgr.GetAPIReader(), Recorder: mgr.GetEventRecorderFor("test"), Stores: storeHelper(t),
			Endpoints: []string{"http://127.0.0.1:*"}, Image: "chartpilot:test", SkipNameValidation: true}, Kinds: kinds}
		return []controller{stores, backups}
	})
	if err := cluster.Cordon(ctx, true); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cluster.Cordon(context.Background(), false) })
	for _, o := range []client.Object{
		&corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "azure"}, Data: map[string][]byte{"accountKey": []byte(az.AccountKey)}},
		&corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "cache-auth"}, Data: map[string][]byte{"password": []byte(password)}},
		&v1alpha1.BackupStore{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "azure"}, Spec: v1alpha1.BackupStoreSpec{Azure: &v1alpha1.AzureStore{
			Endpoint: az.Endpoint, AccountName: az.AccountName, Container: az.Container, Prefix: "team-a", CredentialsSecretRef: v1alpha1.SecretRef{Name: "azure"}}}},
	} {
		if err := c.Create(ctx, o); err != nil {
			t.Fatal(err)
		}
	}
	redis := &unstructured.Unstructured{Object: map[string]any{"apiVersion": "chartpilot.dev/v1alpha1", "kind": "Redis",
		"metadata": map[string]any{"namespace": ns, "name": "cache"}, "spec": map[string]any{}}}
	if err := c.Create(ctx, redis); err != nil {
		t.Fatal(err)
	}
	redis.Object["status"] = map[string]any{"conditions": []any{map[string]any{"type": "Ready", "status": "True", "reason": "InstallSucceeded", "message": "ok",
		"lastTransitionTime": metav1.Now().UTC().Format(time.RFC3339)}}, "release": map[string]any{"name": "cache", "chartVersion": "0.2.0"}}
	if err := c.Status().Update(ctx, redis); err != nil {
		t.Fatal(err)
	}
	b := &v1alpha1.Backup{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "rb"}, Spec: v1alpha1.BackupSpec{
		Target: v1alpha1.BackupTarget{Kind: "Redis", Name: "cache"}, Store: v1alpha1.StoreRef{Name: "azure"}}}
	if err := c.Create(ctx, b); err != nil {
		t.Fatal(err)
	}
	running := waitBackup(t, ctx, c, ns, "rb", v1alpha1.BackupRunning, "")
	job := &batchv1.Job{}
	if err := c.Get(ctx, client.ObjectKey{Namespace: ns, Name: running.Status.Job}, job); err != nil {
		t.Fatal(err)
	}
	pod := job.Spec.Template.Spec
	if len(pod.InitContainers) != 1 || pod.InitContainers[0].Image != "chartpilot:test" || pod.Containers[0].Image != "redis:7.4" ||
		pod.Containers[0].Command[0] != backup.AgentDir+"/chartpilot" || *pod.AutomountServiceAccountToken {
		t.Errorf("Job %s: init containers %v, main %s %v", job.Name, pod.InitContainers, pod.Containers[0].Image, pod.Containers[0].Command)
	}
	for _, e := range pod.Containers[0].Env {
		if e.Name == "CHARTPILOT_AZURE_ACCOUNT_KEY" && (e.ValueFrom == nil || e.ValueFrom.SecretKeyRef == nil || e.ValueFrom.SecretKeyRef.Name != "azure") {
			t.Errorf("the account key is not a reference to Secret azure: %+v", e)
		}
		if e.Name == "REDISCLI_AUTH" && (e.ValueFrom == nil || e.ValueFrom.SecretKeyRef == nil || e.ValueFrom.SecretKeyRef.Name != "cache-auth") {
			t.Errorf("REDISCLI_AUTH is not a reference to Secret cache-auth: %+v", e)
		}
	}
	// The Service "cache" is the local server here.
	toLoopback := func(args []string) []string {
		for i := range args {
			if args[i] == "-h" && i+1 < len(args) && args[i+1] == "cache" {
				return append(append(append([]string{}, args[:i]...), "-h", "127.0.0.1", "-p", strconv.Itoa(port)), args[i+2:]...)
			}
		}
		t.Fatalf("the Job's command %v does not name the Service cache with -h", args)
		return nil
	}
	finishPod(t, ctx, c, job, runJobWith(t, ctx, c, job, agent, "", 0, toLoopback))
	done := waitBackup(t, ctx, c, ns, "rb", v1alpha1.BackupCompleted, "bytes stored")
	if done.Status.ChartVersion != "0.2.0" || !strings.HasPrefix(done.Status.Location, ns+"/redis/cache/") {
		t.Errorf("Backup status %+v", done.Status)
	}

	// A new Redis annotated with the Backup starts on it: before its
	// release is installed, the hook makes the claim its pod will mount and
	// a Job that writes the snapshot there; only then may it install.
	restores := &backup.Restores{Client: c, Reader: c, AgentImage: "chartpilot:test", Kinds: kinds}
	hook := backup.Hook(c, nil, restores, nil)
	newRedis := func(name string, spec map[string]any) hooks.Object {
		t.Helper()
		u := &unstructured.Unstructured{Object: map[string]any{"apiVersion": "chartpilot.dev/v1alpha1", "kind": "Redis",
			"metadata": map[string]any{"namespace": ns, "name": name, "annotations": map[string]any{v1alpha1.AnnotationRestoreFrom: "rb"}}, "spec": spec}}
		if err := c.Create(ctx, u); err != nil {
			t.Fatal(err)
		}
		return hooks.Object{Resource: u}
	}
	held := func(obj hooks.Object, reason, msg string) {
		t.Helper()
		err := hook.PreInstall.PreInstall(ctx, obj)
		rej, ok := hooks.AsRejection(err)
		if !ok || rej.Reason != reason || !strings.Contains(rej.Message, msg) {
			t.Fatalf("PreInstall of %s: %v, want %s naming %q", obj.Resource.GetName(), err, reason, msg)
		}
		if strings.Contains(rej.Message, password) || strings.Contains(rej.Message, az.AccountKey) {
			t.Fatalf("PreInstall's message shows a secret: %s", rej.Message)
		}
	}
	// Without a data volume the restore would be lost: refused, nothing made.
	bare := newRedis("bare", map[string]any{})
	held(bare, "RestoreFailed", "spec.persistence.enabled must be true")
	claims := &corev1.PersistentVolumeClaimList{}
	if err := c.List(ctx, claims, client.InNamespace(ns)); err != nil || len(claims.Items) != 0 {
		t.Fatalf("claims after a refused restore: %d %v", len(claims.Items), err)
	}
	claim := &corev1.PersistentVolumeClaim{}
	// The composed values (a tenant's layer, overrides) are what counts
	// when the reconciler gives them.
	composed := hooks.Object{Resource: bare.Resource, Values: map[string]any{"persistence": map[string]any{"enabled": true, "size": 5}}}
	held(composed, "RestoreFailed", `spec.persistence.size must be a size such as "1Gi"`)
	composed.Values["persistence"].(map[string]any)["size"] = "3Gi"
	held(composed, "Restoring", "restores Backup rb")
	if err := c.Get(ctx, client.ObjectKey{Namespace: ns, Name: "data-bare-0"}, claim); err != nil {
		t.Fatalf("the claim from the composed values: %v", err)
	}
	if q := claim.Spec.Resources.Requests[corev1.ResourceStorage]; q.String() != "3Gi" {
		t.Errorf("claim data-bare-0 requests %s, want the composed values' 3Gi", q.String())
	}
	fresh := newRedis("fresh", map[string]any{"persistence": map[string]any{"enabled": true, "size": "2Gi"}})
	held(fresh, "Restoring", "restores Backup rb")
	if err := c.Get(ctx, client.ObjectKey{Namespace: ns, Name: "data-fresh-0"}, claim); err != nil {
		t.Fatalf("the claim of the first pod: %v", err)
	}
	if q := claim.Spec.Resources.Requests[corev1.ResourceStorage]; q.String() != "2Gi" {
		t.Errorf("claim data-fresh-0 requests %s, want the values' 2Gi", q.String())
	}
	jobs := &batchv1.JobList{}
	if err := c.List(ctx, jobs, client.InNamespace(ns), client.MatchingLabels{v1alpha1.LabelRestoreInto: "fresh"}); err != nil || len(jobs.Items) != 1 {
		t.Fatalf("restore Jobs of fresh: %d %v", len(jobs.Items), err)
	}
	rjob := &jobs.Items[0]
	rpod := rjob.Spec.Template.Spec
	mounted := false
	for _, v := range rpod.Volumes {
		mounted = mounted || (v.PersistentVolumeClaim != nil && v.PersistentVolumeClaim.ClaimName == "data-fresh-0")
	}
	if !mounted || rpod.Containers[0].Image != "redis:7.4" || len(rjob.OwnerReferences) != 1 || rjob.OwnerReferences[0].Name != "fresh" {
		t.Errorf("restore Job %s: volumes %v, image %s, owners %v", rjob.Name, rpod.Volumes, rpod.Containers[0].Image, rjob.OwnerReferences)
	}
	held(fresh, "Restoring", "restores Backup rb") // the Job runs: still held, nothing made twice
	// The Job's own command, with the claim's mount path a folder here.
	volume := t.TempDir()
	toFolder := func(args []string) []string {
		for i := range args {
			args[i] = strings.ReplaceAll(args[i], "/data/", volume+"/")
		}
		return args
	}
	finishPod(t, ctx, c, rjob, runJobWith(t, ctx, c, rjob, agent, "", 0, toFolder))
	var preErr error
	if !testwait.Until(2*time.Minute, 200*time.Millisecond, func() bool {
		preErr = hook.PreInstall.PreInstall(ctx, fresh)
		return preErr == nil
	}) {
		t.Fatalf("PreInstall after the restore Job completed: %v", preErr)
	}
	if cond := hook.Report(ctx, fresh); cond == nil || cond.Status != metav1.ConditionTrue || cond.Reason != "RestoreCompleted" {
		t.Errorf("Restored after the Job: %+v", cond)
	}
	port2 := startRedis(t, volume, password, "--dbfilename", "dump.rdb")
	if n := redisCLI(t, port2, password, "dbsize"); n != "200" {
		t.Errorf("the restored server has %s keys, want 200", n)
	}
	if v := redisCLI(t, port2, password, "get", "key:137"); v != "value 137" {
		t.Errorf("key:137 = %q", v)
	}
	// A claim of that name made by someone else (another server's data)
	// is never written to: refused, no Job.
	other := &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "data-taken-0"}, Spec: corev1.PersistentVolumeClaimSpec{
		AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
		Resources:   corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Gi")}}}}
	if err := c.Create(ctx, other); err != nil {
		t.Fatal(err)
	}
	taken := newRedis("taken", map[string]any{"persistence": map[string]any{"enabled": true}})
	held(taken, "RestoreFailed", "claim data-taken-0 already exists and was not made for this restore")
	if err := c.List(ctx, jobs, client.InNamespace(ns), client.MatchingLabels{v1alpha1.LabelRestoreInto: "taken"}); err != nil || len(jobs.Items) != 0 {
		t.Fatalf("restore Jobs onto a claim made by someone else: %d %v", len(jobs.Items), err)
	}
	// A Backup that does not exist is named, with the fix.
	missing := newRedis("missing", map[string]any{"persistence": map[string]any{"enabled": true}})
	missing.Resource.SetAnnotations(map[string]string{v1alpha1.AnnotationRestoreFrom: "nope"})
	held(missing, "RestoreFailed", "Backup nope does not exist in "+ns)
	// A store that is gone: the restore waits, then, past the grace, is
	// refused naming it (and would start once it is back).
	if err := c.Delete(ctx, &v1alpha1.BackupStore{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "azure"}}); err != nil {
		t.Fatal(err)
	}
	late := newRedis("late", map[string]any{"persistence": map[string]any{"enabled": true}})
	var rej *hooks.Rejection
	if !testwait.Until(time.Minute, 200*time.Millisecond, func() bool { // until the cache sees the deletion
		rej, _ = hooks.AsRejection(hook.PreInstall.PreInstall(ctx, late))
		return rej != nil && rej.Reason == "Restoring" && strings.Contains(rej.Message, "waits for its store")
	}) {
		t.Fatalf("PreInstall with the store gone: %+v", rej)
	}
	late.Resource.SetCreationTimestamp(metav1.NewTime(time.Now().Add(-backup.StartGrace - time.Minute)))
	held(late, "RestoreFailed", "waited 10m0s")
}

// TestBackupJobRunsAsIdentity: the Job of a Backup is created as the
// target's identity (here a ServiceAccount, as a Tenant or watches.yaml
// would name it): without the right to create Jobs the Backup fails
// naming the ServiceAccount and the right, and nothing is created; with
// it the Job is created and its pod runs as that ServiceAccount.
func TestBackupJobRunsAsIdentity(t *testing.T) {
	cluster.Skip(t)
	s3 := backuptest.StartS3(t, t.TempDir())
	ns := cluster.Namespace(t)
	user := "system:serviceaccount:" + ns + ":deployer"
	ctx, c := startControllers(t, func(mgr ctrl.Manager) []controller {
		stores := &backup.StoreReconciler{Deps: backup.Deps{Client: mgr.GetClient(), Reader: mgr.GetAPIReader(), Recorder: mgr.GetEventRecorderFor("test"), Stores: storeHelper(t),
			Endpoints: []string{"http://127.0.0.1:*"}, SkipNameValidation: true}}
		backups := &backup.BackupReconciler{Deps: backup.Deps{Client: mgr.GetClient(), Reader: mgr.GetAPIReader(), Recorder: mgr.GetEventRecorderFor("test"), Stores: storeHelper(t),
			Endpoints: []string{"http://127.0.0.1:*"}, Image: "chartpilot:test", SkipNameValidation: true,
			Identity: &backup.Identity{Config: cluster.Config, Of: func(_ context.Context, u *unstructured.Unstructured) (string, error) {
				if u.GetKind() != "Postgres" || u.GetName() != "db" {
					t.Errorf("identity asked for %s %s", u.GetKind(), u.GetName())
				}
				return user, nil
			}}}}
		return []controller{stores, backups}
	})
	db := &v1alpha1.Postgres{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "db"}, Spec: v1alpha1.PostgresSpec{Version: "15", Storage: v1alpha1.PostgresStorage{Size: "1Gi"}}}
	for _, o := range []client.Object{
		&corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "deployer"}},
		&corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "s3"}, Data: map[string][]byte{"accessKeyID": []byte(s3.AccessKeyID), "secretAccessKey": []byte(s3.SecretAccessKey)}},
		&v1alpha1.BackupStore{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "s3"}, Spec: v1alpha1.BackupStoreSpec{S3: &v1alpha1.S3Store{
			Endpoint: s3.Endpoint, Bucket: s3.Bucket, ForcePathStyle: true, CredentialsSecretRef: v1alpha1.SecretRef{Name: "s3"}}}},
		db,
	} {
		if err := c.Create(ctx, o); err != nil {
			t.Fatal(err)
		}
	}
	db.Status.Conditions = []metav1.Condition{{Type: v1alpha1.ConditionReady, Status: metav1.ConditionTrue, Reason: "InstallSucceeded", Message: "ok", LastTransitionTime: metav1.Now()}}
	db.Status.Endpoints = &v1alpha1.PostgresEndpoints{ReadWrite: "db", Secret: "db-auth", CASecret: "db-tls"}
	if err := c.Status().Update(ctx, db); err != nil {
		t.Fatal(err)
	}
	newBackup := func(name string) {
		t.Helper()
		if err := c.Create(ctx, &v1alpha1.Backup{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}, Spec: v1alpha1.BackupSpec{
			Target: v1alpha1.BackupTarget{Kind: "Postgres", Name: "db"}, Store: v1alpha1.StoreRef{Name: "s3"}}}); err != nil {
			t.Fatal(err)
		}
	}
	newBackup("denied")
	waitBackup(t, ctx, c, ns, "denied", v1alpha1.BackupFailed, user+" may not create Job")
	jobs := &batchv1.JobList{}
	if err := c.List(ctx, jobs, client.InNamespace(ns)); err != nil || len(jobs.Items) != 0 {
		t.Fatalf("Jobs after the refusal: %d (%v)", len(jobs.Items), err)
	}

	for _, o := range []client.Object{
		&rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "backups"}, Rules: []rbacv1.PolicyRule{{APIGroups: []string{"batch"}, Resources: []string{"jobs"}, Verbs: []string{"create"}}}},
		&rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "backups"}, RoleRef: rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "Role", Name: "backups"},
			Subjects: []rbacv1.Subject{{Kind: "ServiceAccount", Namespace: ns, Name: "deployer"}}},
	} {
		if err := c.Create(ctx, o); err != nil {
			t.Fatal(err)
		}
	}
	// The API server's authorizer follows new bindings a moment later
	// (longer on a loaded machine): the Backup is created once it allows.
	sar := func() bool {
		r := &authorizationv1.SubjectAccessReview{Spec: authorizationv1.SubjectAccessReviewSpec{User: user,
			Groups:             []string{"system:serviceaccounts", "system:serviceaccounts:" + ns},
			ResourceAttributes: &authorizationv1.ResourceAttributes{Namespace: ns, Verb: "create", Group: "batch", Resource: "jobs"}}}
		return c.Create(ctx, r) == nil && r.Status.Allowed
	}
	if !testwait.Until(time.Minute, 200*time.Millisecond, sar) {
		t.Fatalf("%s may not create Jobs a minute after its RoleBinding", user)
	}
	newBackup("allowed")
	running := waitBackup(t, ctx, c, ns, "allowed", v1alpha1.BackupRunning, "")
	job := &batchv1.Job{}
	if err := c.Get(ctx, client.ObjectKey{Namespace: ns, Name: running.Status.Job}, job); err != nil {
		t.Fatal(err)
	}
	if sa := job.Spec.Template.Spec.ServiceAccountName; sa != "deployer" || *job.Spec.Template.Spec.AutomountServiceAccountToken {
		t.Errorf("the Job's pod runs as %q (token mounted: %v), want deployer without its token", sa, *job.Spec.Template.Spec.AutomountServiceAccountToken)
	}
}
