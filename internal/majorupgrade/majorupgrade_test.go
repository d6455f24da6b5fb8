package majorupgrade_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/chartpilot/chartpilot/internal/majorupgrade"
	"github.com/chartpilot/chartpilot/internal/testpg"
	"github.com/chartpilot/chartpilot/internal/testwait"
)

const seed = `
CREATE DATABASE app;
\\c app
CREATE TABLE orders (id bigint PRIMARY KEY, customer text, total numeric(12,2), placed timestamptz, tags jsonb);
INSERT INTO orders SELECT i, 'customer ' || (i % 97), i * 1.25, timestamptz '2026-01-01' + i * interval '1 minute', jsonb_build_object('n', i, 'even', i % 2 = 0) FROM generate_series(1, 20000) i;
CREATE TABLE notes (id serial PRIMARY KEY, body text);
INSERT INTO notes (body) SELECT repeat('x', i % 300) FROM generate_series(1, 3000) i;
\\c postgres
CREATE TABLE settings (k text PRIMARY KEY, v text);
INSERT INTO settings VALUES ('a', '1'), ('b', NULL);
`

func plan(t *testing.T, old *testpg.Server, newBin string) majorupgrade.Plan {
	t.Helper()
	work := old.TempDir(t)
	return majorupgrade.Plan{
		ClientBin: testpg.Bin(t), NewBin: newBin,
		OldHost: old.Dir, OldPort: old.Port,
		NewData: filepath.Join(work, "data-17"), WorkDir: work, NewPort: testpg.FreePort(t),
		User: "postgres", Credential: &syscall.Credential{Uid: uint32(old.UID), Gid: uint32(old.GID)},
	}
}

func seeded(t *testing.T) *testpg.Server {
	t.Helper()
	old := testpg.Start(t)
	cmd := old.Command(old.Env("postgres"), "psql", "-XAtq", "-v", "ON_ERROR_STOP=1")
	cmd.Stdin = strings.NewReader(strings.ReplaceAll(seed, `\\`, `\`))
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("seeding: %v\n%s", err, out)
	}
	return old
}

// checksums are each table's rows and content checksum on a server.
func checksums(t *testing.T, s *testpg.Server, host string, port int) map[string]string {
	t.Helper()
	out := map[string]string{}
	for _, db := range []string{"postgres", "app"} {
		env := map[string]string{"PGHOST": host, "PGPORT": strconv.Itoa(port), "PGUSER": "postgres", "PGDATABASE": db}
		q := func(sql string) string {
			b, err := s.Command(env, "psql", "-XAtq", "-v", "ON_ERROR_STOP=1", "-c", sql).CombinedOutput()
			if err != nil {
				t.Fatalf("%s on %s:%d: %v: %s", sql, host, port, err, b)
			}
			return strings.TrimSpace(string(b))
		}
		for _, tb := range strings.Fields(q("SELECT tablename FROM pg_tables WHERE schemaname = 'public' ORDER BY 1")) {
			out[db+"."+tb] = q(fmt.Sprintf("SELECT count(*) || ' ' || md5(string_agg(x::text, ',' ORDER BY x::text)) FROM %s x", tb))
		}
	}
	return out
}

// TestMajorUpgrade15To17: a seeded PostgreSQL 15 database moves to 17:
// every table's rows and checksum equal after, the old data directory is
// still 15's and untouched.
func TestMajorUpgrade15To17(t *testing.T) {
	newBin := testpg.Bin17(t)
	old := seeded(t)
	before := checksums(t, old, "127.0.0.1", old.Port)
	p := plan(t, old, newBin)
	res, err := majorupgrade.Run(context.Background(), p)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("moved %d databases, %d tables, %d rows in %s", res.Databases, res.Tables, res.Rows, res.Took.Round(time.Millisecond))
	if res.Tables != 3 || res.Rows != 23002 {
		t.Errorf("moved %d tables and %d rows, want 3 and 23002", res.Tables, res.Rows)
	}
	if v, _ := os.ReadFile(filepath.Join(old.Dir, "data", "PG_VERSION")); strings.TrimSpace(string(v)) != "15" {
		t.Errorf("the old data directory's PG_VERSION is %q", v)
	}
	if v, _ := os.ReadFile(filepath.Join(p.NewData, "PG_VERSION")); strings.TrimSpace(string(v)) != "17" {
		t.Errorf("the new data directory's PG_VERSION is %q", v)
	}
	// The new server, started on its own, has the same tables, compared
	// here independently of the upgrade's own check.
	port := testpg.FreePort(t)
	srv := old.Command(nil, filepath.Join(newBin, "postgres"), "-D", p.NewData, "-c", "listen_addresses=127.0.0.1", "-c", "port="+strconv.Itoa(port), "-c", "unix_socket_directories="+p.WorkDir)
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { testpg.StopServer(srv) })
	if !testwait.Until(time.Minute, 200*time.Millisecond, func() bool {
		return old.Command(nil, "pg_isready", "-h", "127.0.0.1", "-p", strconv.Itoa(port)).Run() == nil
	}) {
		t.Fatal("the new server did not start")
	}
	after := checksums(t, old, p.WorkDir, port) // its socket: host connections need the password, and there is none here
	if fmt.Sprint(after) != fmt.Sprint(before) || len(after) != 3 {
		t.Errorf("tables after the upgrade:\n%v\nbefore:\n%v", after, before)
	}
	if v := old.Query(t, "postgres", "SELECT 1"); v != "1" {
		t.Errorf("the old server does not answer: %q", v)
	}
}

// TestMajorUpgradeFailureLeavesOldServing: a failure injected at each step
// leaves the old server accepting writes, no new data directory, and an
// error naming the step.
func TestMajorUpgradeFailureLeavesOldServing(t *testing.T) {
	newBin := testpg.Bin17(t)
	old := seeded(t)
	for i, step := range majorupgrade.Steps {
		p := plan(t, old, newBin)
		p.Fail = step
		_, err := majorupgrade.Run(context.Background(), p)
		var me *majorupgrade.Error
		if !errors.As(err, &me) || me.Step != step || !strings.Contains(err.Error(), step) {
			t.Errorf("failure at %s: got %v", step, err)
		}
		if _, err := os.Stat(p.NewData); !os.IsNotExist(err) {
			t.Errorf("failure at %s: the new data directory is left: %v", step, err)
		}
		cmd := old.Command(old.Env("app"), "psql", "-XAtq", "-v", "ON_ERROR_STOP=1", "-c", fmt.Sprintf("INSERT INTO notes (body) VALUES ('after a failure at %s %d')", step, i))
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Errorf("failure at %s: the old server refuses writes: %v: %s", step, err, out)
		}
	}
}
