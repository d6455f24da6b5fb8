package wal_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"filippo.io/age"

	"github.com/chartpilot/chartpilot/internal/agent/blobstore"
	"github.com/chartpilot/chartpilot/internal/agent/wal"
	"github.com/chartpilot/chartpilot/internal/backup"
	"github.com/chartpilot/chartpilot/internal/backup/backuptest"
	"github.com/chartpilot/chartpilot/internal/testing/testpg"
)

// pitr is one test's world: the agent binary, an S3 server, an archive
// prefix in it, and the environment the agent reads its secrets from.
type pitr struct {
	t      *testing.T
	r      *testpg.Runner
	agent  string
	s3     backup.S3
	prefix string
	env    map[string]string
	dir    string
}

func newPITR(t *testing.T) *pitr {
	t.Helper()
	if testing.Short() {
		t.Skip("real PostgreSQL servers and an S3 server")
	}
	r := testpg.NewRunner(t, testpg.Bin(t))
	dir := r.TempDir(t)
	agent := filepath.Join(dir, "chartpilot")
	if out, err := exec.Command("go", "build", "-o", agent, "../../../cmd/chartpilot").CombinedOutput(); err != nil {
		t.Fatalf("building the agent: %v\n%s", err, out)
	}
	id, err := age.GenerateX25519Identity()
	if err != nil {
		t.Fatal(err)
	}
	s3 := backuptest.StartS3(t, t.TempDir())
	return &pitr{t: t, r: r, agent: agent, s3: s3, prefix: "shop/orders", dir: dir, env: map[string]string{
		"CHARTPILOT_S3_ACCESS_KEY_ID":     s3.AccessKeyID,
		"CHARTPILOT_S3_SECRET_ACCESS_KEY": s3.SecretAccessKey,
		"CHARTPILOT_AGE_KEY":              id.String(),
	}}
}

// storeArgs are the agent's flags naming the store and the archive.
func (p *pitr) storeArgs() []string {
	return []string{"--store=s3", "--s3-endpoint=" + p.s3.Endpoint, "--s3-bucket=" + p.s3.Bucket, "--s3-prefix=" + p.s3.Prefix,
		"--s3-force-path-style", "--prefix=" + p.prefix}
}

// archive opens the archive as the test (no agent).
func (p *pitr) archive() *wal.Archive {
	b, err := blobstore.OpenS3(context.Background(), p.s3)
	if err != nil {
		p.t.Fatal(err)
	}
	p.t.Cleanup(func() { b.Close() })
	return &wal.Archive{Bucket: b, Prefix: p.prefix, Identity: p.env["CHARTPILOT_AGE_KEY"]}
}

// archiveOptions are the server settings that archive to the store.
func (p *pitr) archiveOptions() []string {
	return []string{"archive_mode=on", "archive_command=" + p.agent + " wal-push " + strings.Join(p.storeArgs(), " ") + " %p",
		"archive_timeout=60", "track_commit_timestamp=on", "wal_level=replica", "max_wal_senders=4"}
}

// server is a running PostgreSQL server of the test.
type server struct {
	p    *pitr
	data string
	port int
	cmd  *exec.Cmd
	log  string
}

// start runs postgres on data with the archive settings.
func (p *pitr) start(name, data string) *server {
	p.t.Helper()
	s := &server{p: p, data: data, port: testpg.FreePort(p.t), log: filepath.Join(p.dir, name+".log")}
	args := []string{"-D", data, "-c", "listen_addresses=127.0.0.1", "-c", fmt.Sprintf("port=%d", s.port),
		"-c", "unix_socket_directories=" + p.dir, "-c", "fsync=off"}
	for _, o := range p.archiveOptions() {
		args = append(args, "-c", o)
	}
	s.cmd = p.r.Command(p.env, "postgres", args...)
	log, err := os.OpenFile(s.log, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		p.t.Fatal(err)
	}
	p.t.Cleanup(func() { log.Close() })
	s.cmd.Stdout, s.cmd.Stderr = log, log
	if err := s.cmd.Start(); err != nil {
		p.t.Fatal(err)
	}
	p.t.Cleanup(s.stop)
	deadline := time.Now().Add(2 * time.Minute)
	for p.r.Command(nil, "pg_isready", "-h", "127.0.0.1", "-p", strconv.Itoa(s.port)).Run() != nil {
		if time.Now().After(deadline) {
			b, _ := os.ReadFile(s.log)
			p.t.Fatalf("%s not ready within 2 minutes:\n%s", name, b)
		}
		time.Sleep(200 * time.Millisecond)
	}
	return s
}

func (s *server) stop() {
	if s.cmd != nil && s.cmd.ProcessState == nil {
		testpg.StopServer(s.cmd)
	}
}

func (s *server) env() map[string]string {
	env := map[string]string{"PGHOST": "127.0.0.1", "PGPORT": strconv.Itoa(s.port), "PGUSER": "postgres", "PGDATABASE": "postgres"}
	for k, v := range s.p.env {
		env[k] = v
	}
	return env
}

func (s *server) query(sql string) string {
	s.p.t.Helper()
	cmd := s.p.r.Command(s.env(), "psql", "-XAtq", "-v", "ON_ERROR_STOP=1", "-c", sql)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Run(); err != nil {
		s.p.t.Fatalf("psql %q: %v: %s", sql, err, errb.String())
	}
	return strings.TrimSpace(out.String())
}

// insert adds rows from..to, one transaction each, a few milliseconds
// apart, so that commit timestamps tell them apart.
func (s *server) insert(from, to int) {
	s.p.t.Helper()
	s.query(fmt.Sprintf(`do $$ begin for i in %d..%d loop insert into numbered values (i); commit; perform pg_sleep(0.002); end loop; end $$`, from, to))
}

// switchAndWait closes the current segment and waits until the server
// archived it.
func (s *server) switchAndWait() {
	s.p.t.Helper()
	seg := s.query(`select pg_walfile_name(pg_switch_wal())`)
	deadline := time.Now().Add(2 * time.Minute)
	for {
		last := s.query(`select coalesce(last_archived_wal, '') from pg_stat_archiver`)
		if last >= seg {
			return
		}
		if time.Now().After(deadline) {
			b, _ := os.ReadFile(s.log)
			s.p.t.Fatalf("segment %s not archived within 2 minutes (last archived %q):\n%s", seg, last, b)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// agentRun runs the agent as the servers' user.
func (p *pitr) agentRun(env map[string]string, args ...string) (string, error) {
	cmd := p.r.Command(env, p.agent, args...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	return out.String(), err
}

// recoverTo restores into a new data directory with the agent.
func (p *pitr) recoverTo(name string, target ...string) (string, string, error) {
	data := filepath.Join(p.dir, name)
	args := append([]string{"recover", "--data-dir=" + data}, p.storeArgs()...)
	args = append(args, target...)
	for _, o := range p.archiveOptions() {
		args = append(args, "--postgres-option="+o)
	}
	out, err := p.agentRun(p.env, args...)
	return data, out, err
}

// TestPointInTimeRecovery archives a server's WAL to a real S3 server
// through the agent, takes a base backup, and restores to a time in the
// middle of the WAL after it: exactly the rows committed at or before
// the time are there. The restored server, on a second timeline, archives
// to the same place; a restore to a time on that timeline holds the first
// server's rows up to the switch and the second's up to the time. A
// segment deleted from the store is named, and nothing promotes past it.
func TestPointInTimeRecovery(t *testing.T) {
	p := newPITR(t)
	dataA := filepath.Join(p.dir, "a")
	if out, err := p.r.Command(nil, "initdb", "-D", dataA, "-U", "postgres", "--auth=trust", "-E", "UTF8").CombinedOutput(); err != nil {
		t.Fatalf("initdb: %v\n%s", err, out)
	}
	a := p.start("a", dataA)
	a.query(`create table numbered (id int primary key)`)
	a.insert(1, 50)

	out, err := p.agentRun(a.env(), append([]string{"base-backup"}, p.storeArgs()...)...)
	if err != nil {
		t.Fatalf("base-backup: %v\n%s", err, out)
	}
	t.Logf("base backup: %s", strings.TrimSpace(out))
	// Segments of their own: the base backup's last, 51..150, 151..250
	// (and T), 251..400.
	a.insert(51, 150)
	a.switchAndWait()
	a.insert(151, 250)
	a.switchAndWait()
	a.insert(251, 400)
	a.switchAndWait()

	// T is row 250's commit time: rows 1..250 committed at or before it.
	tA := a.query(`select to_char(pg_xact_commit_timestamp(xmin) at time zone 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"') from numbered where id = 250`)
	wantA := a.query(fmt.Sprintf(`select string_agg(id::text, ',' order by id) from numbered where pg_xact_commit_timestamp(xmin) <= '%s'`, tA))
	if !strings.HasSuffix(wantA, ",250") {
		t.Fatalf("rows committed at or before %s end %q, not at row 250", tA, wantA[max(0, len(wantA)-20):])
	}
	dataB, out, err := p.recoverTo("b", "--target-time="+tA)
	if err != nil {
		t.Fatalf("recover to %s: %v\n%s", tA, err, out)
	}
	t.Logf("recover to %s: %s", tA, strings.TrimSpace(out))
	b := p.start("b", dataB)
	if got := b.query(`select string_agg(id::text, ',' order by id) from numbered`); got != wantA {
		t.Fatalf("restored to %s: rows %s…, want %s… (%d and %d rows)", tA, clip(got), clip(wantA), strings.Count(got, ",")+1, strings.Count(wantA, ",")+1)
	}
	if tli := b.query(`select timeline_id from pg_control_checkpoint()`); tli != "2" {
		t.Fatalf("the restored server is on timeline %s, want 2", tli)
	}

	// A second timeline: b writes and archives beside a, which goes on.
	b.insert(1001, 1100)
	b.switchAndWait()
	a.insert(401, 420)
	a.switchAndWait()
	tB := b.query(`select to_char(pg_xact_commit_timestamp(xmin) at time zone 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"') from numbered where id = 1050`)
	wantB := b.query(fmt.Sprintf(`select string_agg(id::text, ',' order by id) from numbered where id <= 250 or (id > 1000 and pg_xact_commit_timestamp(xmin) <= '%s')`, tB))
	dataC, out, err := p.recoverTo("c", "--target-time="+tB)
	if err != nil {
		t.Fatalf("recover to %s on timeline 2: %v\n%s", tB, err, out)
	}
	c := p.start("c", dataC)
	if got := c.query(`select string_agg(id::text, ',' order by id) from numbered`); got != wantB {
		t.Fatalf("restored to %s on timeline 2: rows %s, want %s", tB, clip(got), clip(wantB))
	}
	if !strings.Contains(wantB, ",1050") || strings.Contains(wantB, ",251,") {
		t.Fatalf("the expected rows of timeline 2 are wrong: %s", clip(wantB))
	}
	c.stop()
	b.stop()

	// A gap: a segment of timeline 1 between the base backup and the
	// switch deleted from the store.
	arch := p.archive()
	plan, err := arch.Plan(context.Background(), wal.Target{}, "")
	if err != nil || plan.Gap != "" {
		t.Fatalf("the archive before the deletion: gap %q, %v", planGap(plan), err)
	}
	gap := wal.Segment{TLI: 1, No: plan.Stop.No + 1}.Name(wal.DefaultSegmentSize)
	if err := arch.Bucket.Delete(context.Background(), arch.Key(gap)); err != nil {
		t.Fatalf("deleting %s: %v", gap, err)
	}
	_, out, err = p.recoverTo("d")
	if err == nil || !strings.Contains(out, "gap") || !strings.Contains(out, gap) {
		t.Fatalf("recovery to the end of an archive without %s: %v\n%s", gap, err, out)
	}
	t.Logf("end of the archive with a gap: %s", lastLine(out))
	dataE, out, err := p.recoverTo("e", "--target-time="+tB)
	if err == nil || !strings.Contains(out, gap) || !strings.Contains(out, "recovery ended before configured recovery target was reached") {
		t.Fatalf("recovery to %s past the gap at %s: %v\n%s", tB, gap, err, out)
	}
	t.Logf("a time past the gap: %s", lastLine(out))
	if _, err := os.Stat(filepath.Join(dataE, "recovery.signal")); err != nil {
		t.Fatalf("the refused recovery's data directory was promoted (no recovery.signal): %v", err)
	}

	// The window, and a prune that keeps it: the one base backup stays,
	// the segment before its start goes.
	out, err = p.agentRun(p.env, append([]string{"wal-status"}, p.storeArgs()...)...)
	if err != nil || !strings.Contains(out, `"Bases":1`) || !strings.Contains(out, `"LastWAL":"0000000`) {
		t.Fatalf("wal-status: %v\n%s", err, out)
	}
	out, err = p.agentRun(p.env, append([]string{"wal-prune", "--recovery-window=7d"}, p.storeArgs()...)...)
	if err != nil || !strings.Contains(out, "pruned 1 WAL files") {
		t.Fatalf("wal-prune: %v\n%s", err, out)
	}
	if _, err := arch.Read(context.Background(), "000000010000000000000001"); !errors.Is(err, wal.ErrNotFound) {
		t.Fatalf("the segment before the only base backup after pruning: %v", err)
	}
}

func planGap(p *wal.Plan) string {
	if p == nil {
		return ""
	}
	return p.Gap
}

func clip(s string) string {
	if len(s) > 80 {
		return s[:40] + "…" + s[len(s)-40:]
	}
	return s
}

func lastLine(s string) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return lines[len(lines)-1]
}
