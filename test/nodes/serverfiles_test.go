package nodes

import (
	"bytes"
	"strings"
	"testing"

	"github.com/chartpilot/chartpilot/internal/testing/testpg"
)

// checkServerFilesHoldNoSuperuser attacks the cluster behind host as a
// role the superuser allowed to read the server's files (a member of
// pg_read_server_files with EXECUTE on pg_read_binary_file, as for
// loading files): it reads the members' passfile, the instance manager's
// environment (/proc/1/environ) and the server's own memory. The
// superuser's password is in none of them.
func checkServerFilesHoldNoSuperuser(t *testing.T, host, user, password string) {
	t.Helper()
	const reader, readerPassword = "file_reader", "file-reader-pw-7c1d"
	if _, err := psql(t, host, user, password, "CREATE ROLE "+reader+" LOGIN PASSWORD '"+readerPassword+"'; GRANT pg_read_server_files TO "+reader+
		"; GRANT EXECUTE ON FUNCTION pg_read_binary_file(text), pg_read_binary_file(text, bigint, bigint) TO "+reader); err != nil {
		t.Fatal(err)
	}
	as := func(sql string) (string, error) { return psql(t, host, reader, readerPassword, sql) }
	passfile, err := as("CREATE TEMP TABLE f (l text); COPY f FROM '/var/run/postgresql/.chartpilot.pgpass'; SELECT string_agg(l, E'\\n') FROM f")
	if err != nil {
		t.Fatalf("reading the passfile: %v", err)
	}
	if !strings.Contains(passfile, ":replicator:") {
		t.Fatalf("the passfile read has no replication role's line (%d lines): the read does not work", strings.Count(passfile, "\n")+1)
	}
	if strings.Contains(passfile, password) {
		t.Error("the members' passfile holds the superuser's password")
	}
	environ, err := as("SELECT encode(pg_read_binary_file('/proc/1/environ'), 'escape')")
	switch {
	case err == nil && strings.Contains(environ, password):
		t.Error("the instance manager's environment, read through the server, holds the superuser's password")
	case err == nil:
		t.Errorf("the instance manager's environment is readable through the server (%d bytes)", len(environ))
	case !strings.Contains(err.Error(), "Permission denied"):
		t.Errorf("reading /proc/1/environ: %v, want permission denied", err)
	}
	mem, err := testpg.ServerMemory(as)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Contains(mem, []byte("PGPASSFILE=")) {
		t.Fatalf("PGPASSFILE= not in the %d bytes read of the server's memory: the search finds nothing", len(mem))
	}
	if bytes.Contains(mem, []byte(password)) {
		t.Error("the server's memory holds the superuser's password")
	}
	if _, err := psql(t, host, user, password, "DROP OWNED BY "+reader+"; DROP ROLE "+reader); err != nil {
		t.Fatal(err)
	}
}
