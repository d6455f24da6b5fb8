package pgfull

import (
	"bytes"
	"context"
	"fmt"
	"os/exec"
	"strconv"
	"testing"

	"github.com/chartpilot/chartpilot/internal/testing/testpg"
)

// legacyBackup is s's full backup as chartpilot wrote it before the roles
// were rows: pg_dumpall's SQL as the first part (Magic cut off).
func legacyBackup(t *testing.T, s *testpg.Server) []byte {
	t.Helper()
	var w bytes.Buffer
	part := func(name string, cmd *exec.Cmd) {
		fmt.Fprintf(&w, "part %s\n", name)
		var errb bytes.Buffer
		cmd.Stdout, cmd.Stderr = &chunkWriter{w: &w}, &errb
		if err := cmd.Run(); err != nil {
			t.Fatalf("%s: %v: %s", name, err, errb.String())
		}
		w.WriteString("0\n")
	}
	part("globals", s.Command(s.Env("postgres"), "pg_dumpall", "--globals-only", "--no-tablespaces", "-l", "postgres"))
	dbs, err := Databases(context.Background(), commander(s))
	if err != nil {
		t.Fatal(err)
	}
	for _, db := range dbs {
		part("database "+strconv.Quote(db), s.Command(s.Env(db), "pg_dump", "-Fc"))
	}
	return w.Bytes()
}

// A backup from before the roles were rows, holding the same attacks as
// the tests of rows (settings that hold SQL, names that break quotes, a
// CHECK that wants a superuser), restores: its SQL is read, not run, and
// no role becomes a superuser.
func TestLegacyGlobalsAreReadNotRun(t *testing.T) {
	src := testpg.Start(t)
	src.Query(t, "postgres", "CREATE ROLE app LOGIN PASSWORD 'app-secret' CONNECTION LIMIT 7 VALID UNTIL '2030-01-01'")
	src.Query(t, "postgres", `CREATE ROLE "a$chartpilot$b" NOLOGIN; GRANT "a$chartpilot$b" TO app WITH ADMIN OPTION; CREATE ROLE "x y" LOGIN IN ROLE "a$chartpilot$b"`)
	src.Query(t, "postgres", "CREATE DATABASE appdb OWNER app")
	as(t, src, "app", "postgres",
		`ALTER ROLE CURRENT_USER SET temp_tablespaces = E'x\nALTER ROLE postgres WITH z'`,
		`ALTER ROLE CURRENT_USER SET application_name = E'\';\nALTER ROLE app SUPERUSER;\n--'`,
		`ALTER ROLE CURRENT_USER SET search_path = "$user", 'odd, name', public`)
	src.Query(t, "postgres", "ALTER ROLE app SET chartpilot.login_held = on")
	as(t, src, "app", "appdb", trap)
	settings := "SELECT array_to_string(setconfig, '|') FROM pg_db_role_setting WHERE setrole = 'app'::regrole"
	dbs := []string{"postgres", "appdb"}
	want, wantSettings := state(t, src, dbs...), src.Query(t, "postgres", settings)
	stream := legacyBackup(t, src)

	dst := testpg.Start(t)
	if err := Restore(context.Background(), bytes.NewReader(stream), commander(dst)); err != nil {
		t.Fatal(err)
	}
	if got := dst.Query(t, "postgres", superusers); got != "postgres" {
		t.Errorf("superusers after the restore: %s", got)
	}
	if got := dst.Query(t, "postgres", settings); got != wantSettings {
		t.Errorf("app's settings:\n%s\nbacked up:\n%s", got, wantSettings)
	}
	if got := state(t, dst, dbs...); got != want {
		t.Errorf("restored server differs:\n--- backed up\n%s\n--- restored\n%s", want, got)
	}
	if got := dst.Query(t, "postgres", "SELECT rolconnlimit || ' ' || rolvaliduntil::date FROM pg_authid WHERE rolname = 'app'"); got != "7 2030-01-01" {
		t.Errorf("app's limit and expiry: %s", got)
	}
}

func TestParseGlobalsRefusesOtherStatements(t *testing.T) {
	for _, sql := range []string{
		"CREATE ROLE a; DROP ROLE b;",
		"ALTER ROLE a WITH SUPERUSER; SELECT 1;",
		"ALTER ROLE a SET x TO E'\\n';",
		"DO $$BEGIN END$$;",
		"CREATE ROLE a",
		"ALTER ROLE a WITH PASSWORD 'unterminated;",
	} {
		if _, err := parseGlobals(sql); err == nil {
			t.Errorf("parseGlobals(%q) accepted it", sql)
		}
	}
}
