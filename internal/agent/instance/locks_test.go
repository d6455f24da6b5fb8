package instance

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/go-logr/logr/testr"

	"github.com/chartpilot/chartpilot/internal/testing/testpg"
)

// TestStartsOverLocksOfADeadServer: a restarted container finds the lock
// files of its dead postmaster naming a process number that is alive in
// the new container (here a sleep of the server's own user, which
// PostgreSQL takes for the lock's owner). The server starts: the locks
// are removed, since no PostgreSQL server runs under that number. The
// locks of the running server are then left in place.
func TestStartsOverLocksOfADeadServer(t *testing.T) {
	r := testpg.NewRunner(t, testpg.Bin(t))
	root := r.TempDir(t)
	s := &server{cfg: &Config{
		Bin: testpg.Bin(t), DataDir: filepath.Join(root, "pgdata"), SocketDir: root, LogDir: root, Member: "m",
		User: "postgres", HostAuth: "trust", ReplicationNetwork: "127.0.0.1/32", ListenAddress: "127.0.0.1", Port: testpg.FreePort(t),
		Credential: &syscall.Credential{Uid: uint32(r.UID), Gid: uint32(r.GID)}, Log: testr.New(t),
	}}
	if err := s.initdb(); err != nil {
		t.Fatal(err)
	}
	other := exec.Command("sleep", "600")
	other.SysProcAttr = &syscall.SysProcAttr{Credential: s.cfg.Credential}
	if err := other.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = other.Process.Kill(); _ = other.Wait() })
	pid := strconv.Itoa(other.Process.Pid)
	socket := filepath.Join(root, ".s.PGSQL."+strconv.Itoa(s.cfg.Port))
	locks := []string{filepath.Join(s.cfg.DataDir, "postmaster.pid"), socket + ".lock"}
	for _, f := range locks {
		if err := writeAs(s.cfg, f, []byte(pid+"\n"+s.cfg.DataDir+"\n")); err != nil {
			t.Fatal(err)
		}
	}
	if err := writeAs(s.cfg, socket, nil); err != nil { // the dead server's socket
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if err := s.start(ctx); err != nil {
		t.Fatalf("start over the locks of a dead server: %v", err)
	}
	t.Cleanup(func() { s.stop(false) })
	if err := s.clearStaleLocks(); err != nil {
		t.Fatal(err)
	}
	for _, f := range locks {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatalf("the running server's lock %s: %v", f, err)
		}
		if want := strconv.Itoa(int(s.pid.Load())); string(b[:len(want)]) != want {
			t.Errorf("lock %s names %q, want the running server %s", f, b, want)
		}
	}
}
