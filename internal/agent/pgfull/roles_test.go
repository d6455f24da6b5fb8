package pgfull

import (
	"bytes"
	"context"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/chartpilot/chartpilot/internal/testing/testpg"
)

// as runs SQL on s as role (a LOGIN role, trusted by the test server).
func as(t *testing.T, s *testpg.Server, role, db string, sql ...string) {
	t.Helper()
	env := s.Env(db)
	env["PGUSER"] = role
	args := []string{"-XAtq", "-v", "ON_ERROR_STOP=1"}
	for _, q := range sql {
		args = append(args, "-c", q)
	}
	if out, err := s.Command(env, "psql", args...).CombinedOutput(); err != nil {
		t.Fatalf("as %s: %v: %s", role, err, out)
	}
}

// fullBackup is s's full backup stream, Magic cut off.
func fullBackup(t *testing.T, s *testpg.Server) []byte {
	t.Helper()
	var stream bytes.Buffer
	if err := Dump(context.Background(), &stream, commander(s)); err != nil {
		t.Fatal(err)
	}
	return stream.Bytes()[len(Magic):]
}

const superusers = "SELECT coalesce(string_agg(rolname, ',' ORDER BY rolname), '') FROM pg_roles WHERE rolsuper"

// A LOGIN role writes settings whose values span lines and hold SQL: one
// that would end the literal around it if the restore edited the dump
// line by line, one that would then run as the restoring superuser. The
// restore runs none of it: no role becomes a superuser, and the settings
// come back as they were.
func TestRoleSettingsAreNotSQL(t *testing.T) {
	src := testpg.Start(t)
	src.Query(t, "postgres", "CREATE ROLE app LOGIN PASSWORD 'app-secret'")
	as(t, src, "app", "postgres",
		`ALTER ROLE CURRENT_USER SET temp_tablespaces = E'x\nALTER ROLE postgres WITH z'`,
		`ALTER ROLE CURRENT_USER SET application_name = E'\';\nALTER ROLE app SUPERUSER;\n--'`,
		`ALTER ROLE CURRENT_USER SET search_path = "$user", 'odd, name', public`)
	settings := "SELECT array_to_string(setconfig, '|') FROM pg_db_role_setting WHERE setrole = 'app'::regrole"
	want := src.Query(t, "postgres", settings)
	stream := fullBackup(t, src)

	dst := testpg.Start(t)
	skipped, err := RestoreWith(context.Background(), bytes.NewReader(stream), commander(dst), Options{})
	if err != nil {
		t.Fatal(err)
	}
	if len(skipped) != 0 {
		t.Errorf("left out: %q", skipped)
	}
	if got := dst.Query(t, "postgres", superusers); got != "postgres" {
		t.Errorf("superusers after the restore: %s", got)
	}
	if got := dst.Query(t, "postgres", settings); got != want {
		t.Errorf("app's settings after the restore:\n%s\nbacked up:\n%s", got, want)
	}
}

// Roles whose names hold what a quote, a dollar quote or a split on white
// space would trip on own databases and tables; a full backup of them
// restores, with their owners.
func TestHostileRoleNamesRestore(t *testing.T) {
	src := testpg.Start(t)
	names := []string{`a$chartpilot$b`, `x y`, `Robert'); DROP ROLE postgres; --`, `quote"d`}
	for i, n := range names {
		src.Query(t, "postgres", "CREATE ROLE "+ident(n)+" LOGIN PASSWORD 'pw'")
		db := "db " + n
		src.Query(t, "postgres", "CREATE DATABASE "+ident(db)+" OWNER "+ident(n))
		as(t, src, n, db, "CREATE TABLE "+ident("t "+n)+" AS SELECT generate_series(1, "+string(rune('1'+i))+") AS v")
	}
	src.Query(t, "postgres", "GRANT "+ident(names[0])+" TO "+ident(names[1]))
	dbs := []string{"postgres"}
	for _, n := range names {
		dbs = append(dbs, "db "+n)
	}
	want := state(t, src, dbs...)
	stream := fullBackup(t, src)
	dst := testpg.Start(t)
	if err := Restore(context.Background(), bytes.NewReader(stream), commander(dst)); err != nil {
		t.Fatal(err)
	}
	if got := state(t, dst, dbs...); got != want {
		t.Errorf("restored server differs:\n--- backed up\n%s\n--- restored\n%s", want, got)
	}
}

// A superuser of the backed-up server, and a membership in a role that
// reaches the server's files, are restored without their privilege
// unless the restore asks for it (a major upgrade does); the target's own
// replication role keeps its password.
func TestPrivilegedRolesNeedAsking(t *testing.T) {
	src := testpg.Start(t)
	src.Query(t, "postgres", "CREATE ROLE admin SUPERUSER LOGIN; CREATE ROLE reader LOGIN; GRANT pg_read_server_files TO reader; CREATE ROLE replicator REPLICATION LOGIN PASSWORD 'old'")
	stream := fullBackup(t, src)
	for _, privileged := range []bool{false, true} {
		dst := testpg.Start(t)
		dst.Query(t, "postgres", "CREATE ROLE replicator REPLICATION LOGIN PASSWORD 'new'")
		pw := dst.Query(t, "postgres", "SELECT rolpassword FROM pg_authid WHERE rolname = 'replicator'")
		skipped, err := RestoreWith(context.Background(), bytes.NewReader(stream), commander(dst), Options{Privileged: privileged})
		if err != nil {
			t.Fatal(err)
		}
		wantSuper, wantMember := "postgres", "0"
		if privileged {
			wantSuper, wantMember = "admin,postgres", "1"
		}
		if got := dst.Query(t, "postgres", superusers); got != wantSuper {
			t.Errorf("privileged=%v: superusers %s, want %s", privileged, got, wantSuper)
		}
		if got := dst.Query(t, "postgres", "SELECT count(*) FROM pg_auth_members WHERE roleid = 'pg_read_server_files'::regrole AND member = 'reader'::regrole"); got != wantMember {
			t.Errorf("privileged=%v: reader's memberships in pg_read_server_files: %s, want %s", privileged, got, wantMember)
		}
		if got := dst.Query(t, "postgres", "SELECT rolpassword FROM pg_authid WHERE rolname = 'replicator'"); got != pw {
			t.Errorf("privileged=%v: the target's replication role's password changed", privileged)
		}
		if privileged != (len(skipped) == 0) || (!privileged && !slices.ContainsFunc(skipped, func(s string) bool { return strings.Contains(s, "admin") })) {
			t.Errorf("privileged=%v: left out %q", privileged, skipped)
		}
	}
}

func TestSplitGUCList(t *testing.T) {
	for in, want := range map[string][]string{
		`"$user", public`:      {"$user", "public"},
		`"odd, name",x`:        {"odd, name", "x"},
		`"a""b"`:               {`a"b`},
		``:                     nil,
		`"x` + "\n" + `ALTER"`: {"x\nALTER"},
		`a b`:                  nil,
		`"unterminated`:        nil,
	} {
		got, ok := splitGUCList(in)
		if !slices.Equal(got, want) || (want == nil && in != "" && ok) {
			t.Errorf("splitGUCList(%q) = %q, %v; want %q", in, got, ok, want)
		}
	}
}

// trap is what a database owner adds to its table: a CHECK whose function
// makes app a superuser when it runs as one (directly or through a
// SECURITY DEFINER function the superuser would own after --no-owner), and
// what it tries when it runs under a role it could reset.
const trap = `
CREATE FUNCTION escalate() RETURNS boolean LANGUAGE plpgsql AS $$
BEGIN
  BEGIN RESET ROLE; EXCEPTION WHEN OTHERS THEN NULL; END;
  BEGIN SET SESSION AUTHORIZATION DEFAULT; EXCEPTION WHEN OTHERS THEN NULL; END;
  IF (SELECT rolsuper FROM pg_roles WHERE rolname = current_user) THEN
    EXECUTE 'ALTER ROLE app SUPERUSER';
  END IF;
  RETURN true;
END $$;
CREATE FUNCTION escalate_definer() RETURNS boolean LANGUAGE sql SECURITY DEFINER AS $$ SELECT public.escalate() $$;
CREATE TABLE trapped (i int CHECK (escalate()), j int CHECK (escalate_definer()));
INSERT INTO trapped VALUES (1, 1), (2, 2);`

// A database owner's table whose CHECK makes the owner a superuser if
// whoever loads its rows is one: a full restore, and a drill into the very
// server backed up, load it, and no role becomes a superuser of either.
func TestLoadingRunsNoUserCodeAsSuperuser(t *testing.T) {
	src := testpg.Start(t)
	src.Query(t, "postgres", "CREATE ROLE app LOGIN PASSWORD 'app-secret'")
	src.Query(t, "postgres", "CREATE DATABASE appdb OWNER app")
	as(t, src, "app", "appdb", trap)
	stream := fullBackup(t, src)

	dst := testpg.Start(t)
	if err := Restore(context.Background(), bytes.NewReader(stream), commander(dst)); err != nil {
		t.Fatal(err)
	}
	if got := dst.Query(t, "postgres", superusers); got != "postgres" {
		t.Errorf("superusers after a full restore: %s", got)
	}
	if got := dst.Query(t, "appdb", "SELECT count(*) || ' ' || (SELECT relowner::regrole::text FROM pg_class WHERE relname = 'trapped') FROM trapped"); got != "2 app" {
		t.Errorf("the restored table: %s, want 2 rows owned by app", got)
	}
	if got := dst.Query(t, "postgres", "SELECT count(*) FROM pg_roles WHERE rolname LIKE 'chartpilot_load_%'"); got != "0" {
		t.Errorf("%s loading roles left", got)
	}

	tables, err := Drill(context.Background(), bytes.NewReader(stream), commander(src), "chartpilot_drill")
	if err != nil {
		t.Fatal(err)
	}
	if tables != 1 {
		t.Errorf("the drill counted %d tables, want 1", tables)
	}
	if got := src.Query(t, "postgres", superusers); got != "postgres" {
		t.Errorf("superusers of the backed-up server after a drill: %s", got)
	}
}

// A drill in a server of its own restores the whole backup, roles
// included, counts its tables, leaves nothing behind, and the trap makes
// no superuser there either; the server backed up is not touched.
func TestDrillInAServerOfItsOwn(t *testing.T) {
	src := testpg.Start(t)
	src.Query(t, "postgres", "CREATE ROLE app LOGIN PASSWORD 'app-secret'")
	src.Query(t, "postgres", "CREATE DATABASE appdb OWNER app")
	as(t, src, "app", "appdb", trap, "CREATE TABLE plain (x int)")
	src.Query(t, "postgres", "CREATE TABLE c (z int)")
	stream := fullBackup(t, src)
	before := src.Query(t, "postgres", "SELECT string_agg(datname, ',' ORDER BY datname) FROM pg_database")
	// The drill's server runs as the test servers' user (not root).
	dir := src.TempDir(t)
	cred := src.Credential()
	tables, err := DrillScratch(context.Background(), bytes.NewReader(stream), true, dir, cred)
	if err != nil {
		t.Fatal(err)
	}
	if tables != 3 {
		t.Errorf("the drill counted %d tables, want 3", tables)
	}
	if after := src.Query(t, "postgres", "SELECT string_agg(datname, ',' ORDER BY datname) FROM pg_database"); after != before {
		t.Errorf("databases of the server backed up after the drill: %s, before: %s", after, before)
	}
	if left, _ := filepath.Glob(filepath.Join(dir, "*")); len(left) != 0 {
		t.Errorf("the drill left %q", left)
	}
	if _, err := DrillScratch(context.Background(), bytes.NewReader(nil), false, dir, cred); err == nil || !strings.Contains(err.Error(), "take a new backup") {
		t.Errorf("a drill of one database's dump: %v", err)
	}
}

// A CHECK whose function takes the table's row is written by pg_dump apart
// from its table (ALTER TABLE … ADD CONSTRAINT, after the rows), where
// adding it checks every row: it is added as the owner, and makes no
// superuser; a membership in the target's own replication role, and a
// role named as a drill server's superuser might be, give nothing either.
func TestSeparateChecksAndOwnRolesGiveNothing(t *testing.T) {
	src := testpg.Start(t)
	src.Query(t, "postgres", "CREATE ROLE app LOGIN CREATEROLE")
	src.Query(t, "postgres", "CREATE DATABASE appdb OWNER app")
	as(t, src, "app", "appdb", `CREATE TABLE public.t (i int);
CREATE FUNCTION public.escalate(r public.t) RETURNS boolean LANGUAGE plpgsql AS $$
BEGIN
  BEGIN RESET ROLE; EXCEPTION WHEN OTHERS THEN NULL; END;
  IF (SELECT rolsuper FROM pg_roles WHERE rolname = current_user) THEN
    EXECUTE 'ALTER ROLE app SUPERUSER';
  END IF;
  RETURN true;
END $$;
ALTER TABLE public.t ADD CONSTRAINT c CHECK (public.escalate(t.*));
INSERT INTO public.t VALUES (1), (2);`)
	as(t, src, "app", "postgres", "CREATE ROLE replicator", "GRANT replicator TO app", "CREATE ROLE chartpilot")
	stream := fullBackup(t, src)

	dst := testpg.Start(t)
	dst.Query(t, "postgres", "CREATE ROLE replicator LOGIN REPLICATION")
	if _, err := RestoreWith(context.Background(), bytes.NewReader(stream), commander(dst), Options{}); err != nil {
		t.Fatal(err)
	}
	if got := dst.Query(t, "postgres", superusers); got != "postgres" {
		t.Errorf("superusers after the restore: %s", got)
	}
	if got := dst.Query(t, "appdb", "SELECT count(*) || ' ' || (SELECT count(*) FROM pg_constraint WHERE conname = 'c') FROM public.t"); got != "2 1" {
		t.Errorf("rows and the CHECK after the restore: %s", got)
	}
	if got := dst.Query(t, "postgres", "SELECT count(*) FROM pg_auth_members WHERE roleid = 'replicator'::regrole"); got != "0" {
		t.Errorf("%s memberships in the target's replication role", got)
	}
	dir := src.TempDir(t)
	if _, err := DrillScratch(context.Background(), bytes.NewReader(stream), true, dir, src.Credential()); err != nil {
		t.Fatal(err)
	}
}

func TestAlteredObject(t *testing.T) {
	for sql, want := range map[string][3]string{
		"SET x = 1;\n-- ALTER TABLE evil.x\nALTER TABLE ONLY public.t\n    ADD CONSTRAINT c CHECK (public.f(t.*));": {"table", "public", "t"},
		`ALTER TABLE "we""ird"."ALTER TABLE a.b" ADD CONSTRAINT x CHECK (true);`:                                    {"table", `we"ird`, "ALTER TABLE a.b"},
		`ALTER TABLE ONLY "only".t ADD CONSTRAINT x CHECK (true);`:                                                  {"table", "only", "t"},
		`ALTER DOMAIN public.d ADD CONSTRAINT x CHECK (VALUE > 0);`:                                                 {"domain", "public", "d"},
		`SELECT 'ALTER TABLE a.b'; ALTER TABLE s.t ADD CONSTRAINT x CHECK (true);`:                                  {"table", "s", "t"},
	} {
		kind, schema, name, ok := alteredObject(sql)
		if !ok || [3]string{kind, schema, name} != want {
			t.Errorf("alteredObject(%q) = %s %q %q %v, want %q", sql, kind, schema, name, ok, want)
		}
	}
	if _, _, _, ok := alteredObject("ALTER TABLE t ADD CONSTRAINT x CHECK (true);"); ok {
		t.Error("an unqualified name was accepted")
	}
}

// TestLoadingRoleAlwaysDropped: a table's CHECK function, run by its
// owner's loading role, makes that role own a table and a view of the
// owner's depend on it, so that DROP OWNED alone would fail, and every
// restore with it. The restore succeeds, the role is gone, and what it
// made belongs to the owner.
func TestLoadingRoleAlwaysDropped(t *testing.T) {
	src := testpg.Start(t)
	src.Query(t, "postgres", "CREATE ROLE app LOGIN CREATEROLE")
	src.Query(t, "postgres", "CREATE DATABASE appdb OWNER app")
	as(t, src, "app", "appdb", `CREATE TABLE public.t (i int);
CREATE FUNCTION public.pin(r public.t) RETURNS boolean LANGUAGE plpgsql AS $$
DECLARE loader text := session_user;
BEGIN
  IF loader LIKE 'chartpilot_load_%' AND to_regclass('public.mine') IS NULL THEN
    EXECUTE format('GRANT CREATE ON SCHEMA public TO %I', loader);
    RESET ROLE;
    CREATE TABLE public.mine (i int);
    GRANT SELECT ON public.mine TO app;
    SET ROLE app;
    CREATE VIEW public.pinned AS SELECT * FROM public.mine;
  END IF;
  RETURN true;
END $$;
ALTER TABLE public.t ADD CONSTRAINT c CHECK (public.pin(t.*));
INSERT INTO public.t VALUES (1), (2);`)
	stream := fullBackup(t, src)

	dst := testpg.Start(t)
	if _, err := RestoreWith(context.Background(), bytes.NewReader(stream), commander(dst), Options{}); err != nil {
		t.Fatalf("the restore: %v", err)
	}
	if got := dst.Query(t, "postgres", "SELECT count(*) FROM pg_roles WHERE rolname LIKE 'chartpilot_load_%'"); got != "0" {
		t.Errorf("%s loading roles left", got)
	}
	if got := dst.Query(t, "appdb", "SELECT (SELECT count(*) FROM public.t) || ' ' || (SELECT tableowner FROM pg_tables WHERE tablename = 'mine') || ' ' || (SELECT count(*) FROM public.pinned)"); got != "2 app 0" {
		t.Errorf("rows, the owner of the table the loading role made, the view on it: %s", got)
	}
	if got := dst.Query(t, "postgres", superusers); got != "postgres" {
		t.Errorf("superusers after the restore: %s", got)
	}
}
