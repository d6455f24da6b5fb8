package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"filippo.io/age"

	"github.com/chartpilot/chartpilot/internal/backup/backuptest"
	"github.com/chartpilot/chartpilot/internal/testing/testpg"
)

// pitrResult is the point-in-time recovery table: a server archiving its
// WAL through chartpilot's agent to a real S3 server (versitygw),
// encrypted, under a bulk load and under steady writes; a base backup of
// it; and a recovery of the whole archive.
type pitrResult struct {
	dbMB, walMB        float64
	load, archived     time.Duration // the bulk load; until its WAL was all archived
	base               time.Duration
	baseStoredMB       float64
	lag                []float64 // seconds, sampled once a second under steady writes
	lagTimeout         int       // archive_timeout, seconds
	recovery           time.Duration
	recoveredWAL       float64 // MiB of WAL replayed after the base backup
	rowsBig, rowsSteps string
}

// runPITRBench measures the archive's throughput, a base backup, the
// recovery-point lag and a recovery, on a database of about mb MiB.
func runPITRBench(root string, mb int) (*pitrResult, error) {
	t := &benchT{}
	defer t.done()
	r := testpg.NewRunner(t, testpg.Bin(t))
	dir := r.TempDir(t)
	agent := filepath.Join(dir, "chartpilot")
	build := exec.Command("go", "build", "-o", agent, "./cmd/chartpilot")
	build.Dir = root
	if out, err := build.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("building the agent: %v\n%s", err, out)
	}
	if err := os.Chmod(dir, 0o755); err != nil {
		return nil, err
	}
	s3 := backuptest.StartS3(t, filepath.Join(dir, "s3"))
	id, err := age.GenerateX25519Identity()
	if err != nil {
		return nil, err
	}
	env := map[string]string{"CHARTPILOT_S3_ACCESS_KEY_ID": s3.AccessKeyID, "CHARTPILOT_S3_SECRET_ACCESS_KEY": s3.SecretAccessKey,
		"CHARTPILOT_AGE_KEY": id.String()}
	store := []string{"--store=s3", "--s3-endpoint=" + s3.Endpoint, "--s3-bucket=" + s3.Bucket, "--s3-prefix=" + s3.Prefix,
		"--s3-force-path-style", "--prefix=bench/pg"}
	const timeout = 5
	pg := testpg.StartWith(t, env, "archive_mode=on", "archive_command="+agent+" wal-push "+strings.Join(store, " ")+" %p",
		fmt.Sprintf("archive_timeout=%d", timeout), "wal_level=replica", "max_wal_senders=4", "max_wal_size=4GB")
	res := &pitrResult{lagTimeout: timeout}
	q := func(db, sql string) string { return pg.Query(t, db, sql) }
	archivedUpTo := func(what string) error {
		seg := q("postgres", "select pg_walfile_name(pg_switch_wal())")
		deadline := time.Now().Add(30 * time.Minute)
		for q("postgres", "select coalesce(last_archived_wal, '') from pg_stat_archiver") < seg {
			if time.Now().After(deadline) {
				return fmt.Errorf("%s: segment %s not archived within 30 minutes (%s)", what, seg,
					q("postgres", "select failed_count || ' failures, last ' || coalesce(last_failed_wal, '-') from pg_stat_archiver"))
			}
			time.Sleep(200 * time.Millisecond)
		}
		return nil
	}

	// The bulk load, archived as it goes.
	lsn0 := q("postgres", "select pg_current_wal_lsn()")
	start := time.Now()
	logf("pitr: filling a database of about %d MiB, its WAL archived", mb)
	res.dbMB = fillBig(t, pg, mb)
	res.load = time.Since(start)
	walBytes, _ := strconv.ParseFloat(q("postgres", fmt.Sprintf("select pg_wal_lsn_diff(pg_current_wal_lsn(), '%s')", lsn0)), 64)
	res.walMB = walBytes / (1 << 20)
	if err := archivedUpTo("the bulk load"); err != nil {
		return nil, err
	}
	res.archived = time.Since(start)
	logf("pitr: %.0f MiB of WAL archived in %.1f s", res.walMB, res.archived.Seconds())

	// A base backup through the agent.
	start = time.Now()
	bb := r.Command(merge(env, pg.Env("postgres")), agent, append([]string{"base-backup"}, store...)...)
	var out, errb bytes.Buffer
	bb.Stdout, bb.Stderr = &out, &errb
	if err := bb.Run(); err != nil {
		return nil, fmt.Errorf("base-backup: %v: %s", err, errb.String())
	}
	res.base = time.Since(start)
	var m struct{ Size int64 }
	if err := json.Unmarshal(out.Bytes(), &m); err != nil {
		return nil, fmt.Errorf("base-backup's manifest %q: %w", out.String(), err)
	}
	res.baseStoredMB = float64(m.Size) / (1 << 20)
	logf("pitr: base backup in %.1f s", res.base.Seconds())

	// Steady writes for a minute: how old is the newest archived WAL?
	lsnBase := q("postgres", "select pg_current_wal_lsn()")
	if res.lag, err = steadyLag(r, pg, q); err != nil {
		return nil, err
	}
	replayed, _ := strconv.ParseFloat(q("postgres", fmt.Sprintf("select pg_wal_lsn_diff(pg_current_wal_lsn(), '%s')", lsnBase)), 64)
	res.recoveredWAL = replayed / (1 << 20)
	if err := archivedUpTo("the steady writes"); err != nil {
		return nil, err
	}
	res.rowsBig, res.rowsSteps = q("big", "select count(*) from events"), q("big", "select count(*) from steps")

	// A recovery of the whole archive into a new data directory.
	data := filepath.Join(dir, "recovered")
	start = time.Now()
	rec := r.Command(env, agent, append([]string{"recover", "--data-dir=" + data}, store...)...)
	var rout bytes.Buffer
	rec.Stdout, rec.Stderr = &rout, &rout
	if err := rec.Run(); err != nil {
		return nil, fmt.Errorf("recover: %v: %s", err, rout.String())
	}
	res.recovery = time.Since(start)
	logf("pitr: recovered in %.1f s", res.recovery.Seconds())
	if err := checkRecovered(t, r, dir, data, res); err != nil {
		return nil, err
	}
	return res, nil
}

// steadyLag has a writer commit about 100 rows a second into big.steps
// for a minute, and samples once a second how old the newest archived
// WAL file is (seconds).
func steadyLag(r *testpg.Runner, pg *testpg.Server, q func(db, sql string) string) ([]float64, error) {
	q("big", "create table steps (v int primary key, at timestamptz default clock_timestamp())")
	writer := r.Command(pg.Env("big"), "psql", "-XAtq", "-c",
		"do $$ begin for i in 1..6000 loop insert into steps (v) values (i); commit; perform pg_sleep(0.01); end loop; end $$")
	if err := writer.Start(); err != nil {
		return nil, err
	}
	defer func() { _ = writer.Process.Kill() }()
	logf("pitr: sampling the recovery-point lag under steady writes for 60 s")
	var lag []float64
	for range 60 {
		time.Sleep(time.Second)
		v, _ := strconv.ParseFloat(q("postgres", "select coalesce(extract(epoch from now() - last_archived_time), -1) from pg_stat_archiver"), 64)
		if v >= 0 {
			lag = append(lag, v)
		}
	}
	if err := writer.Wait(); err != nil {
		return nil, fmt.Errorf("the steady writer: %w", err)
	}
	return lag, nil
}

// checkRecovered starts a server on the recovered data and compares its
// rows with the source's.
func checkRecovered(t *benchT, r *testpg.Runner, dir, data string, res *pitrResult) error {
	port := testpg.FreePort(t)
	logPath := filepath.Join(dir, "recovered.log")
	log, err := os.Create(logPath)
	if err != nil {
		return err
	}
	defer log.Close()
	srv := r.Command(nil, "postgres", "-D", data, "-c", "listen_addresses=127.0.0.1", "-c", "port="+strconv.Itoa(port),
		"-c", "unix_socket_directories="+dir, "-c", "archive_mode=off")
	srv.Stdout, srv.Stderr = log, log
	if err := srv.Start(); err != nil {
		return err
	}
	defer testpg.StopServer(srv)
	env := map[string]string{"PGHOST": "127.0.0.1", "PGPORT": strconv.Itoa(port), "PGUSER": "postgres", "PGDATABASE": "big"}
	deadline := time.Now().Add(2 * time.Minute)
	for {
		out, err := r.Command(env, "psql", "-XAtq", "-c", "select (select count(*) from events) || ' ' || (select count(*) from steps)").Output()
		if err == nil {
			if got, want := strings.TrimSpace(string(out)), res.rowsBig+" "+res.rowsSteps; got != want {
				return fmt.Errorf("the recovered server holds %s rows (events, steps), want %s", got, want)
			}
			return nil
		}
		if time.Now().After(deadline) {
			b, _ := os.ReadFile(logPath)
			return fmt.Errorf("the recovered server does not answer: %v\n%s", err, b)
		}
		time.Sleep(500 * time.Millisecond)
	}
}

func merge(a, b map[string]string) map[string]string {
	out := map[string]string{}
	for k, v := range a {
		out[k] = v
	}
	for k, v := range b {
		out[k] = v
	}
	return out
}

func printPITR(r *pitrResult) {
	if r == nil {
		return
	}
	fmt.Printf("\nPoint-in-time recovery — a database of %.0f MiB (pg_database_size), WAL archived by the agent to S3 (versitygw), zstd and age, the same run\n\n", r.dbMB)
	fmt.Println("| step | data (MiB) | time (s) | MiB/s |")
	fmt.Println("|---|---:|---:|---:|")
	fmt.Printf("| bulk load (INSERT … SELECT), its WAL archived as it is written | %.0f WAL | %.1f (load %.1f) | %.0f |\n",
		r.walMB, r.archived.Seconds(), r.load.Seconds(), r.walMB/r.archived.Seconds())
	fmt.Printf("| base backup: pg_basebackup → zstd → age → S3 | %.0f database, %.0f stored | %.1f | %.0f |\n",
		r.dbMB, r.baseStoredMB, r.base.Seconds(), r.dbMB/r.base.Seconds())
	fmt.Printf("| recovery to the end of the archive: S3 → check → base backup restored, %.0f MiB of WAL replayed, promoted | %.0f database | %.1f | %.0f |\n",
		r.recoveredWAL, r.dbMB, r.recovery.Seconds(), r.dbMB/r.recovery.Seconds())
	if len(r.lag) > 0 {
		s := slices.Clone(r.lag)
		slices.Sort(s)
		pct := func(p float64) float64 { return s[min(len(s)-1, int(p*float64(len(s))))] }
		fmt.Printf("\nRecovery-point lag under steady writes (about 100 commits/s, archive_timeout %d s): the age of the newest archived WAL file, sampled once a second for %d s: median %.1f s, p95 %.1f s, max %.1f s. The recovered server holds every row (%s bulk, %s steady).\n",
			r.lagTimeout, len(r.lag), pct(0.5), pct(0.95), s[len(s)-1], r.rowsBig, r.rowsSteps)
	}
}
