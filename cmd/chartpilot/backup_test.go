//go:build !manager

package main

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"filippo.io/age"

	"github.com/chartpilot/chartpilot/internal/backup"
	"github.com/chartpilot/chartpilot/internal/backup/backuptest"
	"github.com/chartpilot/chartpilot/internal/testing/testpg"
)

// TestBackupCommand: `chartpilot backup run -- pg_dump` of a real database
// to a volume store, then `chartpilot backup restore -- pg_restore` into a
// fresh one, with encryption; a dump command that fails midway stores
// nothing.
func TestBackupCommand(t *testing.T) {
	pg := testpg.Start(t)
	pg.Query(t, "postgres", "create database shop")
	pg.Query(t, "shop", "create table items (id int primary key, name text); insert into items select i, 'item ' || i from generate_series(1, 5000) i")
	id, err := age.GenerateX25519Identity()
	if err != nil {
		t.Fatal(err)
	}
	keyFile := filepath.Join(t.TempDir(), "key")
	if err := os.WriteFile(keyFile, []byte(id.String()+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	store := t.TempDir()
	conn := []string{"-h", "127.0.0.1", "-p", strconv.Itoa(pg.Port), "-U", "postgres"}

	out, stderr, err := runAgent(append([]string{"run", "--store", "volume", "--volume-path", store, "--location", "shop/1", "--recipient", id.Recipient().String(), "--label", "database=shop", "--", "pg_dump", "-Fc"}, append(conn, "shop")...)...)
	if err != nil {
		t.Fatalf("backup run: %v\n%s", err, stderr)
	}
	var m backup.Manifest
	if err := json.Unmarshal([]byte(out), &m); err != nil || m.Encryption != "age" || m.Labels["database"] != "shop" || m.Size == 0 {
		t.Fatalf("manifest printed: %s (%v)", out, err)
	}
	pg.Query(t, "postgres", "create database restored")
	if _, stderr, err := runAgent(append([]string{"restore", "--store", "volume", "--volume-path", store, "--location", "shop/1", "--identity-file", keyFile, "--", "pg_restore", "--exit-on-error", "-d", "restored"}, conn...)...); err != nil {
		t.Fatalf("backup restore: %v\n%s", err, stderr)
	}
	if got := pg.Query(t, "restored", "select count(*) || ' ' || md5(string_agg(name, ',' order by id)) from items"); got != pg.Query(t, "shop", "select count(*) || ' ' || md5(string_agg(name, ',' order by id)) from items") {
		t.Errorf("restored items differ: %s", got)
	}

	// Two more backups with --keep-count 2: the first one is pruned.
	for _, loc := range []string{"shop/3", "shop/4"} {
		if _, stderr, err := runAgent("run", "--store", "volume", "--volume-path", store, "--location", loc, "--keep-count", "2", "--", "printf", loc); err != nil {
			t.Fatalf("backup run %s: %v\n%s", loc, err, stderr)
		}
	}
	if _, err := os.Stat(filepath.Join(store, "shop", "1", "manifest.json")); !os.IsNotExist(err) {
		t.Errorf("shop/1 not pruned with --keep-count 2 after two newer backups: %v", err)
	}
	for _, loc := range []string{"3", "4"} {
		if _, err := os.Stat(filepath.Join(store, "shop", loc, "manifest.json")); err != nil {
			t.Errorf("shop/%s: %v", loc, err)
		}
	}

	_, _, err = runAgent("run", "--store", "volume", "--volume-path", store, "--location", "shop/2", "--keep-count", "1", "--", "sh", "-c", "head -c 100000 /dev/zero; exit 3")
	if err == nil || !strings.Contains(err.Error(), "sh failed") {
		t.Errorf("a failing dump command: %v", err)
	}
	if entries, _ := os.ReadDir(filepath.Join(store, "shop", "2")); len(entries) != 0 {
		t.Errorf("a failed dump left %d files in the store", len(entries))
	}
	if _, err := os.Stat(filepath.Join(store, "shop", "3", "manifest.json")); err != nil {
		t.Errorf("a failed backup pruned a good one: %v", err)
	}

	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"run", "--store", "volume", "--volume-path", store, "--", "true"}, "--location is required"},
		{[]string{"run", "--store", "ftp", "--location", "x", "--", "true"}, `--store "ftp": must be s3, gcs, azure or volume`},
		{[]string{"run", "--store", "s3", "--s3-bucket", "b", "--location", "x", "--", "true"}, "an access key ID and a secret access key are required"},
		{[]string{"restore", "--store", "volume", "--volume-path", store, "--location", "shop/1"}, "the command to restore into is required after --"},
		{[]string{"prune"}, "a subcommand is required"},
	} {
		if _, _, err := runAgent(tc.args...); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: %v, want %q", tc.args, err, tc.want)
		}
	}
}

// runAgent runs `chartpilot backup ARGS` in this process: its standard
// output, its standard error and its error.
func runAgent(args ...string) (string, string, error) {
	var out, errb bytes.Buffer
	err := backupCommand(context.Background(), args, &out, &errb)
	return out.String(), errb.String(), err
}

// TestRecipientFromEnv: CHARTPILOT_AGE_KEY may hold a recipient or an
// identity (its recipient is used); anything else is refused without
// showing the value.
func TestRecipientFromEnv(t *testing.T) {
	id, err := age.GenerateX25519Identity()
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ key, want, err string }{
		{"", "", ""},
		{id.Recipient().String(), id.Recipient().String(), ""},
		{id.String() + "\n", id.Recipient().String(), ""},
		{"AGE-SECRET-KEY-1NOTAKEY", "", "not a valid age X25519 identity"},
		{"hunter2-secret", "", "holds neither"},
	} {
		t.Setenv("CHARTPILOT_AGE_KEY", tc.key)
		got, err := recipientFromEnv()
		if got != tc.want || (err == nil) != (tc.err == "") || (err != nil && (!strings.Contains(err.Error(), tc.err) || strings.Contains(err.Error(), "hunter2"))) {
			t.Errorf("CHARTPILOT_AGE_KEY %.12q: %q, %v", tc.key, got, err)
		}
	}
}

// TestBackupCommandGCS: the agent's flags for a GCS store (as a backup Job
// passes them) store a stream in a Google Cloud Storage emulator and
// restore it byte for byte.
func TestBackupCommandGCS(t *testing.T) {
	g := backuptest.StartGCS(t)
	var out, errb bytes.Buffer
	flags := []string{"--store", "gcs", "--gcs-endpoint", g.Endpoint, "--gcs-bucket", g.Bucket, "--gcs-prefix", "team-a", "--location", "cache/1"}
	if err := backupCommand(context.Background(), append(append([]string{"run"}, flags...), "--", "seq", "1", "20000"), &out, &errb); err != nil {
		t.Fatalf("backup run to GCS: %v\n%s", err, errb.String())
	}
	m := backup.Manifest{}
	if err := json.Unmarshal(out.Bytes(), &m); err != nil || m.SHA256 == "" {
		t.Fatalf("manifest %q: %v", out.String(), err)
	}
	restored := filepath.Join(t.TempDir(), "restored")
	out.Reset()
	if err := backupCommand(context.Background(), append(append([]string{"restore"}, flags...), "--", "sh", "-c", "cat > "+restored), &out, &errb); err != nil {
		t.Fatalf("backup restore from GCS: %v\n%s", err, errb.String())
	}
	got, _ := os.ReadFile(restored)
	want, _ := exec.Command("seq", "1", "20000").Output()
	if !bytes.Equal(got, want) {
		t.Errorf("restored %d bytes, want the %d the command wrote", len(got), len(want))
	}
}

// TestTamperedBackupRefused: a backup replaced in the store by someone
// who can write there (a dump of their own, with a manifest that agrees
// with it: age encryption is no authentication, its recipient is public)
// is refused by a restore told what the Backup recorded; the restore
// command never starts and the database gets nothing.
func TestTamperedBackupRefused(t *testing.T) {
	pg := testpg.Start(t)
	pg.Query(t, "postgres", "create database shop")
	pg.Query(t, "shop", "create table items (id int primary key, name text); insert into items select i, 'item ' || i from generate_series(1, 100) i")
	pg.Query(t, "postgres", "create database crafted")
	pg.Query(t, "crafted", "create table planted (id int)")
	store := t.TempDir()
	conn := []string{"-h", "127.0.0.1", "-p", strconv.Itoa(pg.Port), "-U", "postgres"}
	out, stderr, err := runAgent(append([]string{"run", "--store", "volume", "--volume-path", store, "--location", "shop/1", "--", "pg_dump", "-Fc"}, append(conn, "shop")...)...)
	if err != nil {
		t.Fatalf("backup run: %v\n%s", err, stderr)
	}
	var recorded backup.Manifest
	if err := json.Unmarshal([]byte(out), &recorded); err != nil {
		t.Fatal(err)
	}
	// The attacker's own backup, moved over the recorded one.
	if _, stderr, err := runAgent(append([]string{"run", "--store", "volume", "--volume-path", store, "--location", "evil/1", "--", "pg_dump", "-Fc"}, append(conn, "crafted")...)...); err != nil {
		t.Fatalf("backup run: %v\n%s", err, stderr)
	}
	for _, f := range []string{"data", "manifest.json"} {
		if err := os.Rename(filepath.Join(store, "evil", "1", f), filepath.Join(store, "shop", "1", f)); err != nil {
			t.Fatal(err)
		}
	}
	pg.Query(t, "postgres", "create database restored")
	started := filepath.Join(t.TempDir(), "started")
	_, _, err = runAgent(append([]string{"restore", "--store", "volume", "--volume-path", store, "--location", "shop/1",
		"--expect-sha256", recorded.SHA256, "--expect-size", strconv.FormatInt(recorded.Size, 10),
		"--", "sh", "-c", "touch " + started + "; exec pg_restore --exit-on-error -d restored \"$@\"", "sh"}, conn...)...)
	if err == nil || !strings.Contains(err.Error(), "not the one recorded") || !strings.Contains(err.Error(), "nothing was restored") {
		t.Fatalf("restoring a replaced backup: %v", err)
	}
	if _, err := os.Stat(started); err == nil {
		t.Error("the restore command started")
	}
	if got := pg.Query(t, "restored", "select count(*) from pg_catalog.pg_tables where schemaname = 'public'"); got != "0" {
		t.Errorf("the database got %s tables", got)
	}
	// Without what the Backup recorded (a restore from a bare location),
	// the same files pass the store's own manifest: the reason the
	// operator always passes it for a Backup.
	if _, stderr, err := runAgent(append([]string{"restore", "--store", "volume", "--volume-path", store, "--location", "shop/1", "--", "pg_restore", "--exit-on-error", "-d", "restored"}, conn...)...); err != nil {
		t.Fatalf("a restore without --expect-sha256: %v\n%s", err, stderr)
	}
}

// TestBackupCommandPostgres: `backup run --postgres` stores everything a
// server holds (roles and every database), `backup restore --postgres`
// brings it into another server with owners and grants, `backup verify`
// drills it database by database; a backup of one database made with
// `-- pg_dump -Fc` (as backups were before) still restores and verifies
// with --postgres.
func TestBackupCommandPostgres(t *testing.T) {
	src, dst := testpg.Start(t), testpg.Start(t)
	src.Query(t, "postgres", "CREATE ROLE shop_owner LOGIN PASSWORD 'shop-secret'")
	src.Query(t, "postgres", "CREATE DATABASE shop OWNER shop_owner")
	src.Query(t, "shop", "SET ROLE shop_owner; CREATE TABLE items (id int PRIMARY KEY, name text); INSERT INTO items SELECT i, 'item ' || i FROM generate_series(1, 3000) i")
	src.Query(t, "postgres", "CREATE TABLE notes AS SELECT 'kept' AS note")
	store := t.TempDir()
	useServer := func(s *testpg.Server) {
		t.Setenv("PGHOST", "127.0.0.1")
		t.Setenv("PGPORT", strconv.Itoa(s.Port))
		t.Setenv("PGUSER", "postgres")
	}
	useServer(src)
	if _, stderr, err := runAgent("run", "--store", "volume", "--volume-path", store, "--location", "all/1", "--postgres"); err != nil {
		t.Fatalf("backup run --postgres: %v\n%s", err, stderr)
	}
	conn := []string{"-h", "127.0.0.1", "-p", strconv.Itoa(src.Port), "-U", "postgres"}
	if _, stderr, err := runAgent(append([]string{"run", "--store", "volume", "--volume-path", store, "--location", "one/1", "--", "pg_dump", "-Fc"}, append(conn, "shop")...)...); err != nil {
		t.Fatalf("backup run -- pg_dump: %v\n%s", err, stderr)
	}
	for loc, tables := range map[string]int{"all/1": 2, "one/1": 1} {
		out, stderr, err := runAgent("verify", "--store", "volume", "--volume-path", store, "--location", loc)
		var rep verifyReport
		if err != nil || json.Unmarshal([]byte(out), &rep) != nil || rep.Tables != tables {
			t.Errorf("verify %s: %v, report %s, want %d tables\n%s", loc, err, out, tables, stderr)
		}
	}

	useServer(dst)
	if _, stderr, err := runAgent("restore", "--store", "volume", "--volume-path", store, "--location", "all/1", "--postgres"); err != nil {
		t.Fatalf("backup restore --postgres: %v\n%s", err, stderr)
	}
	rows := "SELECT count(*) || ' ' || md5(string_agg(name, ',' ORDER BY id)) || ' ' || (SELECT relowner::regrole::text FROM pg_class WHERE relname = 'items') FROM items"
	if got, want := dst.Query(t, "shop", rows), src.Query(t, "shop", rows); got != want {
		t.Errorf("restored shop: %s, backed up: %s", got, want)
	}
	owner := "SELECT datdba::regrole FROM pg_database WHERE datname = 'shop'"
	if got := dst.Query(t, "postgres", owner); got != "shop_owner" {
		t.Errorf("restored shop is owned by %s", got)
	}
	if got := dst.Query(t, "postgres", "SELECT note FROM notes"); got != "kept" {
		t.Errorf("the postgres database's table: %q", got)
	}

	// The single database, into a third server's postgres database.
	old := testpg.Start(t)
	useServer(old)
	if _, stderr, err := runAgent("restore", "--store", "volume", "--volume-path", store, "--location", "one/1", "--postgres"); err != nil {
		t.Fatalf("restore --postgres of a pg_dump -Fc: %v\n%s", err, stderr)
	}
	if got := old.Query(t, "postgres", "SELECT count(*) FROM items"); got != "3000" {
		t.Errorf("items restored from a pg_dump -Fc: %s", got)
	}

	for _, args := range [][]string{
		{"run", "--store", "volume", "--volume-path", store, "--location", "x/1", "--postgres", "--", "pg_dump"},
		{"verify", "--store", "volume", "--volume-path", store, "--location", "all/1", "--postgres"},
	} {
		if _, _, err := runAgent(args...); err == nil || !strings.Contains(err.Error(), "--postgres backs up or restores a PostgreSQL server itself") {
			t.Errorf("%v: %v", args, err)
		}
	}
}
