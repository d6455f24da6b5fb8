package instance

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// A server's lock files (postmaster.pid in the data directory, and
// .s.PGSQL.PORT.lock beside its socket) name the postmaster's process. A
// container restarted on the same volumes finds the files of a postmaster
// that died with the old container, naming a process number that, in the
// new container's own process numbering, may well be alive: one of this
// manager's threads, a probe. PostgreSQL then refuses to start ("lock file
// already exists") for as long as that process lives. Before a start, a
// lock file whose process is not a PostgreSQL server is removed; one that
// names a live server is left, and the start fails as it should.

// clearStaleLocks removes the lock files of this server's data directory
// and socket whose process is not a running PostgreSQL server, and says
// so in the log.
func (s *server) clearStaleLocks() error {
	socket := filepath.Join(s.cfg.SocketDir, ".s.PGSQL."+strconv.Itoa(s.cfg.Port))
	for _, lock := range []struct{ file, also string }{
		{filepath.Join(s.cfg.DataDir, "postmaster.pid"), ""},
		{socket + ".lock", socket},
	} {
		pid, stale, err := staleLock(lock.file)
		if err != nil || !stale {
			continue // absent, unreadable or a live server's: PostgreSQL judges it
		}
		if err := os.Remove(lock.file); err != nil && !os.IsNotExist(err) {
			return fmt.Errorf("removing the stale lock file %s: %w", lock.file, err)
		}
		if lock.also != "" {
			if err := os.Remove(lock.also); err != nil && !os.IsNotExist(err) {
				return fmt.Errorf("removing the stale socket %s: %w", lock.also, err)
			}
		}
		s.cfg.Log.Info("Removed a lock file left by a server that is not running", "file", lock.file, "pid", pid)
	}
	return nil
}

// staleLock reads the process number on a lock file's first line and
// reports whether no PostgreSQL server runs under it (no process, or a
// process of another program).
func staleLock(file string) (pid int, stale bool, err error) {
	b, err := os.ReadFile(file)
	if err != nil {
		return 0, false, err
	}
	first, _, _ := strings.Cut(string(b), "\n")
	pid, err = strconv.Atoi(strings.TrimSpace(first))
	if err != nil || pid <= 0 {
		return 0, false, fmt.Errorf("%s: no process number on its first line", file)
	}
	comm, err := os.ReadFile(fmt.Sprintf("/proc/%d/comm", pid))
	if os.IsNotExist(err) {
		return pid, true, nil
	}
	if err != nil {
		return pid, false, err
	}
	return pid, string(bytes.TrimSpace(comm)) != "postgres", nil
}
