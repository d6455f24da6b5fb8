package backup_test

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/chartpilot/chartpilot/internal/agent/instance"
	"github.com/chartpilot/chartpilot/internal/agent/majorupgrade"
	"github.com/chartpilot/chartpilot/internal/api/v1alpha1"
	"github.com/chartpilot/chartpilot/internal/controller/backup"
	"github.com/chartpilot/chartpilot/internal/hooks"
	"github.com/chartpilot/chartpilot/internal/testing/testpg"
	"github.com/chartpilot/chartpilot/internal/testing/testwait"
)

// runMajorJob plays the kubelet for a major upgrade Job: it runs the
// pod's command (the real chartpilot, copied where the server's user can
// run it) as the servers' user, with the Job's environment (Secrets
// resolved), the old server at old's address, the new major's binaries
// from pg17 (its client tools from Debian's PostgreSQL), and the mounted
// data volume at dataDir. It returns the termination message and whether
// the command succeeded.
func runMajorJob(t *testing.T, ctx context.Context, c client.Client, job *batchv1.Job, agent string, old *testpg.Server, pg17, dataDir string) (string, bool) {
	t.Helper()
	work := old.TempDir(t)
	bin := filepath.Join(work, "chartpilot")
	copyFile(t, agent, bin)
	ctr := job.Spec.Template.Spec.Containers[0]
	if len(ctr.Command) != 1 || ctr.Command[0] != backup.AgentDir+"/chartpilot" {
		t.Fatalf("the Job runs %v, want the agent copied to %s", ctr.Command, backup.AgentDir)
	}
	env := jobEnv(t, ctx, c, job)
	env["PGHOST"], env["PGPORT"] = "127.0.0.1", strconv.Itoa(old.Port)
	termination := filepath.Join(work, "termination-log")
	replace := strings.NewReplacer("/var/lib/postgresql/data", dataDir, "/dev/termination-log", termination, "/usr/lib/postgresql/17/bin", pg17)
	var args []string
	for _, a := range ctr.Args {
		args = append(args, replace.Replace(a))
	}
	args = append(args, "--client-bin", testpg.Bin(t))
	cmd := old.Command(env, bin, args...)
	var stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = io.Discard, &stderr
	err := cmd.Run()
	msg, rerr := os.ReadFile(termination)
	if rerr != nil {
		t.Fatalf("the Job's command wrote no report (%v): %v\n%s", err, rerr, stderr.String())
	}
	t.Logf("the Job's command: %v\n%s", err, stderr.String())
	return string(msg), err == nil
}

func copyFile(t *testing.T, from, to string) {
	t.Helper()
	b, err := os.ReadFile(from)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(to, b, 0o755); err != nil {
		t.Fatal(err)
	}
}

// TestMajorUpgradeCarriedOut: a Postgres on PostgreSQL 15 asking for 17
// (its fresh backup completed) gets a Job of PostgreSQL 17's image that
// moves the data to a new claim. Its command, run for real against a real
// PostgreSQL 15 with seeded data and PostgreSQL 17's binaries: a failure
// (the new data directory is in the way) is named with its step, holds
// the upgrade, and leaves the old server taking writes; after the Job is
// deleted, a new one moves every row (report and an independent count on
// a PostgreSQL 17 server started on the new directory), and only then do
// the values name the new claim template and the upgrade proceed, with
// status.dataVolume and status.previousVolume (the old claims, kept)
// recorded; failover is on, so the moved data is marked for the instance
// managers. Without spec.backup it is refused with the field to set.
func TestMajorUpgradeCarriedOut(t *testing.T) {
	cluster.Skip(t)
	agent := buildAgent(t)
	pg17 := testpg.Bin17(t)
	old := testpg.Start(t)
	old.Query(t, "postgres", "create table items (id int primary key, name text); insert into items select i, 'item ' || i from generate_series(1, 5000) i")
	ns := cluster.Namespace(t)
	c := directClient(t)
	ctx := context.Background()
	// No node takes the Job's pod: the test plays its kubelet.
	if err := cluster.Cordon(ctx, true); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cluster.Cordon(context.Background(), false) })
	if err := c.Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "db-auth"},
		Data: map[string][]byte{"username": []byte("postgres"), "password": []byte("s3cr3t-pw")}}); err != nil {
		t.Fatal(err)
	}
	// The old major's claim, which must be kept and named.
	if err := c.Create(ctx, &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "data-db-0"}, Spec: corev1.PersistentVolumeClaimSpec{
		AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
		Resources:   corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Gi")}}}}); err != nil {
		t.Fatal(err)
	}
	pg := &v1alpha1.Postgres{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "db"}, Spec: v1alpha1.PostgresSpec{
		Version: "17", Storage: v1alpha1.PostgresStorage{Size: "1Gi"}, Replicas: ptrTo(int32(2)),
		Backup: &v1alpha1.PostgresBackup{Store: v1alpha1.StoreRef{Name: "s3"}, Schedule: "0 3 * * *"},
	}}
	if err := c.Create(ctx, pg); err != nil {
		t.Fatal(err)
	}
	pg.Status.Version = "15"
	noTLS := false // the test's server takes none
	pg.Status.Endpoints = &v1alpha1.PostgresEndpoints{ReadWrite: "db", ReadOnly: "db-ro", Secret: "db-auth", TLS: &noTLS}
	if err := c.Status().Update(ctx, pg); err != nil {
		t.Fatal(err)
	}
	// The fresh backup the upgrade waits for first, completed.
	b := &v1alpha1.Backup{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "db-before-major-17"},
		Spec: v1alpha1.BackupSpec{Target: v1alpha1.BackupTarget{Kind: "Postgres", Name: "db"}, Store: v1alpha1.StoreRef{Kind: "BackupStore", Name: "s3"}}}
	if err := c.Create(ctx, b); err != nil {
		t.Fatal(err)
	}
	b.Status = v1alpha1.BackupStatus{Phase: v1alpha1.BackupCompleted}
	if err := c.Status().Update(ctx, b); err != nil {
		t.Fatal(err)
	}

	hook := backup.Hook(c, &backup.Major{Client: c, Reader: c, AgentImage: "chartpilot:test"}, nil, nil)
	fresh := func() *v1alpha1.Postgres {
		t.Helper()
		p := &v1alpha1.Postgres{}
		if err := c.Get(ctx, client.ObjectKeyFromObject(pg), p); err != nil {
			t.Fatal(err)
		}
		return p
	}
	// One pass: values, then the upgrade gate, sharing what they read.
	pass := func(p *v1alpha1.Postgres) (volume string, err error) {
		t.Helper()
		pctx := hooks.WithPassMemo(ctx)
		obj := hooks.Object{Resource: toUnstructured(t, p)}
		vals, verr := hook.Values.Values(pctx, obj)
		if verr != nil {
			t.Fatalf("values: %v", verr)
		}
		if st, ok := vals["storage"].(map[string]any); ok {
			volume, _ = st["volumeName"].(string)
		}
		return volume, hook.PreUpgrade.PreUpgrade(pctx, obj, "0.4.0", "0.4.0")
	}
	expect := func(err error, reason string, msgs ...string) {
		t.Helper()
		rej, ok := hooks.AsRejection(err)
		if !ok || rej.Reason != reason {
			t.Fatalf("PreUpgrade: %v, want %s", err, reason)
		}
		for _, m := range msgs {
			if !strings.Contains(rej.Message, m) {
				t.Fatalf("PreUpgrade: %s, want it to name %q", rej.Message, m)
			}
		}
		if strings.Contains(rej.Message, "s3cr3t-pw") {
			t.Fatalf("the refusal shows the password: %s", rej.Message)
		}
	}
	waitJob := func(cond batchv1.JobConditionType) *batchv1.Job {
		t.Helper()
		job := &batchv1.Job{}
		if !testwait.Until(2*time.Minute, 200*time.Millisecond, func() bool {
			if err := c.Get(ctx, client.ObjectKey{Namespace: ns, Name: "db-major-17"}, job); err != nil {
				return false
			}
			if cond == "" {
				return true
			}
			for _, jc := range job.Status.Conditions {
				if jc.Type == cond && jc.Status == corev1.ConditionTrue {
					return true
				}
			}
			return false
		}) {
			t.Fatalf("Job db-major-17 never %q: %+v", cond, job.Status)
		}
		return job
	}

	// The refusal that names the field: no backup.
	noBackup := fresh()
	noBackup.Spec.Backup = nil
	_, err := pass(noBackup)
	expect(err, "MajorUpgradeNeedsBackup", "spec.backup.store")

	// The Job starts; the values keep the old volume.
	vol, err := pass(fresh())
	expect(err, "MajorUpgradeRunning", "Job db-major-17 started", "data-pg17-db-0")
	if vol != "" {
		t.Errorf("values name volume %q while the data moves, want none (the chart's data)", vol)
	}
	job := waitJob("")
	spec := job.Spec.Template.Spec
	if img := spec.Containers[0].Image; img != "postgres:17" {
		t.Errorf("the Job runs image %s, want postgres:17", img)
	}
	if spec.AutomountServiceAccountToken == nil || *spec.AutomountServiceAccountToken || len(spec.InitContainers) != 1 || spec.InitContainers[0].Image != "chartpilot:test" {
		t.Errorf("pod: token %v, init containers %+v", spec.AutomountServiceAccountToken, spec.InitContainers)
	}
	claim := &corev1.PersistentVolumeClaim{}
	if err := c.Get(ctx, client.ObjectKey{Namespace: ns, Name: "data-pg17-db-0"}, claim); err != nil {
		t.Fatalf("the new claim: %v", err)
	}
	for _, v := range spec.Volumes {
		if v.PersistentVolumeClaim != nil && v.PersistentVolumeClaim.ClaimName != "data-pg17-db-0" {
			t.Errorf("the Job mounts claim %s", v.PersistentVolumeClaim.ClaimName)
		}
	}
	for _, e := range spec.Containers[0].Env {
		if e.Name == "PGPASSWORD" && (e.ValueFrom == nil || e.ValueFrom.SecretKeyRef == nil || e.Value != "") {
			t.Errorf("the password is not taken from its Secret: %+v", e)
		}
	}
	expect(func() error { _, err := pass(fresh()); return err }(), "MajorUpgradeRunning", "moves the data")

	// A failure: the new data directory is in the way (step init).
	volume := old.TempDir(t)
	old.Mkdir(t, filepath.Join(volume, "pgdata"))
	msg, ok := runMajorJob(t, ctx, c, job, agent, old, pg17, volume)
	if ok {
		t.Fatalf("the Job's command succeeded over an existing data directory: %s", msg)
	}
	endPod(t, ctx, c, job, msg, 1)
	waitJob(batchv1.JobFailed)
	vol, err = pass(fresh())
	expect(err, "MajorUpgradeFailed", "failed at step init", "stays on PostgreSQL 15", "delete Job db-major-17")
	if vol != "" {
		t.Errorf("values name volume %q after a failed move", vol)
	}
	if mu := fresh().Status.MajorUpgrade; mu == nil || mu.Phase != backup.MajorFailed || mu.Step != "init" {
		t.Errorf("status.majorUpgrade %+v, want Failed at init", mu)
	}
	old.Query(t, "postgres", "insert into items values (5001, 'written after the failed upgrade')")

	// Deleted, the Job starts again and this time moves the data.
	bg := metav1.DeletePropagationBackground
	if err := c.Delete(ctx, job, &client.DeleteOptions{PropagationPolicy: &bg}); err != nil {
		t.Fatal(err)
	}
	if !testwait.Until(time.Minute, 100*time.Millisecond, func() bool { return c.Get(ctx, client.ObjectKeyFromObject(job), &batchv1.Job{}) != nil }) {
		t.Fatal("the failed Job was not deleted")
	}
	_, err = pass(fresh())
	expect(err, "MajorUpgradeRunning", "started")
	job = waitJob("")
	volume = old.TempDir(t)
	msg, ok = runMajorJob(t, ctx, c, job, agent, old, pg17, volume)
	if !ok {
		t.Fatalf("the Job's command failed: %s", msg)
	}
	rep := majorupgrade.Report{}
	if err := json.Unmarshal([]byte(msg), &rep); err != nil || !rep.OK || rep.Major != "17" || rep.Tables != 1 || rep.Rows != 5001 {
		t.Fatalf("report %s (%v), want 1 table, 5001 rows on 17", msg, err)
	}
	if n := countOn17(t, old, pg17, filepath.Join(volume, "pgdata")); n != "5001" {
		t.Errorf("PostgreSQL 17 on the new data directory counts %s rows, want 5001", n)
	}
	// Failover is on (2 replicas): the data is marked as moved, so that pod
	// 0's instance manager leads with it.
	if _, err := os.Stat(instance.MovedMarker(filepath.Join(volume, "pgdata"))); err != nil {
		t.Errorf("the moved data is not marked for the instance managers: %v", err)
	}
	if _, err := os.Stat(filepath.Join(volume, "major-upgrade")); !os.IsNotExist(err) {
		t.Errorf("the work directory (the dump) was left on the volume: %v", err)
	}
	// Before the Job is seen to complete, nothing switches.
	if vol, _ := pass(fresh()); vol != "" {
		t.Errorf("values name volume %q before the Job completed", vol)
	}
	endPod(t, ctx, c, job, msg, 0)
	waitJob(batchv1.JobComplete)
	vol, err = pass(fresh())
	if err != nil || vol != "data-pg17" {
		t.Fatalf("after the data moved: values volume %q, PreUpgrade %v; want data-pg17 and the upgrade to proceed", vol, err)
	}
	st := fresh().Status
	if st.DataVolume == nil || st.DataVolume.Name != "data-pg17" || st.DataVolume.Major != "17" {
		t.Errorf("status.dataVolume %+v", st.DataVolume)
	}
	if pv := st.PreviousVolume; pv == nil || pv.Name != "data" || pv.Major != "15" || strings.Join(pv.Claims, ",") != "data-db-0" {
		t.Errorf("status.previousVolume %+v, want data of 15 with claim data-db-0", pv)
	}
	if mu := st.MajorUpgrade; mu == nil || mu.Phase != backup.MajorCompleted || mu.Rows != 5001 {
		t.Errorf("status.majorUpgrade %+v", mu)
	}
	// The old server stopped taking writes when its data moved.
	cmd := old.Command(old.Env("postgres"), "psql", "-XAtq", "-v", "ON_ERROR_STOP=1", "-c", "insert into items values (9999, 'lost?')")
	if out, err := cmd.CombinedOutput(); err == nil || !strings.Contains(string(out), "read-only") {
		t.Errorf("the old server took a write after its data moved: %v %s", err, out)
	}
	// Once deployed (status.version 17), the values keep the new volume.
	deployed := fresh()
	deployed.Status.Version = "17"
	if vol, err := pass(deployed); err != nil || vol != "data-pg17" {
		t.Errorf("after the switch: values volume %q, PreUpgrade %v", vol, err)
	}
}

func ptrTo[T any](v T) *T { return &v }

// countOn17 starts PostgreSQL 17 on data and counts the rows of items.
func countOn17(t *testing.T, r *testpg.Server, bin, data string) string {
	t.Helper()
	sock := r.TempDir(t)
	port := testpg.FreePort(t)
	srv := r.Command(nil, filepath.Join(bin, "postgres"), "-D", data, "-c", "listen_addresses=", "-c", "port="+strconv.Itoa(port), "-c", "unix_socket_directories="+sock)
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	defer testpg.StopServer(srv)
	env := map[string]string{"PGHOST": sock, "PGPORT": strconv.Itoa(port), "PGUSER": "postgres", "PGDATABASE": "postgres"}
	var out []byte
	var err error
	if !testwait.Until(time.Minute, 200*time.Millisecond, func() bool {
		out, err = r.Command(env, "psql", "-XAtq", "-c", "select count(*) from items").CombinedOutput()
		return err == nil
	}) {
		t.Fatalf("PostgreSQL 17 on %s: %v %s", data, err, out)
	}
	return strings.TrimSpace(string(out))
}
