package instance

import (
	"bytes"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr"

	"github.com/chartpilot/chartpilot/internal/testing/testpg"
	"github.com/chartpilot/chartpilot/internal/testing/testwait"
)

// TestReplicationRoleTakenFromItsMaker: an application role with
// CREATEROLE makes "replicator" before the manager does. On PostgreSQL 16
// and later its maker keeps ADMIN on it, so once the manager has given the
// role REPLICATION and the rewind's file functions, the maker could grant
// itself the role and read the server's files as it. The manager takes
// every membership away (and the settings and limits the maker gave it):
// the maker can neither grant it nor become it, and the role still logs
// in to replicate. Run on PostgreSQL 17 and on Debian's server.
func TestReplicationRoleTakenFromItsMaker(t *testing.T) {
	debian := testpg.Bin(t)
	for _, tc := range []struct{ name, bin string }{{"17", testpg.Bin17(t)}, {"debian", debian}} {
		t.Run(tc.name, func(t *testing.T) {
			// The server's binaries with Debian's client tools beside them.
			bin := testpg.NewRunner(t, debian).TempDir(t)
			for name, dir := range map[string]string{"postgres": tc.bin, "initdb": tc.bin, "pg_ctl": tc.bin, "psql": debian, "pg_isready": debian} {
				if err := os.Symlink(filepath.Join(dir, name), filepath.Join(bin, name)); err != nil {
					t.Fatal(err)
				}
			}
			t.Setenv("PG_BIN", bin)
			pg := testpg.Start(t)
			pg.Query(t, "postgres", "CREATE ROLE app LOGIN CREATEROLE")
			pg.Query(t, "postgres", "CREATE DATABASE appdb OWNER app")
			asApp := func(sql string) (string, error) {
				env := pg.Env("appdb")
				env["PGUSER"] = "app"
				cmd := pg.Command(env, "psql", "-XAtq", "-v", "ON_ERROR_STOP=1", "-c", sql)
				var out bytes.Buffer
				cmd.Stdout, cmd.Stderr = &out, &out
				err := cmd.Run()
				return strings.TrimSpace(out.String()), err
			}
			if out, err := asApp("CREATE ROLE replicator NOLOGIN CONNECTION LIMIT 0; GRANT replicator TO app; ALTER ROLE replicator SET work_mem = '64kB'; ALTER ROLE replicator IN DATABASE appdb SET search_path = app"); err != nil {
				t.Fatalf("the maker's role: %v: %s", err, out)
			}
			s := &server{cfg: &Config{
				Bin: bin, SocketDir: pg.Dir, Port: pg.Port, User: "postgres", Credential: pg.Credential(),
				ReplicationUser: "replicator", ReplicationPassword: "repl-secret-1", Log: logr.Discard(),
			}}
			// A session of the maker that became the role before the repair
			// (PostgreSQL 16 and later: the maker may grant it to itself),
			// and one that holds the role's row locked: the repair gives up
			// on the lock (an error, tried again later) rather than wait.
			var held *heldSession
			if v := pg.Query(t, "postgres", "SHOW server_version_num"); v >= "160000" {
				lock := holdSession(t, pg, "app", "BEGIN;\nALTER ROLE replicator CONNECTION LIMIT 2;\nSELECT 'locked';\n", "locked")
				if err := s.ensureReplicationRole(); err == nil || !strings.Contains(err.Error(), "lock timeout") {
					t.Fatalf("the repair under a held lock: %v, want it to give up on the lock", err)
				}
				lock.finish(t, "ROLLBACK;\n")
				held = holdSession(t, pg, "app", "SET ROLE replicator;\nSELECT 'ready:' || current_user;\n", "ready:replicator")
			}
			if err := s.ensureReplicationRole(); err != nil {
				t.Fatal(err)
			}
			if held != nil {
				if out := held.finish(t, "SELECT 'read:' || length(pg_read_binary_file('global/pg_control'));\n"); strings.Contains(out, "read:") {
					t.Fatalf("a session that became the role before the repair read the server's files after it: %s", out)
				}
			}
			// Up to PostgreSQL 15, CREATEROLE may grant itself any role
			// that is not a superuser (pg_read_server_files among them):
			// there it holds these rights whatever the manager does.
			if v := pg.Query(t, "postgres", "SHOW server_version_num"); v < "160000" {
				t.Logf("PostgreSQL %s: only the repair is checked", v)
			} else if out, err := asApp("GRANT replicator TO app"); err == nil {
				t.Fatalf("the maker granted itself the replication role after the manager made it: %s", out)
			} else if out, err := asApp("SET ROLE replicator; SELECT length(pg_read_binary_file('global/pg_control'))"); err == nil {
				t.Fatalf("the maker read the server's files as the replication role: %s", out)
			}
			if got := pg.Query(t, "postgres", "SELECT count(*) FROM pg_auth_members m JOIN pg_roles r ON r.oid IN (m.roleid, m.member) WHERE r.rolname = 'replicator'"); got != "0" {
				t.Errorf("memberships in or of the replication role left: %s", got)
			}
			if got := pg.Query(t, "postgres", "SELECT count(*) FROM pg_db_role_setting WHERE setrole = 'replicator'::regrole"); got != "0" {
				t.Errorf("the maker's settings for the replication role left: %s", got)
			}
			if got := pg.Query(t, "postgres", "SELECT rolcanlogin AND rolreplication AND rolconnlimit = -1 FROM pg_roles WHERE rolname = 'replicator'"); got != "t" {
				t.Errorf("the replication role cannot log in to replicate: %s", got)
			}
			// A second pass finds nothing to repair and writes nothing.
			before := pg.Query(t, "postgres", "SELECT xmin FROM pg_authid WHERE rolname = 'replicator'")
			if err := s.ensureReplicationRole(); err != nil {
				t.Fatal(err)
			}
			if after := pg.Query(t, "postgres", "SELECT xmin FROM pg_authid WHERE rolname = 'replicator'"); after != before {
				t.Errorf("a role already as configured was written again (xmin %s, then %s)", before, after)
			}
		})
	}
}

// heldSession is a psql session kept open across a step of the test.
type heldSession struct {
	cmd   *exec.Cmd
	stdin io.WriteCloser
	out   *lockedBuffer
}

// holdSession opens a session as user on database postgres, runs sql and
// waits until its output holds ready.
func holdSession(t *testing.T, pg *testpg.Server, user, sql, ready string) *heldSession {
	t.Helper()
	env := pg.Env("postgres")
	env["PGUSER"] = user
	h := &heldSession{cmd: pg.Command(env, "psql", "-XAtq"), out: &lockedBuffer{}}
	h.cmd.Stdout, h.cmd.Stderr = h.out, h.out
	var err error
	if h.stdin, err = h.cmd.StdinPipe(); err != nil {
		t.Fatal(err)
	}
	if err := h.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = h.cmd.Process.Kill(); _ = h.cmd.Wait() })
	if _, err := io.WriteString(h.stdin, sql); err != nil {
		t.Fatal(err)
	}
	if !testwait.Until(time.Minute, 50*time.Millisecond, func() bool { return strings.Contains(h.out.String(), ready) }) {
		t.Fatalf("the held session never said %q: %s", ready, h.out.String())
	}
	return h
}

// finish runs sql in the session, ends it and returns all it printed.
func (h *heldSession) finish(t *testing.T, sql string) string {
	t.Helper()
	_, _ = io.WriteString(h.stdin, sql)
	_ = h.stdin.Close()
	done := make(chan struct{})
	go func() { _ = h.cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(time.Minute):
		t.Fatalf("the held session did not end: %s", h.out.String())
	}
	return h.out.String()
}

// lockedBuffer is a bytes.Buffer safe for a process's writes and the
// test's reads.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}
func (l *lockedBuffer) String() string { l.mu.Lock(); defer l.mu.Unlock(); return l.b.String() }
