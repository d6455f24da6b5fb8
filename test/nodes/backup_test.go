package nodes

import (
	"context"
	"encoding/json"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"filippo.io/age"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/chartpilot/chartpilot/internal/api/v1alpha1"
	"github.com/chartpilot/chartpilot/internal/backup"
	"github.com/chartpilot/chartpilot/internal/backup/backuptest"
	"github.com/chartpilot/chartpilot/internal/rbac"
	"github.com/chartpilot/chartpilot/internal/testing/testcluster"
)

// operatorWithStore starts a real S3 server (versitygw) at this machine's
// address on the real nodes' network (testcluster.HostIP), where the Jobs' pods and the operator's (which reads each
// backup's manifest back) reach it, installs the operator (values over
// charts/chartpilot's) allowed to store there, and makes a tenant namespace
// with BackupStore "local" on it. It returns the server's directory and
// the namespace.
func operatorWithStore(t *testing.T, values map[string]any) (string, string) {
	t.Helper()
	ctx := context.Background()
	cs, dyn := clients(t)
	s3dir := t.TempDir()
	s3 := backuptest.StartS3On(t, s3dir, testcluster.HostIP)
	vals := map[string]any{"extraArgs": []any{"--backup-store-endpoints=" + s3.Endpoint}}
	for k, v := range values {
		vals[k] = v
	}
	installOperator(t, cluster.Namespace(t), 1, vals)
	tenant := cluster.Namespace(t)
	if _, err := rbac.CreateDeployer(ctx, cs, tenant, rbac.DefaultDeployer, rbac.DefaultDeployer); err != nil {
		t.Fatal(err)
	}
	creds := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: tenant, Name: "s3-creds"},
		StringData: map[string]string{"accessKeyID": s3.AccessKeyID, "secretAccessKey": s3.SecretAccessKey}}
	if _, err := cs.CoreV1().Secrets(tenant).Create(ctx, creds, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	createThroughWebhook(t, dyn, backupStoreGVR, tenant, "BackupStore", "local", map[string]any{"s3": map[string]any{
		"endpoint": s3.Endpoint, "bucket": s3.Bucket, "prefix": s3.Prefix, "forcePathStyle": true,
		"credentialsSecretRef": map[string]any{"name": "s3-creds"}}})
	return s3dir, tenant
}

// corruptLargest changes one byte in the middle of the largest object
// (a backup's data) of the S3 server's directory s3dir.
func corruptLargest(t *testing.T, s3dir string) {
	t.Helper()
	var data string
	var size int64
	if err := filepath.WalkDir(filepath.Join(s3dir, "data"), func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || strings.HasSuffix(p, "manifest.json") {
			return err
		}
		if info, err := d.Info(); err == nil && info.Size() > size {
			data, size = p, info.Size()
		}
		return nil
	}); err != nil || data == "" {
		t.Fatalf("the backup's data in the store: %v", err)
	}
	f, err := os.OpenFile(data, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	b := make([]byte, 1)
	if _, err := f.ReadAt(b, size/2); err != nil {
		t.Fatal(err)
	}
	b[0] ^= 0xff
	if _, err := f.WriteAt(b, size/2); err != nil {
		t.Fatal(err)
	}
}

// superQuery runs sql in db of Postgres name in ns, through its Service,
// as its superuser, waiting a minute at most for it to answer.
func superQuery(t *testing.T, ns, name, db, sql string) string {
	t.Helper()
	cs, _ := clients(t)
	user, password := superuser(t, cs, ns, name)
	host := serviceIP(t, cs, ns, name)
	var out string
	var last error
	if err := wait.PollUntilContextTimeout(context.Background(), time.Second, time.Minute, true, func(context.Context) (bool, error) {
		out, last = psqlIn(t, host, user, password, db, sql)
		return last == nil, nil
	}); err != nil {
		t.Fatalf("%s on %s/%s: %v", sql, name, db, last)
	}
	return out
}

// TestBackupRestoreOnRealPods: the operator as installed (its pod on the
// real node) backs up a Postgres 15 whose data lives in two application
// databases of their own owners, with a group role and grants, by a real
// Job (the agent copied in by the init container, UID 65532, read-only
// root) to a real S3 server (versitygw) on the node network, encrypted
// for the Postgres's age key; a new Postgres restored from that Backup by
// a real Job has the same roles (their password hashes too), memberships,
// owners, grants and rows, and keeps its own superuser password. Restored
// with another key, and with one byte of the stored data changed, the
// restore Job refuses the backup before anything reaches the new server.
func TestBackupRestoreOnRealPods(t *testing.T) {
	ctx := context.Background()
	cs, dyn := clients(t)
	pgRepo, _ := postgresImages(t)
	s3dir, tenant := operatorWithStore(t, map[string]any{"postgresImage": pgRepo})
	create := func(gvr schema.GroupVersionResource, kind, name string, spec map[string]any) {
		t.Helper()
		createThroughWebhook(t, dyn, gvr, tenant, kind, name, spec)
	}
	query := func(name, db, sql string) string {
		t.Helper()
		return superQuery(t, tenant, name, db, sql)
	}

	// Backups of src are encrypted for its key; another key is at hand.
	for secret := range map[string]bool{"backup-key": true, "other-key": true} {
		id, err := age.GenerateX25519Identity()
		if err != nil {
			t.Fatal(err)
		}
		key := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: tenant, Name: secret}, StringData: map[string]string{"age": id.String()}}
		if _, err := cs.CoreV1().Secrets(tenant).Create(ctx, key, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	withKey := func(secret string) map[string]any {
		return map[string]any{"keySecretRef": map[string]any{"name": secret, "key": "age"}}
	}
	create(postgresGVR, "Postgres", "src", realNodePostgres(pgRepo, "15", map[string]any{
		"backup": map[string]any{"store": map[string]any{"name": "local"}, "schedule": "0 3 * * *", "encryption": withKey("backup-key")},
	}))
	waitReady(t, dyn, postgresGVR, tenant, "src", "True", 6*time.Minute)
	for _, sql := range []string{
		"CREATE ROLE shop_owner LOGIN PASSWORD 'shop-secret'",
		"CREATE ROLE reporting NOLOGIN",
		"CREATE ROLE analyst LOGIN PASSWORD 'analyst-secret' IN ROLE reporting",
		"CREATE DATABASE shop OWNER shop_owner",
		"CREATE DATABASE stock OWNER analyst",
	} {
		query("src", "postgres", sql)
	}
	query("src", "shop", "SET ROLE shop_owner; CREATE TABLE orders (id int PRIMARY KEY, total numeric); INSERT INTO orders SELECT g, g * 1.5 FROM generate_series(1, 2000) g; GRANT SELECT ON orders TO reporting")
	query("src", "stock", "SET ROLE analyst; CREATE TABLE items AS SELECT g AS id FROM generate_series(1, 300) g")
	state := func(name string) string {
		roles := query(name, "postgres", `SELECT string_agg(format('%s login=%s password=%s', rolname, rolcanlogin, coalesce(left(md5(rolpassword), 8), '-')), ' ' ORDER BY rolname)
			FROM pg_authid WHERE rolname IN ('shop_owner', 'reporting', 'analyst')`)
		members := query(name, "postgres", `SELECT string_agg(m.rolname || '>' || r.rolname, ' ' ORDER BY 1) FROM pg_auth_members a
			JOIN pg_roles r ON r.oid = a.roleid JOIN pg_roles m ON m.oid = a.member WHERE r.rolname = 'reporting'`)
		dbs := query(name, "postgres", `SELECT string_agg(datname || '=' || datdba::regrole, ' ' ORDER BY datname) FROM pg_database WHERE datname IN ('shop', 'stock')`)
		shop := query(name, "shop", `SELECT count(*) || ' ' || sum(total) || ' ' || (SELECT relowner::regrole || ' ' || relacl::text FROM pg_class WHERE relname = 'orders') FROM orders`)
		stock := query(name, "stock", `SELECT count(*) || ' ' || (SELECT relowner::regrole::text FROM pg_class WHERE relname = 'items') FROM items`)
		return strings.Join([]string{roles, members, dbs, shop, stock}, "\n")
	}
	fillMB(t, tenant, "src", "shop", *dataMB)
	want := state("src")

	create(backupGVR, "Backup", "full", map[string]any{"target": map[string]any{"kind": "Postgres", "name": "src"}, "store": map[string]any{"name": "local"}})
	waitBackupCompleted(t, tenant, "full")
	full, err := dyn.Resource(backupGVR).Namespace(tenant).Get(ctx, "full", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var bst v1alpha1.BackupStatus
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(full.Object["status"].(map[string]any), &bst); err != nil || bst.StartedAt == nil || bst.CompletedAt == nil {
		t.Fatalf("Backup full's status: %+v, %v", bst, err)
	}
	dbBytes := query("src", "postgres", "SELECT sum(pg_database_size(datname)) FROM pg_database")
	job, err := cs.BatchV1().Jobs(tenant).List(ctx, metav1.ListOptions{LabelSelector: "chartpilot.dev/backup=full"})
	if err != nil || len(job.Items) != 1 {
		t.Fatalf("the Backup's Job: %v, %d", err, len(job.Items))
	}
	if pod := job.Items[0].Spec.Template.Spec; pod.SecurityContext == nil || *pod.SecurityContext.RunAsUser != 65532 ||
		!*pod.Containers[0].SecurityContext.ReadOnlyRootFilesystem || len(pod.InitContainers) != 1 {
		t.Errorf("the backup Job's pod: %+v", pod)
	}
	// It reached the server through TLS, the server's certificate checked
	// against the chart's CA (the Job succeeded: the check passed).
	ctr := job.Items[0].Spec.Template.Spec.Containers[0]
	if !slices.ContainsFunc(ctr.Env, func(e corev1.EnvVar) bool { return e.Name == "PGSSLMODE" && e.Value == "verify-full" }) ||
		!slices.ContainsFunc(job.Items[0].Spec.Template.Spec.Volumes, func(v corev1.Volume) bool { return v.Secret != nil && v.Secret.SecretName == "src-tls" }) {
		t.Errorf("the backup Job does not verify the server against src-tls's CA: env %v", ctr.Env)
	}

	restoreStart := time.Now()
	create(postgresGVR, "Postgres", "dst", realNodePostgres(pgRepo, "15", map[string]any{"restore": map[string]any{"fromBackup": "full", "encryption": withKey("backup-key")}}))
	err = wait.PollUntilContextTimeout(ctx, 2*time.Second, 8*time.Minute, true, func(ctx context.Context) (bool, error) {
		u, err := dyn.Resource(postgresGVR).Namespace(tenant).Get(ctx, "dst", metav1.GetOptions{})
		if err != nil {
			return false, nil
		}
		phase, _, _ := unstructured.NestedString(u.Object, "status", "restore", "phase")
		if phase == "Failed" {
			msg, _, _ := unstructured.NestedString(u.Object, "status", "restore", "message")
			t.Fatalf("the restore failed: %s", msg)
		}
		ready, _ := condition(u, "Ready")
		return phase == "Completed" && ready == "True", nil
	})
	if err != nil {
		t.Fatalf("dst not restored and Ready within 8 minutes: %v", err)
	}
	report(t, "backup", map[string]any{"bytes": dbBytes, "stored": bst.Size, "backupSeconds": bst.CompletedAt.Sub(bst.StartedAt.Time).Seconds(),
		"restoreSeconds": time.Since(restoreStart).Seconds()})
	if *dataMB > 0 {
		if a, b := query("src", "shop", "SELECT count(*) FROM bulk"), query("dst", "shop", "SELECT count(*) FROM bulk"); a != b {
			t.Errorf("bulk rows: %s backed up, %s restored", a, b)
		}
	}
	if got := state("dst"); got != want {
		t.Errorf("the restored Postgres differs:\n--- backed up\n%s\n--- restored\n%s", want, got)
	}
	// Its superuser is its own: its Secret's password still logs in.
	if v := query("dst", "postgres", "SELECT 1"); v != "1" {
		t.Errorf("dst's superuser: %q", v)
	}
	t.Logf("restored: %s", strings.ReplaceAll(want, "\n", "; "))

	// A restore drill as spec.backup.verify runs it: its Job (src's image,
	// as its postgres user, holding no credential of src) restores the
	// backup whole into a server it starts itself.
	verify := func(schedule string) {
		t.Helper()
		patch := fmt.Sprintf(`{"spec":{"backup":{"verify":%q}}}`, schedule)
		if _, err := dyn.Resource(postgresGVR).Namespace(tenant).Patch(ctx, "src", types.MergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	verify("* * * * *")
	var drilled string
	err = wait.PollUntilContextTimeout(ctx, 2*time.Second, 8*time.Minute, true, func(ctx context.Context) (bool, error) {
		u, err := dyn.Resource(postgresGVR).Namespace(tenant).Get(ctx, "src", metav1.GetOptions{})
		if err != nil {
			return false, nil
		}
		drilled, _, _ = unstructured.NestedString(u.Object, "status", "backup", "lastVerifyResult")
		return strings.HasPrefix(drilled, "Succeeded") || strings.HasPrefix(drilled, "Failed"), nil
	})
	if err != nil || !strings.HasPrefix(drilled, "Succeeded: Backup full") || !strings.Contains(drilled, "throwaway server") {
		t.Fatalf("the restore drill on real pods: %v, %q", err, drilled)
	}
	t.Logf("drilled: %s", drilled)
	verify("")

	// The backup is stored encrypted; restored with another key it is
	// refused, naming both keys' recipients, before anything is read.
	var manifest backup.Manifest
	_ = filepath.WalkDir(filepath.Join(s3dir, "data"), func(p string, d fs.DirEntry, err error) error {
		if err == nil && strings.HasSuffix(p, "manifest.json") {
			b, _ := os.ReadFile(p)
			_ = json.Unmarshal(b, &manifest)
		}
		return nil
	})
	if manifest.Encryption != "age" || manifest.Recipient == "" {
		t.Errorf("the stored manifest does not say the data is encrypted: %+v", manifest)
	}
	refused(t, tenant, "wrongkey", realNodePostgres(pgRepo, "15", map[string]any{"restore": map[string]any{"fromBackup": "full", "encryption": withKey("other-key")}}),
		"was encrypted for", "use the key it was made with")

	// One byte of the stored data changed: the restore is refused, and
	// the new server gets none of it.
	corruptLargest(t, s3dir)
	refused(t, tenant, "bad", realNodePostgres(pgRepo, "15", map[string]any{"restore": map[string]any{"fromBackup": "full", "encryption": withKey("backup-key")}}),
		"corrupted", "nothing was restored")
}

// refused creates Postgres name in ns with spec (a restore) and waits for
// the restore to fail with a message holding each of says; nothing of the
// backup (test/nodes' shop and stock databases and their roles) may reach
// its server.
func refused(t *testing.T, ns, name string, spec map[string]any, says ...string) {
	t.Helper()
	_, dyn := clients(t)
	createThroughWebhook(t, dyn, postgresGVR, ns, "Postgres", name, spec)
	var msg string
	err := wait.PollUntilContextTimeout(context.Background(), 2*time.Second, 8*time.Minute, true, func(ctx context.Context) (bool, error) {
		u, err := dyn.Resource(postgresGVR).Namespace(ns).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, nil
		}
		phase, _, _ := unstructured.NestedString(u.Object, "status", "restore", "phase")
		msg, _, _ = unstructured.NestedString(u.Object, "status", "restore", "message")
		if phase == "Completed" {
			t.Fatalf("%s: restored: %s", name, msg)
		}
		return phase == "Failed", nil
	})
	if err != nil {
		t.Fatalf("%s: the restore did not fail: %v, message %q", name, err, msg)
	}
	for _, s := range says {
		if !strings.Contains(msg, s) {
			t.Errorf("%s: the refusal %q does not say %q", name, msg, s)
		}
	}
	t.Logf("%s: %s", name, msg)
	if n := superQuery(t, ns, name, "postgres", "SELECT count(*) FROM pg_database WHERE datname IN ('shop', 'stock')"); n != "0" {
		t.Errorf("%s: %s of the backup's databases reached the server", name, n)
	}
	if n := superQuery(t, ns, name, "postgres", "SELECT count(*) FROM pg_roles WHERE rolname IN ('shop_owner', 'reporting', 'analyst')"); n != "0" {
		t.Errorf("%s: %s of the backup's roles reached the server", name, n)
	}
}
