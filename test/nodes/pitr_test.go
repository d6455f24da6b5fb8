package nodes

import (
	"context"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"filippo.io/age"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/chartpilot/chartpilot/internal/agent/blobstore"
	"github.com/chartpilot/chartpilot/internal/agent/wal"
	"github.com/chartpilot/chartpilot/internal/backup"
)

// archived lists the WAL objects of the archive of Postgres name in
// the S3 server's directory s3dir (their names).
func archived(s3dir, tenant, name string) []string {
	var out []string
	_ = filepath.WalkDir(filepath.Join(s3dir, "data"), func(p string, d fs.DirEntry, err error) error {
		if err == nil && !d.IsDir() && strings.HasSuffix(filepath.Dir(p), filepath.Join(tenant, name, "pg15", "wal")) {
			out = append(out, d.Name())
		}
		return nil
	})
	return out
}

// rowsUpTo are the values of t committed at or before ts on the server
// at host, in order, separated by spaces.
func rowsUpTo(t *testing.T, host, user, password, ts string) string {
	t.Helper()
	out, err := psql(t, host, user, password, fmt.Sprintf("SELECT coalesce(string_agg(v::text, ' ' ORDER BY v), '') FROM t WHERE pg_xact_commit_timestamp(xmin) <= '%s'", ts))
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// commitTime is row v's commit time (UTC, microseconds) on host.
func commitTime(t *testing.T, host, user, password string, v int) string {
	t.Helper()
	out, err := psql(t, host, user, password, fmt.Sprintf(`SELECT to_char(pg_xact_commit_timestamp(xmin) AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"') FROM t WHERE v = %d`, v))
	if err != nil || out == "" {
		t.Fatalf("row %d's commit time: %q, %v", v, out, err)
	}
	return out
}

// switchArchived closes the current WAL segment of the server at host
// and waits until it archived it, with no archive failure since its start.
func switchArchived(t *testing.T, host, user, password string) string {
	t.Helper()
	seg, err := psql(t, host, user, password, "SELECT pg_walfile_name(pg_switch_wal())")
	if err != nil {
		t.Fatal(err)
	}
	var last string
	if err := wait.PollUntilContextTimeout(context.Background(), 500*time.Millisecond, 2*time.Minute, true, func(context.Context) (bool, error) {
		last, err = psql(t, host, user, password, "SELECT coalesce(last_archived_wal, '') || ' failed=' || failed_count || ' ' || coalesce(last_failed_wal, '') FROM pg_stat_archiver")
		return err == nil && strings.Fields(last)[0] >= seg, nil
	}); err != nil {
		t.Fatalf("segment %s not archived within 2 minutes: pg_stat_archiver says %q", seg, last)
	}
	if f := strings.Fields(last); len(f) < 2 || f[1] != "failed=0" {
		t.Errorf("archive failures: %s", last)
	}
	return seg
}

// TestPointInTimeRecoveryOnRealPods: a Postgres 15 of two pods with
// failover and spec.backup.walArchive, as the operator (its pod on the
// real node) renders it, archives its WAL from the pods to a real S3
// server, encrypted for the Postgres's key, with no credential in the
// pod spec or postgresql.conf; the operator takes its first base backup
// itself. A writer inserts numbered rows through the read-write Service
// throughout; the primary's pod is deleted (its replacement held
// unscheduled) and the other takes over on a second timeline, which
// archives to the same place, its history file too. A Postgres applied
// with spec.bootstrap.recovery to a time between the base backup and the
// failover, and one to a time after it (two pods: the second clones the
// recovered first), each holds exactly the rows the live server has
// committed at or before that time, and answers its own Secret's
// superuser. With a WAL object deleted from the store, a recovery past it
// names the missing segment and its server never starts.
//
// Then a one-pod Postgres with archiveTimeout 5s under writes has its pod
// frozen, as if its volume and server were gone at once: a Postgres
// recovered to the end of its archive loses only rows acknowledged within
// the last archive timeout (and its upload) before the loss, which the
// test prints.
func TestPointInTimeRecoveryOnRealPods(t *testing.T) {
	ctx := context.Background()
	cs, dyn := clients(t)
	pgRepo, _ := postgresImages(t)
	s3dir, tenant := operatorWithStore(t, map[string]any{"postgresImage": pgRepo})
	id, err := age.GenerateX25519Identity()
	if err != nil {
		t.Fatal(err)
	}
	key := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: tenant, Name: "wal-key"}, StringData: map[string]string{"age": id.String()}}
	if _, err := cs.CoreV1().Secrets(tenant).Create(ctx, key, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	recoveryStore(t, tenant)
	spec := func(replicas int64, timeout string) map[string]any {
		return realNodePostgres(pgRepo, "15", map[string]any{
			"replicas":   replicas,
			"failover":   map[string]any{"enabled": true},
			"parameters": map[string]any{"track_commit_timestamp": "on"},
			"backup": map[string]any{"store": map[string]any{"name": "local"}, "schedule": "0 3 * * *",
				"encryption": map[string]any{"keySecretRef": map[string]any{"name": "wal-key", "key": "age"}},
				"walArchive": map[string]any{"archiveTimeout": timeout}},
		})
	}

	const name = "pitr"
	createThroughWebhook(t, dyn, postgresGVR, tenant, "Postgres", name, spec(2, "10s"))
	t.Cleanup(func() {
		if t.Failed() {
			logResource(t, backupStoreGVR, tenant, "local")
			logResource(t, postgresGVR, tenant, name)
			describeMembers(t, cs, tenant, name)
		}
	})
	waitReady(t, dyn, postgresGVR, tenant, name, "True", 8*time.Minute)
	// No credential in what the pods run: the store's Secrets by reference.
	sts, err := cs.AppsV1().StatefulSets(tenant).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	creds, err := cs.CoreV1().Secrets(tenant).Get(ctx, "s3-creds", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range sts.Spec.Template.Spec.Containers {
		for _, e := range c.Env {
			if strings.HasPrefix(e.Name, "CHARTPILOT_") && (e.Value != "" || e.ValueFrom == nil || e.ValueFrom.SecretKeyRef == nil) {
				t.Errorf("container %s: %s is not a Secret reference", c.Name, e.Name)
			}
		}
	}
	cm, err := cs.CoreV1().ConfigMaps(tenant).Get(ctx, name+"-config", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	conf := cm.Data["postgresql.conf"]
	for _, secret := range []string{string(creds.Data["secretAccessKey"]), string(creds.Data["accessKeyID"]), id.String()} {
		if strings.Contains(conf, secret) || strings.Contains(fmt.Sprint(sts.Spec), secret) {
			t.Fatal("a credential is in the rendered StatefulSet or postgresql.conf")
		}
	}
	if !strings.Contains(conf, "wal-push --via=") || !strings.Contains(conf, "restore_command") || !strings.Contains(conf, "archive_timeout = '10s'") {
		t.Fatalf("postgresql.conf does not archive as asked:\n%s", conf)
	}
	served := false
	for _, c := range sts.Spec.Template.Spec.Containers {
		if c.Name == "wal-agent" && strings.Contains(strings.Join(c.Command, " "), "--prefix="+tenant+"/"+name+"/pg15") {
			served = true
		}
	}
	if !served {
		t.Fatalf("no wal-agent container serves the archive %s/%s/pg15", tenant, name)
	}
	base := waitBaseBackup(t, tenant, name)

	user, password := superuser(t, cs, tenant, name)
	host := serviceIP(t, cs, tenant, name)
	if _, err := psql(t, host, user, password, "CREATE TABLE t (v int PRIMARY KEY)"); err != nil {
		t.Fatal(err)
	}
	w := startRowWriter(t, host, user, password, "postgres", 1)
	w.waitAcks(t, "150 rows", 3*time.Minute, func(a []ack) bool { return len(a) >= 150 })
	t1Row := w.snapshot()[100].v
	t1 := commitTime(t, host, user, password, t1Row)
	switchArchived(t, host, user, password)

	// The primary's pod deleted, its replacement held unscheduled: the
	// other member takes over.
	old, ok := primaryPod(cs, tenant, name)
	if !ok {
		t.Fatal("no one pod labelled primary")
	}
	oldServer := w.snapshot()[len(w.snapshot())-1].server
	// Its archiving stalls (its WAL service stopped, as a store that no
	// longer answers): the segments it closes from now on reach the
	// standby by streaming, but not the store, when it is lost.
	resume := stopWALService(t, string(old.UID))
	behind := unarchivedOnPrimary(t, host, user, password)
	untaint := holdScheduling(t, cs, old.Spec.NodeName)
	zero := int64(0)
	if err := cs.CoreV1().Pods(tenant).Delete(ctx, old.Name, metav1.DeleteOptions{GracePeriodSeconds: &zero}); err != nil {
		t.Fatal(err)
	}
	lost := time.Now()
	resume() // a stopped process dies of the pending SIGKILL at once
	var after []ack
	w.waitAcks(t, "30 rows acknowledged by a new primary", 4*time.Minute, func(acks []ack) bool {
		after = after[:0]
		for _, a := range acks {
			if a.server != oldServer && a.sent.After(lost) {
				after = append(after, a)
			}
		}
		return len(after) >= 30
	})
	untaint()
	newPrimary, ok := primaryPod(cs, tenant, name)
	if !ok || newPrimary.Name == old.Name {
		t.Fatalf("no other member took over from %s", old.Name)
	}
	t2Row := after[15].v
	t2 := commitTime(t, host, user, password, t2Row)
	seg := switchArchived(t, host, user, password)
	acks := w.halt()
	if !strings.HasPrefix(seg, "00000002") {
		t.Errorf("the new primary archived %s, not a segment of timeline 2", seg)
	}
	files := archived(s3dir, tenant, name)
	if !strings.Contains(strings.Join(files, " "), "00000002.history") {
		t.Errorf("the archive holds no history of timeline 2: %v", files)
	}
	// No gap: what the lost primary never archived, the standbys did.
	for _, seg := range behind {
		if !slices.Contains(files, seg) {
			t.Errorf("segment %s, closed but not archived by the lost primary, is not in the archive: %v", seg, files)
		}
	}
	t.Logf("segments the lost primary had not archived, archived by the standbys: %v", behind)
	// The new primary's archiving, as its instance manager reports it.
	var arch map[string]any
	if err := wait.PollUntilContextTimeout(ctx, 2*time.Second, 3*time.Minute, true, func(context.Context) (bool, error) {
		got := mustGet(t, dyn, postgresGVR, tenant, name)
		arch, _, _ = unstructured.NestedMap(got.Object, "status", "archiving")
		conds, _, _ := unstructured.NestedSlice(got.Object, "status", "conditions")
		archiving := false
		for _, c := range conds {
			if m, _ := c.(map[string]any); m["type"] == "ContinuousArchiving" && m["status"] == "True" {
				archiving = true
			}
		}
		return archiving && arch["state"] == "Archiving" && arch["member"] == newPrimary.Name, nil
	}); err != nil {
		t.Errorf("status.archiving %v, want Archiving reported by %s, and ContinuousArchiving True", arch, newPrimary.Name)
	}
	t.Logf("base backup %s; %d rows acknowledged; %d files archived; T1 %s (row %d), failover at %s, T2 %s (row %d)",
		base, len(acks), len(files), t1, t1Row, lost.UTC().Format(time.RFC3339Nano), t2, t2Row)

	for i, target := range []struct {
		at, what string
		replicas int64
	}{{t1, "between the base backup and the failover", 1}, {t2, "after the failover, on timeline 2", 2}} {
		want := rowsUpTo(t, host, user, password, target.at)
		var archive map[string]any
		if i == 1 { // the recovered server archives to an archive of its own
			archive = map[string]any{"backup": map[string]any{"store": map[string]any{"name": "local"}, "schedule": "0 3 * * *",
				"encryption": map[string]any{"keySecretRef": map[string]any{"name": "wal-key", "key": "age"}},
				"walArchive": map[string]any{"archiveTimeout": "5s"}}}
		}
		got, st := recoverThroughResource(t, pgRepo, tenant, fmt.Sprintf("to-%d", i+1), name, target.replicas, target.at, archive)
		if got != want {
			t.Errorf("recovered to %s (%s): %d rows, want %d:\n got …%s\nwant …%s\n%v", target.at, target.what,
				len(strings.Fields(got)), len(strings.Fields(want)), tail(got), tail(want), st)
		} else {
			t.Logf("recovered to %s (%s): exactly the %d rows committed by then; status.recovery %v", target.at, target.what, len(strings.Fields(got)), st)
		}
		if archive != nil {
			history := fmt.Sprintf("%08X.history", int64(st["timeline"].(int64)))
			if err := wait.PollUntilContextTimeout(ctx, 2*time.Second, 3*time.Minute, true, func(context.Context) (bool, error) {
				return slices.Contains(archived(s3dir, tenant, "to-2"), history), nil
			}); err != nil {
				t.Errorf("the recovered to-2 archived no %s below %s/to-2/pg15: %v", history, tenant, archived(s3dir, tenant, "to-2"))
			}
			if slices.Contains(archived(s3dir, tenant, name), history) {
				t.Errorf("%s, the recovered server's, is in the archive it was recovered from", history)
			}
		}
	}

	// Done with: fewer pods on the node for what follows.
	for _, n := range []string{"to-1", "to-2"} {
		if err := dyn.Resource(postgresGVR).Namespace(tenant).Delete(ctx, n, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
	}

	// A WAL object gone from the store: the recovery names it and its
	// server never starts.
	gone := deleteSegmentAfterBase(t, s3dir, tenant, name)
	gapSpec := realNodePostgres(pgRepo, "15", map[string]any{"failover": map[string]any{"enabled": true},
		"bootstrap": map[string]any{"recovery": recoverySpec(name, t2)}})
	createThroughWebhook(t, dyn, postgresGVR, tenant, "Postgres", "gap", gapSpec)
	var rec map[string]any
	if err := wait.PollUntilContextTimeout(ctx, 2*time.Second, 6*time.Minute, true, func(context.Context) (bool, error) {
		got := mustGet(t, dyn, postgresGVR, tenant, "gap")
		rec, _, _ = unstructured.NestedMap(got.Object, "status", "recovery")
		return rec["phase"] == "Failed" && strings.Contains(fmt.Sprint(rec["message"]), gone), nil
	}); err != nil {
		logResource(t, postgresGVR, tenant, "gap")
		t.Fatalf("status.recovery %v: want Failed, naming the deleted segment %s", rec, gone)
	}
	if p, err := cs.CoreV1().Pods(tenant).Get(ctx, "gap-0", metav1.GetOptions{}); err != nil || len(p.Status.ContainerStatuses) > 0 && p.Status.ContainerStatuses[0].State.Running != nil {
		t.Errorf("pod gap-0 (%v) runs its server after a failed recovery", err)
	}
	t.Logf("with %s deleted: %v", gone, rec["message"])
	if err := dyn.Resource(postgresGVR).Namespace(tenant).Delete(ctx, "gap", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}

	// The window: a second base backup (a physical Backup), then a prune
	// whose window begins after it ended: the first base backup and the
	// WAL before the second's start go, and a Postgres recovered to the
	// first point the window keeps holds every row committed by then.
	prunedWindow(t, s3dir, tenant, name, pgRepo, id.String(), func(at string) string { return rowsUpTo(t, host, user, password, at) })

	// Archiving that fails: a file of another server already where the
	// first segment goes. Status, condition and an event say so.
	stuckArchive(t, tenant, pgRepo)

	// A lost volume: one pod, frozen under writes.
	const solo = "solo"
	createThroughWebhook(t, dyn, postgresGVR, tenant, "Postgres", solo, spec(1, "5s"))
	waitReady(t, dyn, postgresGVR, tenant, solo, "True", 8*time.Minute)
	waitBaseBackup(t, tenant, solo)
	suser, spassword := superuser(t, cs, tenant, solo)
	shost := serviceIP(t, cs, tenant, solo)
	if _, err := psql(t, shost, suser, spassword, "CREATE TABLE t (v int PRIMARY KEY)"); err != nil {
		t.Fatal(err)
	}
	sw := startRowWriter(t, shost, suser, spassword, "postgres", 1)
	// Long enough for archive_timeout to have switched segments several times.
	time.Sleep(30 * time.Second)
	pod := onlyPod(t, cs, tenant, solo)
	thaw := freezePod(t, string(pod.UID))
	lostAt := time.Now()
	sacks := sw.halt()
	// The store's Secret goes, so that a container the kubelet restarts
	// could not archive what the "lost" volume still holds; the frozen
	// server stays frozen until the recovery is done (which reads through
	// the other store, with its own copy of the credentials).
	if err := cs.CoreV1().Secrets(tenant).Delete(ctx, "s3-creds", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	got, _ := recoverThroughResource(t, pgRepo, tenant, "solo-end", solo, 1, "", nil)
	thaw()
	var lostRows []ack
	have := map[string]bool{}
	for _, f := range strings.Fields(got) {
		have[f] = true
	}
	for _, a := range sacks {
		if !have[strconv.Itoa(a.v)] {
			lostRows = append(lostRows, a)
		}
	}
	window := 0.0
	if len(lostRows) > 0 {
		window = lostAt.Sub(lostRows[0].at).Seconds()
	}
	t.Logf("volume lost under writes: %d of %d acknowledged rows lost, acknowledged in the last %.1f s before the loss (archive_timeout 5 s)",
		len(lostRows), len(sacks), window)
	report(t, "pitr-loss", map[string]any{"acknowledged": len(sacks), "lost": len(lostRows), "lostWindowSeconds": window, "archiveTimeoutSeconds": 5})
	// Bound: archive_timeout, plus the upload and the writer's own gap.
	if window > 5+5 {
		t.Errorf("rows acknowledged %.1f s before the loss are lost: more than archive_timeout (5 s) and an upload", window)
	}
	if len(strings.Fields(got)) < len(sacks)/2 {
		t.Errorf("the recovery holds %d of %d acknowledged rows", len(strings.Fields(got)), len(sacks))
	}
}

// stopWALService stops (SIGSTOP) the WAL service of pod uid, chartpilot
// wal-serve in its wal-agent container, and returns what resumes it
// (SIGCONT; at the end of the test at the latest).
func stopWALService(t *testing.T, uid string) func() {
	t.Helper()
	procs, _ := filepath.Glob("/proc/[0-9]*/cgroup")
	want := strings.ReplaceAll(uid, "-", "_")
	pid := 0
	for _, f := range procs {
		cg, err := os.ReadFile(f)
		if err != nil || (!strings.Contains(string(cg), uid) && !strings.Contains(string(cg), want)) {
			continue
		}
		n, _ := strconv.Atoi(strings.TrimSuffix(strings.TrimPrefix(f, "/proc/"), "/cgroup"))
		cmd, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", n))
		if args := strings.Split(string(cmd), "\x00"); len(args) > 1 && filepath.Base(args[0]) == "chartpilot" && args[1] == "wal-serve" {
			pid = n
		}
	}
	if pid == 0 {
		t.Fatalf("no chartpilot wal-serve of pod %s on this machine", uid)
	}
	if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	var once sync.Once
	resume := func() { once.Do(func() { _ = syscall.Kill(pid, syscall.SIGCONT) }) }
	t.Cleanup(resume)
	return resume
}

// unarchivedOnPrimary has the primary at host close two segments (the
// writer writes throughout), waits until its standbys replayed past them,
// and returns the closed segments its archiver has not stored.
func unarchivedOnPrimary(t *testing.T, host, user, password string) []string {
	t.Helper()
	var segs []string
	for range 2 {
		seg, err := psql(t, host, user, password, "SELECT pg_walfile_name(pg_switch_wal())")
		if err != nil {
			t.Fatal(err)
		}
		segs = append(segs, seg)
		time.Sleep(time.Second)
	}
	lsn, err := psql(t, host, user, password, "SELECT pg_current_wal_lsn()")
	if err != nil {
		t.Fatal(err)
	}
	if err := wait.PollUntilContextTimeout(context.Background(), 500*time.Millisecond, 2*time.Minute, true, func(context.Context) (bool, error) {
		out, err := psql(t, host, user, password, fmt.Sprintf("SELECT count(*) > 0 AND bool_and(replay_lsn >= '%s') FROM pg_stat_replication", lsn))
		return err == nil && out == "t", nil
	}); err != nil {
		t.Fatalf("the standby did not replay up to %s within 2 minutes", lsn)
	}
	last, err := psql(t, host, user, password, "SELECT coalesce(last_archived_wal, '') FROM pg_stat_archiver")
	if err != nil {
		t.Fatal(err)
	}
	var behind []string
	for _, seg := range segs {
		if seg > last {
			behind = append(behind, seg)
		}
	}
	if len(behind) == 0 {
		t.Fatalf("the primary archived %s with its WAL service stopped", last)
	}
	return behind
}

// openArchive opens the archive of Postgres name (major 15) in store
// "local" of tenant, as the agent does, with key ageKey.
func openArchive(t *testing.T, tenant, name, ageKey string) *wal.Archive {
	t.Helper()
	cs, dyn := clients(t)
	local := mustGet(t, dyn, backupStoreGVR, tenant, "local")
	s3, _ := local.Object["spec"].(map[string]any)["s3"].(map[string]any)
	creds, err := cs.CoreV1().Secrets(tenant).Get(context.Background(), "s3-creds", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	b, err := blobstore.OpenS3(context.Background(), backup.S3{Endpoint: s3["endpoint"].(string), Bucket: s3["bucket"].(string), Prefix: s3["prefix"].(string),
		ForcePathStyle: true, AccessKeyID: string(creds.Data["accessKeyID"]), SecretAccessKey: string(creds.Data["secretAccessKey"])})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	return &wal.Archive{Bucket: b, Prefix: tenant + "/" + name + "/pg15", Identity: ageKey}
}

// prunedWindow takes a second base backup of Postgres name through a
// physical Backup, prunes its archive (as the prune Job does) to a window
// that begins after that backup ended, checks that the older base backup
// and the segments before the newer one's start are gone, and recovers a
// new Postgres to the first point the window keeps: it holds what want
// says was committed by then.
func prunedWindow(t *testing.T, s3dir, tenant, name, pgRepo, ageKey string, want func(at string) string) {
	t.Helper()
	ctx := context.Background()
	_, dyn := clients(t)
	createThroughWebhook(t, dyn, backupGVR, tenant, "Backup", name+"-second", map[string]any{
		"target": map[string]any{"kind": "Postgres", "name": name}, "store": map[string]any{"name": "local"}, "method": "physical"})
	waitBackupCompleted(t, tenant, name+"-second")
	arch := openArchive(t, tenant, name, ageKey)
	bases, err := arch.Bases(ctx)
	if err != nil || len(bases) < 2 {
		t.Fatalf("base backups of %s: %d, %v; want two", name, len(bases), err)
	}
	start := bases[0].Manifest.Labels[wal.LabelStartSegment] // newest first
	time.Sleep(2 * time.Second)
	pr, err := arch.Prune(ctx, time.Second, time.Now())
	if err != nil || len(pr.Bases) != len(bases)-1 || pr.Files == 0 {
		t.Fatalf("prune: %+v, %v; want %d base backups and the WAL before the newest's start deleted", pr, err, len(bases)-1)
	}
	for _, f := range archived(s3dir, tenant, name) {
		if len(f) == 24 && f < start {
			t.Errorf("segment %s, older than the kept base backup's start %s, is still in the archive", f, start)
		}
	}
	w, err := arch.Window(ctx)
	if err != nil || w.Bases != 1 || w.First.IsZero() {
		t.Fatalf("the window after the prune: %+v, %v", w, err)
	}
	first := w.First.UTC().Format(time.RFC3339Nano)
	rows := want(first)
	got, st := recoverThroughResource(t, pgRepo, tenant, "window-first", name, 1, first, nil)
	if got != rows {
		t.Errorf("recovered to the window's first point %s: %d rows, want %d (…%s, want …%s)", first, len(strings.Fields(got)), len(strings.Fields(rows)), tail(got), tail(rows))
	}
	t.Logf("pruned %d base backups and %d WAL files; recovered to the window's first point %s: %d rows; status.recovery %v", len(pr.Bases), pr.Files, first, len(strings.Fields(got)), st["message"])
}

// stuckArchive applies a one-pod Postgres "stuck" whose archive already
// holds, under the name of the first segment it archives, a file of other
// content: its archiving fails (the archive never overwrites a file), and
// status.archiving (Failing, naming the file), the ContinuousArchiving
// condition (False, ArchiveFailing) and a WALArchiveFailing event on its
// pod say so.
func stuckArchive(t *testing.T, tenant, pgRepo string) {
	t.Helper()
	ctx := context.Background()
	cs, dyn := clients(t)
	const name, first = "stuck", "000000010000000000000001"
	archive := openArchive(t, tenant, name, "")
	if err := archive.Bucket.WriteAll(ctx, archive.Key(first), []byte("another server's file"), nil); err != nil {
		t.Fatal(err)
	}
	createThroughWebhook(t, dyn, postgresGVR, tenant, "Postgres", name, realNodePostgres(pgRepo, "15", map[string]any{
		"failover": map[string]any{"enabled": true},
		"backup": map[string]any{"store": map[string]any{"name": "local"}, "schedule": "0 3 * * *",
			"walArchive": map[string]any{"archiveTimeout": "5s"}}}))
	var arch map[string]any
	var cond string
	if err := wait.PollUntilContextTimeout(ctx, 2*time.Second, 6*time.Minute, true, func(context.Context) (bool, error) {
		got := mustGet(t, dyn, postgresGVR, tenant, name)
		arch, _, _ = unstructured.NestedMap(got.Object, "status", "archiving")
		conds, _, _ := unstructured.NestedSlice(got.Object, "status", "conditions")
		cond = ""
		for _, c := range conds {
			if m, _ := c.(map[string]any); m["type"] == "ContinuousArchiving" {
				cond = fmt.Sprint(m["status"], " ", m["reason"])
			}
		}
		return arch["state"] == "Failing" && strings.Contains(fmt.Sprint(arch["message"]), first) && cond == "False ArchiveFailing", nil
	}); err != nil {
		logResource(t, postgresGVR, tenant, name)
		t.Fatalf("status.archiving %v, ContinuousArchiving %q: want Failing naming %s, and False ArchiveFailing", arch, cond, first)
	}
	if n := eventCounts(t, cs, tenant, name+"-0", "WALArchiveFailing"); len(n) == 0 {
		t.Errorf("no WALArchiveFailing event on pod %s-0", name)
	}
	t.Logf("archiving that fails: %v", arch["message"])
}

// recoveryStore makes BackupStore "recovery" of tenant: the S3 server of
// store "local", with a copy of its credentials of its own, so that the
// recoveries read the archives whatever becomes of "local"'s Secret.
func recoveryStore(t *testing.T, tenant string) {
	t.Helper()
	ctx := context.Background()
	cs, dyn := clients(t)
	creds, err := cs.CoreV1().Secrets(tenant).Get(ctx, "s3-creds", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	cp := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: tenant, Name: "s3-recovery"}, Data: creds.Data}
	if _, err := cs.CoreV1().Secrets(tenant).Create(ctx, cp, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	local := mustGet(t, dyn, backupStoreGVR, tenant, "local")
	s3, _ := local.Object["spec"].(map[string]any)["s3"].(map[string]any)
	s3 = runtime.DeepCopyJSON(s3)
	s3["credentialsSecretRef"] = map[string]any{"name": "s3-recovery"}
	createThroughWebhook(t, dyn, backupStoreGVR, tenant, "BackupStore", "recovery", map[string]any{"s3": s3})
	waitReady(t, dyn, backupStoreGVR, tenant, "recovery", "True", 3*time.Minute)
}

// recoverySpec is spec.bootstrap.recovery from source's archive, through
// store "recovery", to target ("": the end of the archive).
func recoverySpec(source, target string) map[string]any {
	r := map[string]any{"source": source, "store": map[string]any{"name": "recovery"},
		"encryption": map[string]any{"keySecretRef": map[string]any{"name": "wal-key", "key": "age"}}}
	if target != "" {
		r["targetTime"] = target
	}
	return r
}

// recoverThroughResource applies Postgres name recovered from source's
// archive to target, waits until it is Ready with status.recovery
// Completed, and returns the values of its table t (in order, separated
// by spaces, read as its own Secret's superuser) and status.recovery.
// extra fields are added to its spec.
func recoverThroughResource(t *testing.T, pgRepo, tenant, name, source string, replicas int64, target string, extra map[string]any) (string, map[string]any) {
	t.Helper()
	cs, dyn := clients(t)
	fields := map[string]any{"replicas": replicas, "failover": map[string]any{"enabled": true},
		"bootstrap": map[string]any{"recovery": recoverySpec(source, target)}}
	for k, v := range extra {
		fields[k] = v
	}
	spec := realNodePostgres(pgRepo, "15", fields)
	createThroughWebhook(t, dyn, postgresGVR, tenant, "Postgres", name, spec)
	t.Cleanup(func() {
		if t.Failed() {
			logResource(t, postgresGVR, tenant, name)
			describeMembers(t, cs, tenant, name)
		}
	})
	waitReady(t, dyn, postgresGVR, tenant, name, "True", 10*time.Minute)
	var rec map[string]any
	if err := wait.PollUntilContextTimeout(context.Background(), 2*time.Second, 3*time.Minute, true, func(context.Context) (bool, error) {
		rec, _, _ = unstructured.NestedMap(mustGet(t, dyn, postgresGVR, tenant, name).Object, "status", "recovery")
		return rec["phase"] == "Completed", nil
	}); err != nil {
		t.Fatalf("Postgres %s: status.recovery %v, want Completed", name, rec)
	}
	user, password := superuser(t, cs, tenant, name)
	rows, err := psql(t, serviceIP(t, cs, tenant, name), user, password, "SELECT coalesce(string_agg(v::text, ' ' ORDER BY v), '') FROM t")
	if err != nil {
		t.Fatalf("Postgres %s as its own superuser: %v", name, err)
	}
	if replicas > 1 {
		if err := wait.PollUntilContextTimeout(context.Background(), 2*time.Second, 5*time.Minute, true, func(context.Context) (bool, error) {
			sts, err := cs.AppsV1().StatefulSets(tenant).Get(context.Background(), name, metav1.GetOptions{})
			return err == nil && sts.Status.ReadyReplicas == int32(replicas), nil
		}); err != nil {
			t.Fatalf("Postgres %s: not every member of %d ready after the recovery", name, replicas)
		}
	}
	return rows, rec
}

// waitBaseBackup waits until the operator took a base backup of Postgres
// name (status.backup.lastBaseBackup) and returns its Backup's name.
func waitBaseBackup(t *testing.T, tenant, name string) string {
	t.Helper()
	_, dyn := clients(t)
	var last string
	if err := wait.PollUntilContextTimeout(context.Background(), 2*time.Second, 6*time.Minute, true, func(context.Context) (bool, error) {
		last, _, _ = unstructured.NestedString(mustGet(t, dyn, postgresGVR, tenant, name).Object, "status", "backup", "lastBaseBackup")
		return last != "", nil
	}); err != nil {
		t.Fatalf("Postgres %s: no base backup taken by the operator within 6 minutes", name)
	}
	return last
}

// deleteSegmentAfterBase deletes, from the S3 server's directory, the
// segment of timeline 1 right after the one Postgres name's first base
// backup started in, and returns its name.
func deleteSegmentAfterBase(t *testing.T, s3dir, tenant, name string) string {
	t.Helper()
	dir := ""
	start := ""
	_ = filepath.WalkDir(filepath.Join(s3dir, "data"), func(p string, d fs.DirEntry, err error) error {
		if err == nil && !d.IsDir() && strings.HasSuffix(filepath.Dir(p), filepath.Join(tenant, name, "pg15", "wal")) && strings.HasSuffix(d.Name(), ".backup") && strings.HasPrefix(d.Name(), "00000001") {
			if start == "" || d.Name()[:24] < start {
				start, dir = d.Name()[:24], filepath.Dir(p)
			}
		}
		return nil
	})
	if start == "" {
		t.Fatal("no backup history file of timeline 1 in the archive")
	}
	n, err := strconv.ParseUint(start[16:], 16, 32)
	if err != nil {
		t.Fatal(err)
	}
	next := fmt.Sprintf("%s%08X", start[:16], n+1)
	if err := os.Remove(filepath.Join(dir, next)); err != nil {
		t.Fatalf("deleting segment %s: %v", next, err)
	}
	return next
}

// tail is the last values of a space-separated list.
func tail(s string) string {
	f := strings.Fields(s)
	return strings.Join(f[max(0, len(f)-8):], " ")
}

// freezePod freezes every process of pod uid at once (the freezer cgroup
// of the real node's pods on this machine) and returns what thaws them.
func freezePod(t *testing.T, uid string) func() {
	t.Helper()
	var dir string
	under := strings.ReplaceAll(uid, "-", "_")
	_ = filepath.WalkDir("/sys/fs/cgroup/freezer", func(p string, d fs.DirEntry, err error) error {
		if err != nil || !d.IsDir() || dir != "" {
			return nil
		}
		if b := filepath.Base(p); strings.Contains(b, uid) || strings.Contains(b, under) {
			dir = p
			return filepath.SkipDir
		}
		return nil
	})
	if dir == "" {
		t.Fatalf("no freezer cgroup of pod %s", uid)
	}
	state := filepath.Join(dir, "freezer.state")
	if err := os.WriteFile(state, []byte("FROZEN"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := wait.PollUntilContextTimeout(context.Background(), 50*time.Millisecond, 30*time.Second, true, func(context.Context) (bool, error) {
		b, _ := os.ReadFile(state)
		return strings.TrimSpace(string(b)) == "FROZEN", nil
	}); err != nil {
		t.Fatalf("pod %s not frozen", uid)
	}
	thawed := false
	thaw := func() {
		if !thawed {
			thawed = true
			_ = os.WriteFile(state, []byte("THAWED"), 0o644)
		}
	}
	t.Cleanup(thaw)
	return thaw
}
