package instance

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"

	"github.com/chartpilot/chartpilot/internal/testing/testpg"
)

// TestDataDirectoryMadeWhole: a data directory is renamed into place only
// once it is complete and configured. A clone that fails halfway (a killed
// pg_basebackup) leaves no data directory and no PG_VERSION, so the member
// starts over; a complete one is there, configured; a rewind's marker,
// left by a rewind that did not finish, makes the member clone again.
func TestDataDirectoryMadeWhole(t *testing.T) {
	r := testpg.NewRunner(t, testpg.Bin(t))
	root := r.TempDir(t)
	s := &server{cfg: &Config{
		Bin: testpg.Bin(t), DataDir: filepath.Join(root, "pgdata"), SocketDir: root, User: "postgres",
		HostAuth: "trust", ReplicationNetwork: "127.0.0.1/32", ListenAddress: "127.0.0.1", Port: 5432,
		Credential: &syscall.Credential{Uid: uint32(r.UID), Gid: uint32(r.GID)},
	}}
	halfway := errors.New("killed halfway")
	err := s.made(func(dir string) error {
		if _, err := s.run("initdb", "-D", dir, "-U", "postgres", "--no-sync"); err != nil {
			return err
		}
		return halfway // the files are there, the clone did not finish
	})
	if !errors.Is(err, halfway) {
		t.Fatalf("made: %v, want the fill's error", err)
	}
	if s.initialized() {
		t.Fatal("a data directory whose clone failed counts as initialized")
	}
	if _, err := os.Stat(s.cfg.DataDir + ".new"); !os.IsNotExist(err) {
		t.Errorf("the half-made directory is left: %v", err)
	}

	if err := s.initdb(); err != nil {
		t.Fatal(err)
	}
	if !s.initialized() {
		t.Fatal("initdb made no data directory")
	}
	conf, err := os.ReadFile(filepath.Join(s.cfg.DataDir, "postgresql.conf"))
	if err != nil || !slices.Contains(strings.Split(string(conf), "\n"), "include_if_exists = 'chartpilot.conf'") {
		t.Errorf("the data directory is not configured: %v", err)
	}
	if _, err := os.Stat(filepath.Join(s.cfg.DataDir, "chartpilot.conf")); err != nil {
		t.Errorf("chartpilot.conf: %v", err)
	}

	if err := writeAs(s.cfg, s.rewindMarker(), nil); err != nil {
		t.Fatal(err)
	}
	if s.initialized() {
		t.Error("a data directory whose rewind did not finish counts as initialized")
	}
}
