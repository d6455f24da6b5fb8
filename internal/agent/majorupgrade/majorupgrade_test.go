package majorupgrade_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/chartpilot/chartpilot/internal/agent/majorupgrade"
	"github.com/chartpilot/chartpilot/internal/testing/testpg"
	"github.com/chartpilot/chartpilot/internal/testing/testwait"
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

// startNew starts a server of the new major on the upgrade's new data
// directory, on its own (its socket in the work directory, and 127.0.0.1),
// stopped when the test ends, and returns its port.
func startNew(t *testing.T, old *testpg.Server, newBin string, p majorupgrade.Plan) int {
	t.Helper()
	port := testpg.FreePort(t)
	srv := old.Command(nil, filepath.Join(newBin, "postgres"), "-D", p.NewData, "-c", "listen_addresses=127.0.0.1", "-c", "port="+strconv.Itoa(port), "-c", "unix_socket_directories="+p.WorkDir)
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { testpg.StopServer(srv) })
	if !testwait.Until(time.Minute, 200*time.Millisecond, func() bool {
		return old.Command(nil, "pg_isready", "-h", p.WorkDir, "-p", strconv.Itoa(port)).Run() == nil
	}) {
		t.Fatal("the new server did not start")
	}
	return port
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
	port := startNew(t, old, newBin, p)
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

// TestMajorUpgradeStopsWrites: while the data moves, an application role
// cannot log in (not even to turn the read-only default off and write); a
// failure gives its login back, and after an upgrade the new server lets
// it in with its other attributes as they were. A role that could not log
// in before still cannot.
func TestMajorUpgradeStopsWrites(t *testing.T) {
	newBin := testpg.Bin17(t)
	old := seeded(t)
	old.Query(t, "postgres", "CREATE ROLE writer LOGIN CREATEDB; GRANT ALL ON ALL TABLES IN SCHEMA public TO writer; CREATE ROLE locked NOLOGIN")
	old.Query(t, "app", "GRANT ALL ON ALL TABLES IN SCHEMA public TO writer; GRANT ALL ON ALL SEQUENCES IN SCHEMA public TO writer")
	write := func(host string, port int) error {
		env := map[string]string{"PGHOST": host, "PGPORT": strconv.Itoa(port), "PGUSER": "writer", "PGDATABASE": "app"}
		out, err := old.Command(env, "psql", "-XAtq", "-v", "ON_ERROR_STOP=1", "-c", "SET default_transaction_read_only = off; INSERT INTO notes (body) VALUES ('written')").CombinedOutput()
		if err != nil {
			return fmt.Errorf("%v: %s", err, out)
		}
		return nil
	}
	if err := write("127.0.0.1", old.Port); err != nil {
		t.Fatalf("before the upgrade: %v", err)
	}
	for _, fail := range []string{majorupgrade.StepRestore, ""} {
		p := plan(t, old, newBin)
		p.Fail = fail
		var during error
		p.Log = func(step, _ string) {
			if step == majorupgrade.StepDump {
				during = write("127.0.0.1", old.Port)
			}
		}
		_, err := majorupgrade.Run(context.Background(), p)
		if (err != nil) != (fail != "") {
			t.Fatalf("upgrade failing at %q: %v", fail, err)
		}
		if during == nil || !strings.Contains(during.Error(), "not permitted to log in") {
			t.Errorf("failing at %q: a write while the data moved: %v", fail, during)
		}
		if fail != "" {
			if err := write("127.0.0.1", old.Port); err != nil {
				t.Errorf("after a failure at %s, the application role cannot write: %v", fail, err)
			}
			continue
		}
		port := startNew(t, old, newBin, p)
		env := map[string]string{"PGHOST": p.WorkDir, "PGPORT": strconv.Itoa(port), "PGUSER": "postgres", "PGDATABASE": "postgres"}
		out, err := old.Command(env, "psql", "-XAtq", "-c", `SELECT string_agg(format('%s login=%s createdb=%s', rolname, rolcanlogin, rolcreatedb), ' ' ORDER BY rolname) FROM pg_roles WHERE rolname IN ('writer', 'locked');
			SELECT count(*) FROM pg_db_role_setting WHERE array_to_string(setconfig, ',') LIKE '%chartpilot%'`).CombinedOutput()
		if err != nil {
			t.Fatalf("reading the new server's roles: %v: %s", err, out)
		}
		if got := strings.TrimSpace(string(out)); got != "locked login=f createdb=f writer login=t createdb=t\n0" {
			t.Errorf("roles on the new server: %q", got)
		}
	}
}

// fakeServer listens where a hostile database name points libpq, asks any
// client for its password in clear text, and keeps what it is sent.
type fakeServer struct {
	mu       sync.Mutex
	conns    int
	password string
}

func listenFake(t *testing.T, addr string) *fakeServer {
	t.Helper()
	l, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	f := &fakeServer{}
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go f.serve(c)
		}
	}()
	return f
}

func (f *fakeServer) serve(c net.Conn) {
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(30 * time.Second))
	f.mu.Lock()
	f.conns++
	f.mu.Unlock()
	for {
		var head [8]byte
		if _, err := io.ReadFull(c, head[:]); err != nil {
			return
		}
		n := binary.BigEndian.Uint32(head[:4])
		if binary.BigEndian.Uint32(head[4:]) == 80877103 { // SSLRequest
			_, _ = c.Write([]byte("N"))
			continue
		}
		if _, err := io.CopyN(io.Discard, c, int64(n)-8); err != nil {
			return
		}
		break
	}
	// AuthenticationCleartextPassword.
	_, _ = c.Write([]byte{'R', 0, 0, 0, 8, 0, 0, 0, 3})
	var head [5]byte
	if _, err := io.ReadFull(c, head[:]); err != nil || head[0] != 'p' {
		return
	}
	body := make([]byte, binary.BigEndian.Uint32(head[1:])-4)
	if _, err := io.ReadFull(c, body); err != nil {
		return
	}
	f.mu.Lock()
	f.password = strings.TrimRight(string(body), "\x00")
	f.mu.Unlock()
}

// TestMajorUpgradeHostileNames: a role with CREATEDB names a database
// after a connection string pointing at a server of its own, and another
// database and a table hold white space. The upgrade moves them all, and
// the superuser's password never reaches that server.
func TestMajorUpgradeHostileNames(t *testing.T) {
	newBin := testpg.Bin17(t)
	old := seeded(t)
	// The name takes the upgrade's port from -p: the fake server listens
	// on another loopback address at that port.
	fake := listenFake(t, net.JoinHostPort("127.0.0.2", strconv.Itoa(old.Port)))
	old.Query(t, "postgres", "CREATE ROLE maker LOGIN CREATEDB")
	cmd := old.Command(map[string]string{"PGHOST": old.Dir, "PGPORT": strconv.Itoa(old.Port), "PGUSER": "maker", "PGDATABASE": "postgres"},
		"psql", "-XAtq", "-v", "ON_ERROR_STOP=1", "-c", `CREATE DATABASE "host=127.0.0.2"`, "-c", `CREATE DATABASE "a b"`)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("as the CREATEDB role: %v: %s", err, out)
	}
	old.Query(t, "host=127.0.0.2", "CREATE TABLE caught (x int); INSERT INTO caught VALUES (1)")
	old.Query(t, "a b", `CREATE TABLE "x y" (v text); INSERT INTO "x y" SELECT 'row ' || g FROM generate_series(1, 7) g`)
	p := plan(t, old, newBin)
	p.Password = "superuser-secret"
	res, err := majorupgrade.Run(context.Background(), p)
	if err != nil {
		t.Fatal(err)
	}
	fake.mu.Lock()
	conns, pw := fake.conns, fake.password
	fake.mu.Unlock()
	if conns != 0 || pw != "" {
		t.Errorf("the server a database's name points at had %d connections and was sent the password %q", conns, pw)
	}
	if res.Tables != 5 || res.Rows != 23002+1+7 {
		t.Errorf("moved %d tables and %d rows, want 5 and %d", res.Tables, res.Rows, 23002+1+7)
	}
}

// TestMajorUpgradeEndsDatabaseWalsenders: a role with REPLICATION holds a
// replication=database connection (a walsender that runs SQL) open
// across the start of the upgrade; once writes are stopped it cannot
// write through it (a write there after the dump would be lost).
func TestMajorUpgradeEndsDatabaseWalsenders(t *testing.T) {
	newBin := testpg.Bin17(t)
	old := seeded(t)
	old.Query(t, "postgres", "CREATE ROLE streamer LOGIN REPLICATION")
	old.Query(t, "app", "GRANT ALL ON notes TO streamer; GRANT ALL ON SEQUENCE notes_id_seq TO streamer")
	cmd := old.Command(nil, "psql", "-XAtq", fmt.Sprintf("host=127.0.0.1 port=%d user=streamer dbname=app replication=database", old.Port))
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	out := &syncBuffer{}
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Process.Kill()
	io.WriteString(stdin, "SELECT 'connected';\n")
	if !testwait.Until(30*time.Second, 100*time.Millisecond, func() bool { return strings.Contains(out.String(), "connected") }) {
		t.Fatalf("the replication=database session: %s", out.String())
	}
	p := plan(t, old, newBin)
	p.Log = func(step, _ string) {
		if step == majorupgrade.StepDump {
			io.WriteString(stdin, "SET default_transaction_read_only = off; INSERT INTO notes (body) VALUES ('through a walsender') RETURNING 'written';\n")
			stdin.Close()
			_ = cmd.Wait()
		}
	}
	if _, err := majorupgrade.Run(context.Background(), p); err != nil {
		t.Fatal(err)
	}
	if strings.Contains(out.String(), "written") {
		t.Errorf("a walsender connected to a database wrote after writes were stopped: %s", out.String())
	}
}

// syncBuffer is a buffer a command writes while the test reads it.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// TestMajorUpgradeRunsNoUserCodeAsSuperuser: a database owner's table
// whose CHECK makes the owner a superuser when a superuser loads its rows
// moves to the new major, and no role is a superuser there but the
// upgrade's own.
func TestMajorUpgradeRunsNoUserCodeAsSuperuser(t *testing.T) {
	newBin := testpg.Bin17(t)
	old := seeded(t)
	old.Query(t, "postgres", "CREATE ROLE app LOGIN")
	old.Query(t, "postgres", "CREATE DATABASE appdb OWNER app")
	env := old.Env("appdb")
	env["PGUSER"] = "app"
	cmd := old.Command(env, "psql", "-XAtq", "-v", "ON_ERROR_STOP=1", "-c", `
CREATE FUNCTION escalate() RETURNS boolean LANGUAGE plpgsql AS $$
BEGIN
  BEGIN RESET ROLE; EXCEPTION WHEN OTHERS THEN NULL; END;
  IF (SELECT rolsuper FROM pg_roles WHERE rolname = current_user) THEN
    EXECUTE 'ALTER ROLE app SUPERUSER';
  END IF;
  RETURN true;
END $$;
CREATE TABLE trapped (i int CHECK (escalate()));
INSERT INTO trapped VALUES (1), (2);`)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("as app: %v: %s", err, out)
	}
	p := plan(t, old, newBin)
	res, err := majorupgrade.Run(context.Background(), p)
	if err != nil {
		t.Fatal(err)
	}
	if res.Tables != 4 {
		t.Errorf("moved %d tables, want 4", res.Tables)
	}
	port := startNew(t, old, newBin, p)
	q := old.Command(map[string]string{"PGHOST": p.WorkDir, "PGPORT": strconv.Itoa(port), "PGUSER": "postgres", "PGDATABASE": "postgres"},
		"psql", "-XAtq", "-c", "SELECT string_agg(rolname, ',' ORDER BY rolname) FROM pg_roles WHERE rolsuper")
	out, err := q.CombinedOutput()
	if err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	if got := strings.TrimSpace(string(out)); got != "postgres" {
		t.Errorf("superusers on the new server: %s", got)
	}
}
