package instance

import (
	"encoding/base64"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/go-logr/logr"
)

// fromPostgres is what PostgreSQL 15 stored for CREATE ROLE r PASSWORD
// 'Ab3:xy\z' (password_encryption scram-sha-256).
const fromPostgres = `SCRAM-SHA-256$4096:WkW5nB4VJVVeQBLCQPbtxg==$9ywy9WBZirbBb6UZTIqiLOA1uXtZQn29e1fPYs3mwl4=:xmcOih+nFsko4SDLs0zQ3Z5M3Ab0jOFlZBxrlPwdhXI=`

func TestSCRAMVerifier(t *testing.T) {
	if !verifies(fromPostgres, `Ab3:xy\z`) {
		t.Fatal("PostgreSQL's own verifier of the password does not verify here: the keys are computed unlike the server's")
	}
	for _, wrong := range []string{`Ab3:xy\\z`, "Ab3:xyz", ""} {
		if verifies(fromPostgres, wrong) {
			t.Errorf("the verifier verifies %q", wrong)
		}
	}
	// Made here from the same salt: the server's verifier, byte for byte.
	salt, err := base64.StdEncoding.DecodeString("WkW5nB4VJVVeQBLCQPbtxg==")
	if err != nil {
		t.Fatal(err)
	}
	v, err := scramVerifier(`Ab3:xy\z`, salt, 4096)
	if err != nil {
		t.Fatal(err)
	}
	if v != fromPostgres {
		t.Errorf("verifier\n%s\nwant PostgreSQL's\n%s", v, fromPostgres)
	}
	for _, bad := range []string{"md5" + strings.Repeat("0", 32), "SCRAM-SHA-256$x:AA==$AA==:AA==", "SCRAM-SHA-256$4096:%%$AA==:AA==", "SCRAM-SHA-256$99999999:AA==$AA==:AA==", "SCRAM-SHA-256$4096:AA=="} {
		if verifies(bad, "") {
			t.Errorf("%q verifies", bad)
		}
	}
}

func TestReplicationConfig(t *testing.T) {
	for _, c := range []struct {
		user, password, want string
	}{
		{"replicator", "s3cret", ""},
		{"", "", ""},
		{"Replicator", "x", "--replication-user"},
		{"postgres", "x", "is the superuser"},
		{"pg_repl", "x", "reserved"},
		{"repl; DROP", "x", "--replication-user"},
		{"replicator", "pässword", "printable ASCII"},
		{"replicator", "line\nbreak", "printable ASCII"},
	} {
		cfg := Config{User: "postgres", ReplicationUser: c.user, ReplicationPassword: c.password}
		err := cfg.checkReplication()
		switch {
		case c.want == "" && err != nil:
			t.Errorf("%q: %v", c.user, err)
		case c.want != "" && (err == nil || !strings.Contains(err.Error(), c.want)):
			t.Errorf("%q %q: error %v, want one saying %q", c.user, c.password, err, c.want)
		case err != nil && c.password != "" && strings.Contains(err.Error(), c.password):
			t.Errorf("the error repeats the password: %v", err)
		}
	}
}

// The passfile holds the superuser's password only while the superuser
// replicates: a role that may read the server's files reads it.
func TestPassfile(t *testing.T) {
	dir := t.TempDir()
	s := &server{cfg: &Config{SocketDir: dir, User: "postgres", Password: `a:b\c`, ReplicationUser: "replicator", ReplicationPassword: "r:1", Log: logr.Discard()}}
	for _, tc := range []struct {
		superuser bool
		want      string
	}{
		{false, "*:*:*:replicator:r\\:1\n"},
		{true, "*:*:*:postgres:a\\:b\\\\c\n*:*:*:replicator:r\\:1\n"},
		{false, "*:*:*:replicator:r\\:1\n"},
	} {
		if err := s.writePassfile(tc.superuser); err != nil {
			t.Fatal(err)
		}
		b, err := os.ReadFile(filepath.Join(dir, ".chartpilot.pgpass"))
		if err != nil {
			t.Fatal(err)
		}
		if string(b) != tc.want {
			t.Errorf("passfile with the superuser %v: %q, want %q", tc.superuser, b, tc.want)
		}
		if fi, _ := os.Stat(s.passfile()); fi.Mode().Perm() != 0o600 {
			t.Errorf("passfile mode %v: libpq ignores a file others can read", fi.Mode().Perm())
		}
	}
}

// The server's commands get nothing of the manager's environment.
func TestServerEnvironment(t *testing.T) {
	t.Setenv("POSTGRES_PASSWORD", "secret")
	t.Setenv("CHARTPILOT_AGE_KEY", "AGE-SECRET-KEY-1")
	s := &server{cfg: &Config{Bin: "/pg/bin", SocketDir: "/run/pg"}}
	want := []string{"PATH=/pg/bin:/usr/bin:/bin", "LANG=C", "PGCONNECT_TIMEOUT=3", "PGPASSFILE=/run/pg/.chartpilot.pgpass"}
	if got := s.command("postgres").Env; !slices.Equal(got, want) {
		t.Errorf("the server's environment: %q, want %q", got, want)
	}
}
