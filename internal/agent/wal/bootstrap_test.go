package wal_test

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/chartpilot/chartpilot/internal/agent/wal"
	"github.com/chartpilot/chartpilot/internal/testing/testpg"
)

// TestSuperuserOfARecoveredCluster: the new Postgres's superuser is set
// in the recovered data in single-user mode: the cluster's bootstrap
// superuser and a role the archive's server did not have get the
// password, SUPERUSER and LOGIN; a role of that name that was not a
// superuser there (a member of it, mallory, would become one) is refused,
// naming it and the fix, and stays as it was. The password is in no
// error.
func TestSuperuserOfARecoveredCluster(t *testing.T) {
	if testing.Short() {
		t.Skip("real PostgreSQL")
	}
	r := testpg.NewRunner(t, testpg.Bin(t))
	data := filepath.Join(r.TempDir(t), "data")
	if out, err := r.Command(nil, "initdb", "-D", data, "-U", "postgres", "--auth=trust").CombinedOutput(); err != nil {
		t.Fatalf("initdb: %v\n%s", err, out)
	}
	single := func(sql string) string {
		t.Helper()
		cmd := r.Command(nil, "postgres", "--single", "-D", data, "-c", "listen_addresses=", "postgres")
		cmd.Stdin = strings.NewReader(sql)
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("%s: %v\n%s", sql, err, out)
		}
		return string(out)
	}
	single("CREATE ROLE admin LOGIN; CREATE ROLE mallory LOGIN IN ROLE admin;")
	command := func(name string, args ...string) *exec.Cmd { return r.Command(nil, name, args...) }
	const secret = "s3cr3t'pw$x"
	err := wal.SetSuperuser(command, data, "admin", secret)
	if err == nil || !strings.Contains(err.Error(), `role "admin"`) || !strings.Contains(err.Error(), "not a superuser") || strings.Contains(err.Error(), secret) {
		t.Fatalf("a non-superuser role of the archive's server: %v, want it refused, naming it, without the password", err)
	}
	if out := single("SELECT rolsuper FROM pg_roles WHERE rolname = 'admin';"); !strings.Contains(out, `rolsuper = "f"`) {
		t.Fatalf("admin after the refusal:\n%s", out)
	}
	for _, user := range []string{"postgres", "fresh"} {
		if err := wal.SetSuperuser(command, data, user, secret); err != nil {
			t.Fatalf("superuser %s: %v", user, err)
		}
		out := single("SELECT rolsuper, rolcanlogin, rolpassword LIKE 'SCRAM-SHA-256$%' AS scram FROM pg_authid WHERE rolname = '" + user + "';")
		if !strings.Contains(out, `rolsuper = "t"`) || !strings.Contains(out, `rolcanlogin = "t"`) || !strings.Contains(out, `scram = "t"`) {
			t.Errorf("superuser %s in the recovered data:\n%s", user, out)
		}
	}
	if err := wal.SetSuperuser(command, data, "fresh", ""); err == nil {
		t.Error("an empty password was set")
	}
}

// TestNewClusterSkip: a cluster that had a primary is joined, not
// recovered; a recovery that completed before is not run again; a volume
// holding a cluster no recovery made, in a cluster that never had a
// primary, is an error (never written over), naming the way out.
func TestNewClusterSkip(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	data := filepath.Join(dir, "pgdata")
	never := func(context.Context) (bool, string, error) { return false, "", nil }
	held := func(context.Context) (bool, string, error) { return true, "Lease db-primary was held", nil }
	n := wal.NewCluster{DataDir: data, Marker: data + ".moved", EverLed: never}
	if why, err := n.Skip(ctx); why != "" || err != nil {
		t.Fatalf("an empty volume of a new cluster: %q, %v; want a recovery", why, err)
	}
	n.EverLed = held
	if why, err := n.Skip(ctx); !strings.Contains(why, "joins it") || err != nil {
		t.Fatalf("a cluster that had a primary: %q, %v", why, err)
	}
	n.EverLed = never
	if err := os.MkdirAll(data, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(data, "PG_VERSION"), []byte("15\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if why, err := n.Skip(ctx); why != "" || err == nil || !strings.Contains(err.Error(), "never writes over data") {
		t.Fatalf("a kept volume: %q, %v; want an error", why, err)
	}
	if err := os.WriteFile(n.Marker, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if why, err := n.Skip(ctx); !strings.Contains(why, "recovered already") || err != nil {
		t.Fatalf("after a recovery: %q, %v", why, err)
	}
}

// TestNewClusterFinish: recovered data never moves in under a cluster
// that got a primary while it was made; else it moves into place after
// the marker is written, and the history the promotion wrote is marked ready
// to archive (the replay ran with archiving off); a history restored from
// the source's archive (archived there: .done) is not.
func TestNewClusterFinish(t *testing.T) {
	dir := t.TempDir()
	data := filepath.Join(dir, "pgdata")
	n := wal.NewCluster{DataDir: data, Marker: data + ".moved"}
	status := filepath.Join(n.Work(), "pg_wal", "archive_status")
	if err := os.MkdirAll(status, 0o700); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{"PG_VERSION", "pg_wal/00000002.history", "pg_wal/00000003.history", "pg_wal/archive_status/00000002.history.done"} {
		if err := os.WriteFile(filepath.Join(n.Work(), f), nil, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	// A primary taken meanwhile: nothing moves in.
	n.EverLed = func(context.Context) (bool, string, error) { return true, "Lease db-primary was held", nil }
	if err := n.Finish(context.Background()); err == nil || !strings.Contains(err.Error(), "got a primary while this recovery ran") {
		t.Fatalf("finishing under a cluster that got a primary: %v", err)
	}
	if _, err := os.Stat(data); err == nil {
		t.Fatal("the recovered data moved in beside a primary")
	}
	if err := os.MkdirAll(status, 0o700); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{"PG_VERSION", "pg_wal/00000002.history", "pg_wal/00000003.history", "pg_wal/archive_status/00000002.history.done"} {
		if err := os.WriteFile(filepath.Join(n.Work(), f), nil, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	n.EverLed = func(context.Context) (bool, string, error) { return false, "", nil }
	if err := n.Finish(context.Background()); err != nil {
		t.Fatal(err)
	}
	for path, want := range map[string]bool{
		filepath.Join(data, "PG_VERSION"): true, n.Marker: true, n.Work(): false,
		filepath.Join(data, "pg_wal", "archive_status", "00000003.history.ready"): true,
		filepath.Join(data, "pg_wal", "archive_status", "00000002.history.ready"): false,
	} {
		if _, err := os.Stat(path); (err == nil) != want {
			t.Errorf("%s: exists %v, want %v", path, err == nil, want)
		}
	}
}
