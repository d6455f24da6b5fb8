package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"filippo.io/age"

	"github.com/chartpilot/chartpilot/internal/agent/blobstore"
	"github.com/chartpilot/chartpilot/internal/backup"
	"github.com/chartpilot/chartpilot/internal/backup/backuptest"
	"github.com/chartpilot/chartpilot/internal/testing/testpg"
)

// benchT gives the test helpers what they need of a test: a failure ends
// the benchmark, cleanups run at done.
type benchT struct{ cleanups []func() }

func (b *benchT) Helper()                        {}
func (b *benchT) Fatal(args ...any)              { b.done(); fail(errors.New(fmt.Sprint(args...))) }
func (b *benchT) Fatalf(format string, a ...any) { b.done(); fail(fmt.Errorf(format, a...)) }
func (b *benchT) Cleanup(f func())               { b.cleanups = append(b.cleanups, f) }
func (b *benchT) done() {
	for i := len(b.cleanups) - 1; i >= 0; i-- {
		b.cleanups[i]()
	}
	b.cleanups = nil
}

type backupRow struct {
	path         string
	dbMB, outMB  float64
	wall         time.Duration
	bytesPerSecN float64 // database MB / s
}

// runBackupBench fills a database of about mb MiB and times a backup and a
// restore through chartpilot's data path (pg_dump → zstd → age → S3 server)
// beside plain pg_dump | zstd to a file and back, in the same run.
func runBackupBench(mb int) ([]backupRow, error) {
	t := &benchT{}
	defer t.done()
	ctx := context.Background()
	pg := testpg.Start(t)
	logf("backup: filling a database of about %d MiB", mb)
	dbMB := fillBig(t, pg, mb)
	dir := pg.TempDir(t)
	var out []backupRow
	row := func(path string, wall time.Duration, outBytes int64) {
		r := backupRow{path: path, dbMB: dbMB, outMB: float64(outBytes) / (1 << 20), wall: wall, bytesPerSecN: dbMB / wall.Seconds()}
		logf("backup: %s: %.1f s, %.0f MB/s", path, wall.Seconds(), r.bytesPerSecN)
		out = append(out, r)
	}
	env := pg.Env("big")

	// Plain: pg_dump | zstd > file, and back.
	file := filepath.Join(dir, "plain.dump.zst")
	start := time.Now()
	sh := fmt.Sprintf("pg_dump -Fc -Z0 | zstd -q -3 -T1 -o %s", file)
	if b, err := pg.Command(env, "sh", "-c", sh).CombinedOutput(); err != nil {
		return nil, fmt.Errorf("%s: %v: %s", sh, err, b)
	}
	fi, err := os.Stat(file)
	if err != nil {
		return nil, err
	}
	row("pg_dump -Fc -Z0 | zstd -3 > file", time.Since(start), fi.Size())
	pg.Query(t, "postgres", "create database plain_restore")
	start = time.Now()
	sh = fmt.Sprintf("zstd -q -d -c %s | pg_restore --exit-on-error -d plain_restore", file)
	if b, err := pg.Command(pg.Env("plain_restore"), "sh", "-c", sh).CombinedOutput(); err != nil {
		return nil, fmt.Errorf("%s: %v: %s", sh, err, b)
	}
	row("zstd -d < file | pg_restore", time.Since(start), fi.Size())

	// chartpilot: pg_dump → zstd → age → versitygw, and back (verified first).
	s3 := backuptest.StartS3(t, filepath.Join(dir, "s3"))
	b, err := blobstore.OpenS3(ctx, s3)
	if err != nil {
		return nil, err
	}
	defer b.Close()
	id, err := age.GenerateX25519Identity()
	if err != nil {
		return nil, err
	}
	start = time.Now()
	cmd := pg.Command(env, "pg_dump", "-Fc", "-Z0")
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	m, err := backup.Write(ctx, b, "big/1", stdout, backup.Options{Recipient: id.Recipient().String()})
	if werr := cmd.Wait(); err == nil {
		err = werr
	}
	if err != nil {
		return nil, err
	}
	row("chartpilot backup: pg_dump -Fc -Z0 → zstd → age → S3 (versitygw)", time.Since(start), m.Size)
	pg.Query(t, "postgres", "create database cp_restore")
	start = time.Now()
	r, _, err := backup.Open(ctx, b, "big/1", id.String(), dir, backup.Expect{SHA256: m.SHA256, Size: m.Size})
	if err != nil {
		return nil, err
	}
	restore := pg.Command(pg.Env("cp_restore"), "pg_restore", "--exit-on-error", "-d", "cp_restore")
	restore.Stdin = r
	restore.Stderr = io.Discard
	err = restore.Run()
	r.Close()
	if err != nil {
		return nil, fmt.Errorf("pg_restore of the chartpilot backup: %w", err)
	}
	row("chartpilot restore: S3 → SHA-256 check → age → zstd → pg_restore", time.Since(start), m.Size)
	for _, db := range []string{"plain_restore", "cp_restore"} {
		if got, want := pg.Query(t, db, "select count(*) from events"), pg.Query(t, "big", "select count(*) from events"); got != want {
			return nil, fmt.Errorf("%s holds %s rows, want %s", db, got, want)
		}
	}
	return out, nil
}

func printBackup(rows []backupRow) {
	if len(rows) == 0 {
		return
	}
	fmt.Printf("\nBackup and restore — a database of %.0f MiB (pg_database_size), the same run; MB/s is database MiB per second\n\n", rows[0].dbMB)
	fmt.Println("| path | stored (MiB) | time (s) | MB/s |")
	fmt.Println("|---|---:|---:|---:|")
	for _, r := range rows {
		fmt.Printf("| %s | %.0f | %.1f | %.0f |\n", strings.ReplaceAll(r.path, "|", `\|`), r.outMB, r.wall.Seconds(), r.bytesPerSecN)
	}
}

// fillBig makes database "big" of about mb MiB (one table of events) and
// returns its size in MiB.
func fillBig(t *benchT, pg *testpg.Server, mb int) float64 {
	rows := mb * (1 << 20) / 300
	pg.Query(t, "postgres", "create database big")
	pg.Query(t, "big", fmt.Sprintf(`create table events (id bigint primary key, at timestamptz, kind int, payload text);
insert into events select i, timestamptz '2026-01-01' + i * interval '1 second', i %% 17,
  md5(i::text) || md5((i * 3)::text) || md5((i * 7)::text) || md5((i * 11)::text) || md5((i * 13)::text) || md5((i * 17)::text)
  from generate_series(1, %d) i;`, rows))
	size, _ := strconv.ParseFloat(pg.Query(t, "big", "select pg_database_size('big')"), 64)
	return size / (1 << 20)
}
