package pgchart

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/chartpilot/chartpilot/internal/testing/testpg"
	"github.com/chartpilot/chartpilot/internal/testing/testwait"
)

// TestReplicaClonedAsSuperuserRepointed: a replica cloned as the
// superuser (as an older chart cloned, and as this one does while pod 0
// has no replication role) keeps the superuser's password in
// postgresql.auto.conf, where a role that may read the server's files
// reads it. At its next start the init container points it at the
// replication role (a password with quotes, a backslash, a colon and a
// space) through a passfile, and it streams as that role with no password
// in its configuration: not even a pg_monitor role reads one there.
func TestReplicaClonedAsSuperuserRepointed(t *testing.T) {
	r := testpg.NewRunner(t, testpg.Bin(t))
	ports := []int{testpg.FreePort(t), testpg.FreePort(t)}
	for ports[1] == ports[0] {
		ports[1] = testpg.FreePort(t)
	}
	rd := render(t, map[string]any{"image": map[string]any{"binDir": testpg.Bin(t)}, "replicas": 2, "service": map[string]any{"port": ports[0]}})
	rd.replication = `r'e\p l=1:x`
	root := r.TempDir(t)
	init := rd.sts.Spec.Template.Spec.InitContainers[0]
	main := rd.sts.Spec.Template.Spec.Containers[0]
	primary := newPod(t, r, rd, root, 0, ports[0])
	primary.runInit(rd)
	primary.start(rd)
	primary.waitProbe(main.StartupProbe, ports[0])

	replica := newPod(t, r, rd, root, 1, ports[1])
	// As an older chart cloned: as the superuser, its password written by -R.
	env := replica.containerEnv(rd, init)
	if out, err := replica.sh(`PGPASSWORD="$POSTGRES_PASSWORD" `+testpg.Bin(t)+`/pg_basebackup -h 127.0.0.1 -p `+strconv.Itoa(ports[0])+` -U "$POSTGRES_USER" -D "$PGDATA" -X stream -R`, env); err != nil {
		t.Fatalf("cloning as the superuser: %v\n%s", err, out)
	}
	autoConf := filepath.Join(replica.env["PGDATA"], "postgresql.auto.conf")
	if b, _ := os.ReadFile(autoConf); !strings.Contains(string(b), rd.password) {
		t.Fatalf("the superuser's clone has no superuser password in postgresql.auto.conf: the test shows nothing\n%s", b)
	}
	replica.runInit(rd)
	b, err := os.ReadFile(autoConf)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(b), rd.password) || strings.Contains(string(b), "password=") {
		t.Errorf("a password is still in the replica's postgresql.auto.conf:\n%s", b)
	}
	if fi, err := os.Stat(autoConf); err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("postgresql.auto.conf: %v, mode %v, want 0600", err, fi.Mode().Perm())
	}
	replica.start(rd)
	replica.waitProbe(main.StartupProbe, ports[0])
	outside := outsideAddress(t)
	var got string
	if !testwait.Until(2*time.Minute, 200*time.Millisecond, func() bool {
		got, _ = psql(r, outside, primary.port, rd.username, rd.password, "select string_agg(usename::text, ',') from pg_stat_replication")
		return got == "replicator"
	}) {
		t.Fatalf("the repointed replica streams as %q, want replicator", got)
	}
	// A role that may read settings (pg_monitor) reads primary_conninfo:
	// no password in it, of either role.
	if _, err := psql(r, outside, primary.port, rd.username, rd.password, "create role mon login password 'mon-pw-1' in role pg_monitor"); err != nil {
		t.Fatal(err)
	}
	var conninfo string
	if !testwait.Until(time.Minute, 200*time.Millisecond, func() bool {
		conninfo, err = psql(r, outside, replica.port, "mon", "mon-pw-1", "show primary_conninfo")
		return err == nil
	}) {
		t.Fatalf("show primary_conninfo as pg_monitor: %v", err)
	}
	if strings.Contains(conninfo, rd.replication) || strings.Contains(conninfo, rd.password) || !strings.Contains(conninfo, "passfile=") {
		t.Errorf("primary_conninfo as a pg_monitor role reads it: %s", conninfo)
	}
	if _, err := psql(r, outside, primary.port, rd.username, rd.password, "create table after_repoint (id int); insert into after_repoint values (7)"); err != nil {
		t.Fatal(err)
	}
	if !testwait.Until(time.Minute, 200*time.Millisecond, func() bool {
		got, _ = psql(r, outside, replica.port, rd.username, rd.password, "select id from after_repoint")
		return got == "7"
	}) {
		t.Fatalf("a row written after the repoint is not on the replica: %q", got)
	}
}
