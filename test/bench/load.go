package main

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"time"

	"github.com/chartpilot/chartpilot/internal/agent/pgfull"
	"github.com/chartpilot/chartpilot/internal/testing/testpg"
)

type loadRow struct {
	path string
	wall time.Duration
}

// pgCommander runs pgfull's commands against s as its superuser.
func pgCommander(s *testpg.Server) pgfull.Commander {
	return func(ctx context.Context, env []string, name string, args ...string) *exec.Cmd {
		cmd := s.Command(s.Env("postgres"), name, args...)
		cmd.Env = append(cmd.Env, env...)
		return cmd
	}
}

// runLoadBench fills a database of about mb MiB whose table an application
// role owns and times, in the same run, a full restore into a new server
// and a restore drill into the server itself: as they load now (the schema
// as the superuser, each table's rows as its owner, the rest as the
// superuser) and as one pg_restore as the superuser, the way both loaded
// before.
func runLoadBench(mb int) ([]loadRow, float64, error) {
	t := &benchT{}
	defer t.done()
	ctx := context.Background()
	src := testpg.Start(t)
	logf("load: filling a database of about %d MiB", mb)
	dbMB := fillBig(t, src, mb)
	src.Query(t, "postgres", "create role app login")
	src.Query(t, "postgres", "alter database big owner to app")
	src.Query(t, "big", "alter table events owner to app")
	dir := src.TempDir(t)
	var rows []loadRow
	timed := func(path string, f func() error) error {
		start := time.Now()
		if err := f(); err != nil {
			return fmt.Errorf("%s: %w", path, err)
		}
		rows = append(rows, loadRow{path, time.Since(start)})
		logf("load: %s: %.1f s", path, time.Since(start).Seconds())
		return nil
	}
	full := filepath.Join(dir, "full")
	if err := timed("full dump (roles as rows, pg_dump -Fc per database)", func() error {
		f, err := os.Create(full)
		if err != nil {
			return err
		}
		defer f.Close()
		return pgfull.Dump(ctx, f, pgCommander(src))
	}); err != nil {
		return nil, 0, err
	}
	one := filepath.Join(dir, "big.dump")
	if out, err := src.Command(src.Env("big"), "pg_dump", "-Fc", "-f", one).CombinedOutput(); err != nil {
		return nil, 0, fmt.Errorf("pg_dump: %v: %s", err, out)
	}
	open := func() (*bufio.Reader, func(), error) {
		f, err := os.Open(full)
		if err != nil {
			return nil, nil, err
		}
		r := bufio.NewReader(f)
		if _, err := r.Discard(len(pgfull.Magic)); err != nil {
			f.Close()
			return nil, nil, err
		}
		return r, func() { f.Close() }, nil
	}
	before := testpg.Start(t)
	before.Query(t, "postgres", "create role app login")
	if err := timed("restore before: one pg_restore --create as the superuser", func() error {
		out, err := before.Command(before.Env("postgres"), "pg_restore", "--exit-on-error", "--create", "-d", "postgres", one).CombinedOutput()
		if err != nil {
			return fmt.Errorf("%v: %s", err, out)
		}
		return nil
	}); err != nil {
		return nil, 0, err
	}
	after := testpg.Start(t)
	if err := timed("restore now: pgfull (roles; schema, rows as the owner, the rest)", func() error {
		r, done, err := open()
		if err != nil {
			return err
		}
		defer done()
		return pgfull.Restore(ctx, r, pgCommander(after))
	}); err != nil {
		return nil, 0, err
	}
	if err := timed("drill before: one pg_restore --no-owner --no-acl as the superuser", func() error {
		src.Query(t, "postgres", "create database drill_before")
		defer src.Query(t, "postgres", "drop database drill_before")
		out, err := src.Command(src.Env("drill_before"), "pg_restore", "--exit-on-error", "--no-owner", "--no-acl", "-d", "drill_before", one).CombinedOutput()
		if err != nil {
			return fmt.Errorf("%v: %s", err, out)
		}
		return nil
	}); err != nil {
		return nil, 0, err
	}
	if err := timed("drill now: pgfull.Drill (schema, rows as the owner, the rest)", func() error {
		r, done, err := open()
		if err != nil {
			return err
		}
		defer done()
		_, err = pgfull.Drill(ctx, r, pgCommander(src), "chartpilot_bench_drill")
		return err
	}); err != nil {
		return nil, 0, err
	}
	if err := timed("drill now, as the drill Job runs it: pgfull.DrillScratch (the whole backup into a server of its own)", func() error {
		r, done, err := open()
		if err != nil {
			return err
		}
		defer done()
		_, err = pgfull.DrillScratch(ctx, r, true, src.TempDir(t), src.Credential())
		return err
	}); err != nil {
		return nil, 0, err
	}
	want := src.Query(t, "big", "select count(*) from events")
	for _, s := range []*testpg.Server{before, after} {
		if got := s.Query(t, "big", "select count(*) || ' ' || (select relowner::regrole::text from pg_class where relname = 'events') from events"); got != want+" app" {
			return nil, 0, fmt.Errorf("a restored copy holds %s, want %s rows owned by app", got, want)
		}
	}
	return rows, dbMB, nil
}

func printLoad(rows []loadRow, dbMB float64) {
	if len(rows) == 0 {
		return
	}
	fmt.Printf("\nFull restore and restore drill — a database of %.0f MiB whose table an application role owns, the same run\n\n", dbMB)
	fmt.Println("| path | time (s) |")
	fmt.Println("|---|---:|")
	for _, r := range rows {
		fmt.Printf("| %s | %.1f |\n", r.path, r.wall.Seconds())
	}
}
