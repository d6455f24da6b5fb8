package pgfull

import (
	"bytes"
	"context"
	"os/exec"
	"strings"
	"testing"

	"github.com/chartpilot/chartpilot/internal/testing/testpg"
)

// commander runs the commands against s as its superuser.
func commander(s *testpg.Server) Commander {
	return func(ctx context.Context, env []string, name string, args ...string) *exec.Cmd {
		cmd := s.Command(s.Env("postgres"), name, args...)
		cmd.Env = append(cmd.Env, env...)
		return cmd
	}
}

// state is what a restore must bring back, read the same way on both
// servers: roles with their attributes, passwords and memberships;
// databases with owners and grants; tables with owners, grants and rows.
func state(t *testing.T, s *testpg.Server, dbs ...string) string {
	t.Helper()
	var b strings.Builder
	b.WriteString(s.Query(t, "postgres", `SELECT string_agg(format('%s super=%s login=%s password=%s', rolname, rolsuper, rolcanlogin, coalesce(rolpassword, '-')), E'\n' ORDER BY rolname)
		FROM pg_authid WHERE rolname NOT LIKE 'pg\_%' AND rolname <> 'postgres'`))
	b.WriteString("\n" + s.Query(t, "postgres", `SELECT string_agg(format('%s member of %s', m.rolname, r.rolname), E'\n' ORDER BY m.rolname, r.rolname)
		FROM pg_auth_members a JOIN pg_roles r ON r.oid = a.roleid JOIN pg_roles m ON m.oid = a.member WHERE r.rolname NOT LIKE 'pg\_%'`))
	b.WriteString("\n" + s.Query(t, "postgres", `SELECT string_agg(format('%s owner=%s acl=%s', datname, datdba::regrole, coalesce((SELECT array_agg(a::text ORDER BY a::text) FROM unnest(datacl) a)::text, '-')), E'\n' ORDER BY datname)
		FROM pg_database WHERE NOT datistemplate`))
	for _, db := range dbs {
		b.WriteString("\n" + db + ": " + s.Query(t, db, `SELECT coalesce(string_agg(format('%s owner=%s acl=%s', c.relname, c.relowner::regrole, coalesce((SELECT array_agg(a::text ORDER BY a::text) FROM unnest(c.relacl) a)::text, '-')), E'\n' ORDER BY c.relname), '')
			FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = 'public'`))
		b.WriteString("\n" + db + " rows: " + s.Query(t, db, `SELECT coalesce(sum((xpath('/row/c/text()', query_to_xml(format('select count(*) as c from %I', relname), false, true, '')))[1]::text::int), 0)
			FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = 'public' AND c.relkind = 'r'`))
	}
	return b.String()
}

// A server with two application databases, each owned by its own role,
// grants between them, a group membership and a database whose name
// would read as a connection string: all of it is restored into a new
// server that already has one of the roles, and the new server's own
// superuser keeps its password.
func TestFullBackupRestoresEverything(t *testing.T) {
	ctx := context.Background()
	src := testpg.Start(t)
	for _, sql := range []string{
		"CREATE ROLE orders_owner LOGIN PASSWORD 'orders-secret'",
		"CREATE ROLE reporting NOLOGIN",
		"CREATE ROLE analyst LOGIN PASSWORD 'analyst-secret' IN ROLE reporting",
		"ALTER ROLE postgres PASSWORD 'old-superuser-secret'",
		"CREATE DATABASE orders OWNER orders_owner",
		"CREATE DATABASE inventory OWNER analyst",
		`CREATE DATABASE "odd=name" OWNER orders_owner`,
		"REVOKE CONNECT ON DATABASE inventory FROM PUBLIC",
		"GRANT CONNECT ON DATABASE inventory TO reporting",
		"CREATE TABLE settings (k text PRIMARY KEY, v text)",
		"INSERT INTO settings VALUES ('a', '1')",
	} {
		src.Query(t, "postgres", sql)
	}
	// One session: the objects are the owner's.
	src.Query(t, "orders", `SET ROLE orders_owner;
		CREATE TABLE items (id int PRIMARY KEY, name text);
		INSERT INTO items SELECT g, 'item ' || g FROM generate_series(1, 500) g;
		GRANT SELECT ON items TO reporting`)
	src.Query(t, "inventory", "SET ROLE analyst; CREATE TABLE stock AS SELECT g AS id FROM generate_series(1, 42) g")
	src.Query(t, "odd=name", "SET ROLE orders_owner; CREATE TABLE t AS SELECT 1 AS one")
	dbs := []string{"postgres", "orders", "inventory", "odd=name"}
	want := state(t, src, dbs...)

	var stream bytes.Buffer
	if err := Dump(ctx, &stream, commander(src)); err != nil {
		t.Fatal(err)
	}
	if !IsFull(stream.Bytes()) {
		t.Fatalf("the stream does not start with %q", Magic)
	}

	dst := testpg.Start(t)
	dst.Query(t, "postgres", "CREATE ROLE reporting NOLOGIN")
	dst.Query(t, "postgres", "ALTER ROLE postgres PASSWORD 'new-superuser-secret'")
	superBefore := dst.Query(t, "postgres", "SELECT rolpassword FROM pg_authid WHERE rolname = 'postgres'")
	r := bytes.NewReader(stream.Bytes()[len(Magic):])
	if err := Restore(ctx, r, commander(dst)); err != nil {
		t.Fatal(err)
	}
	if got := state(t, dst, dbs...); got != want {
		t.Errorf("restored server differs:\n--- backed up\n%s\n--- restored\n%s", want, got)
	}
	if after := dst.Query(t, "postgres", "SELECT rolpassword FROM pg_authid WHERE rolname = 'postgres'"); after != superBefore {
		t.Error("the restore changed the new server's superuser password")
	}
}

// A stream cut short, or one whose parts are not in order, is refused.
func TestRestoreRefusesBrokenStreams(t *testing.T) {
	ctx := context.Background()
	src := testpg.Start(t)
	src.Query(t, "postgres", "CREATE TABLE t AS SELECT g FROM generate_series(1, 1000) g")
	var stream bytes.Buffer
	if err := Dump(ctx, &stream, commander(src)); err != nil {
		t.Fatal(err)
	}
	body := stream.Bytes()[len(Magic):]
	dst := testpg.Start(t)
	for name, broken := range map[string][]byte{
		"cut short":         body[:len(body)-40],
		"no roles first":    []byte("part database \"postgres\"\n0\n"),
		"not a part":        []byte("hello\n"),
		"a bad chunk":       []byte("part globals\nxyz\n"),
		"empty":             nil,
		"an oversize chunk": []byte("part globals\n999999999999\n"),
	} {
		if err := Restore(ctx, bytes.NewReader(broken), commander(dst)); err == nil {
			t.Errorf("%s: restored", name)
		}
	}
}

// A drill restores every database of a full backup into throwaway ones,
// counts their tables and leaves nothing behind.
func TestDrill(t *testing.T) {
	ctx := context.Background()
	src := testpg.Start(t)
	src.Query(t, "postgres", "CREATE DATABASE app")
	src.Query(t, "app", "CREATE TABLE a (x int); CREATE TABLE b (y int)")
	src.Query(t, "postgres", "CREATE TABLE c (z int)")
	var stream bytes.Buffer
	if err := Dump(ctx, &stream, commander(src)); err != nil {
		t.Fatal(err)
	}
	before := src.Query(t, "postgres", "SELECT string_agg(datname, ',' ORDER BY datname) FROM pg_database")
	tables, err := Drill(ctx, bytes.NewReader(stream.Bytes()[len(Magic):]), commander(src), "chartpilot_drill")
	if err != nil {
		t.Fatal(err)
	}
	if tables != 3 {
		t.Errorf("the drill counted %d tables, want 3", tables)
	}
	if after := src.Query(t, "postgres", "SELECT string_agg(datname, ',' ORDER BY datname) FROM pg_database"); after != before {
		t.Errorf("databases after the drill: %s, before: %s", after, before)
	}
}
