package instance

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"
)

// server runs one PostgreSQL server and the client commands against it.
type server struct {
	cfg *Config
	cmd *exec.Cmd
	// exited is closed when the running server exits.
	exited chan struct{}
	// pid is the running server's process (0: none), for signals from
	// other goroutines.
	pid atomic.Int64
	// passfileSuperuser: the passfile holds the superuser's password.
	passfileSuperuser bool
}

func (s *server) bin(name string) string { return filepath.Join(s.cfg.Bin, name) }

// command is a binary of the server's installation as the server's user.
// Nothing of the manager's environment (the superuser's password) goes
// with it: the server may be made to read its environment and memory
// (pg_read_binary_file). The WAL archive's credentials are in the
// wal-agent container, never here.
func (s *server) command(name string, args ...string) *exec.Cmd {
	cmd := exec.Command(s.bin(name), args...)
	// Passwords come from the passfile (see writePassfile): the server's
	// WAL receiver reads it too.
	cmd.Env = []string{"PATH=" + s.cfg.Bin + ":/usr/bin:/bin", "LANG=C", "PGCONNECT_TIMEOUT=3", "PGPASSFILE=" + s.passfile()}
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: s.cfg.Credential, Setpgid: true, Pdeathsig: syscall.SIGKILL}
	return cmd
}

func (s *server) run(name string, args ...string) (string, error) {
	cmd := s.command(name, args...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	if err != nil {
		return out.String(), fmt.Errorf("%s %s: %w: %s", name, strings.Join(args, " "), err, strings.TrimSpace(lastLines(out.String(), 5)))
	}
	return out.String(), nil
}

// logTail is the last n lines of the server's log file, on one line.
func logTail(file string, n int) string {
	b, err := os.ReadFile(file)
	if err != nil {
		return err.Error()
	}
	return strings.ReplaceAll(lastLines(string(b), n), "\n", " | ")
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// initialized reports whether the data directory holds a cluster.
// A rewind interrupted halfway (its marker left) leaves a data directory
// that only a new clone repairs: it does not count as one.
func (s *server) initialized() bool {
	if _, err := os.Stat(s.rewindMarker()); err == nil {
		return false
	}
	_, err := os.Stat(filepath.Join(s.cfg.DataDir, "PG_VERSION"))
	return err == nil
}

// rewindMarker exists, beside the data directory, while pg_rewind changes it.
func (s *server) rewindMarker() string { return s.cfg.DataDir + ".rewinding" }

// made builds a new data directory: fill (initdb or pg_basebackup) writes
// it beside the data directory, it is configured and synced to disk, and
// only then renamed into place. A member killed halfway leaves no
// PG_VERSION in the data directory and starts over; no server starts on
// files that a node crash could still take away.
func (s *server) made(fill func(dir string) error) error {
	dir := s.cfg.DataDir + ".new"
	if err := os.RemoveAll(dir); err != nil {
		return err
	}
	if err := mkdirAs(s.cfg, dir); err != nil {
		return err
	}
	if err := fill(dir); err != nil {
		_ = os.RemoveAll(dir)
		return err
	}
	if err := s.configure(dir); err != nil {
		return err
	}
	if _, err := s.run("initdb", "--sync-only", "-D", dir); err != nil {
		return err
	}
	if err := os.RemoveAll(s.cfg.DataDir); err != nil {
		return err
	}
	if err := os.Rename(dir, s.cfg.DataDir); err != nil {
		return err
	}
	return syncDir(filepath.Dir(s.cfg.DataDir))
}

// syncDir makes the entries of dir (a rename, a removal) durable.
func syncDir(dir string) error {
	f, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer f.Close()
	return f.Sync()
}

// isStandby reports whether the data directory starts as a standby.
func (s *server) isStandby() bool {
	_, err := os.Stat(filepath.Join(s.cfg.DataDir, "standby.signal"))
	return err == nil
}

func (s *server) running() bool {
	if s.cmd == nil {
		return false
	}
	select {
	case <-s.exited:
		return false
	default:
		return true
	}
}

// conninfo reaches a member's server as user, for replication and
// rewinds (the password is the passfile's).
func (s *server) conninfo(address, user string) string {
	host, port, _ := strings.Cut(address, ":")
	ci := fmt.Sprintf("host=%s port=%s user=%s application_name=%s connect_timeout=3", host, port, user, s.cfg.Member)
	if s.cfg.TLSCAFile != "" {
		// The member's certificate must be the cluster CA's, for its name.
		ci += " sslmode=verify-full sslrootcert=" + s.cfg.TLSCAFile
	}
	return ci
}

// overrides are the settings replication and rewinds need, over any
// configuration file.
func (s *server) overrides() []string {
	return []string{
		"listen_addresses=" + s.cfg.ListenAddress,
		"port=" + strconv.Itoa(s.cfg.Port),
		"unix_socket_directories=" + s.cfg.SocketDir,
		"wal_level=replica",
		"hot_standby=on",
		"wal_log_hints=on",
	}
}

// settings are written to postgresql.conf's include (chartpilot.conf).
func (s *server) settings() string {
	return fmt.Sprintf(`listen_addresses = '%s'
port = %d
unix_socket_directories = '%s'
wal_level = replica
max_wal_senders = 10
max_replication_slots = 10
hot_standby = on
wal_log_hints = on
wal_keep_size = '256MB'
`, s.cfg.ListenAddress, s.cfg.Port, s.cfg.SocketDir)
}

// initdb makes a new cluster (the first primary), with the superuser's
// password when there is one.
func (s *server) initdb() error {
	return s.made(func(dir string) error {
		// --no-sync: made syncs the directory once it is configured.
		args := []string{"-D", dir, "-U", s.cfg.User, "--auth-local=trust", "--auth-host=" + s.cfg.HostAuth, "--no-sync"}
		if s.cfg.Password != "" {
			pw := filepath.Join(s.cfg.SocketDir, ".initdb-password")
			if err := writeAs(s.cfg, pw, []byte(s.cfg.Password+"\n")); err != nil {
				return err
			}
			defer os.Remove(pw)
			args = append(args, "--pwfile="+pw)
		}
		_, err := s.run("initdb", args...)
		return err
	})
}

// configure writes chartpilot.conf into data directory dir, includes it
// and admits replication from the members' network.
func (s *server) configure(dir string) error {
	conf := filepath.Join(dir, "chartpilot.conf")
	if err := writeAs(s.cfg, conf, []byte(s.settings())); err != nil {
		return err
	}
	main := filepath.Join(dir, "postgresql.conf")
	b, err := os.ReadFile(main)
	if err != nil {
		return err
	}
	if !bytes.Contains(b, []byte("include_if_exists = 'chartpilot.conf'")) {
		b = append(b, []byte("\ninclude_if_exists = 'chartpilot.conf'\n")...)
		if err := writeAs(s.cfg, main, b); err != nil {
			return err
		}
	}
	if s.cfg.HBAFile != "" {
		return nil // the given pg_hba.conf admits replication
	}
	hba := filepath.Join(dir, "pg_hba.conf")
	b, err = os.ReadFile(hba)
	if err != nil {
		return err
	}
	line := fmt.Sprintf("host replication %s %s %s\n", s.cfg.User, s.cfg.ReplicationNetwork, s.cfg.HostAuth)
	if !bytes.Contains(b, []byte(line)) {
		b = append(b, []byte(line)...)
		return writeAs(s.cfg, hba, b)
	}
	return nil
}

func writeAs(cfg *Config, path string, b []byte) error {
	if err := os.WriteFile(path, b, 0o600); err != nil {
		return err
	}
	if cfg.Credential != nil {
		return os.Chown(path, int(cfg.Credential.Uid), int(cfg.Credential.Gid))
	}
	return nil
}

// basebackup clones a new standby from the primary at address, as user.
// The old data directory, judged unusable, goes first: a volume need not
// hold two copies.
func (s *server) basebackup(address, user string) error {
	if err := os.RemoveAll(s.cfg.DataDir); err != nil {
		return err
	}
	if err := os.Remove(s.rewindMarker()); err != nil && !os.IsNotExist(err) {
		return err
	}
	return s.made(func(dir string) error {
		// --no-sync: made syncs the directory once it is configured.
		_, err := s.run("pg_basebackup", "-d", s.conninfo(address, user), "-D", dir, "-X", "stream", "-R", "--no-sync")
		return err
	})
}

func mkdirAs(cfg *Config, dir string) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	if cfg.Credential != nil {
		return os.Chown(dir, int(cfg.Credential.Uid), int(cfg.Credential.Gid))
	}
	return nil
}

// start runs the server; it returns once it accepts connections.
func (s *server) start(ctx context.Context) error {
	if s.running() {
		return nil
	}
	if err := s.clearStaleLocks(); err != nil {
		return err
	}
	args := []string{"-D", s.cfg.DataDir}
	if s.cfg.ConfigFile != "" {
		args = append(args, "-c", "config_file="+s.cfg.ConfigFile)
		for _, kv := range s.overrides() {
			args = append(args, "-c", kv)
		}
	}
	if s.cfg.HBAFile != "" {
		args = append(args, "-c", "hba_file="+s.cfg.HBAFile)
	}
	cmd := s.command("postgres", args...)
	logf, err := os.OpenFile(filepath.Join(s.cfg.LogDir, s.cfg.Member+"-postgres.log"), os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		return err
	}
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		logf.Close()
		return err
	}
	s.cmd, s.exited = cmd, make(chan struct{})
	s.pid.Store(int64(cmd.Process.Pid))
	exited := s.exited
	go func() {
		_ = cmd.Wait()
		s.pid.Store(0)
		logf.Close()
		close(exited)
	}()
	deadline := time.Now().Add(2 * time.Minute)
	for time.Now().Before(deadline) {
		if !s.running() {
			return fmt.Errorf("postgres exited at start: %s (log %s)", logTail(logf.Name(), 3), logf.Name())
		}
		if _, err := s.run("pg_isready", "-h", s.cfg.SocketDir, "-p", strconv.Itoa(s.cfg.Port), "-U", s.cfg.User, "-t", "1"); err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
	return errors.New("postgres did not accept connections within 2 minutes")
}

// stop stops the server: fast (a clean shutdown) or immediate (fencing:
// no more writes, now).
func (s *server) stop(immediate bool) {
	if !s.running() {
		return
	}
	sig := syscall.SIGINT // fast shutdown
	if immediate {
		sig = syscall.SIGQUIT
	}
	_ = s.cmd.Process.Signal(sig)
	select {
	case <-s.exited:
	case <-time.After(30 * time.Second):
		_ = syscall.Kill(-s.cmd.Process.Pid, syscall.SIGKILL)
		<-s.exited
	}
}

// signal sends sig to the running server (safe from any goroutine).
func (s *server) signal(sig syscall.Signal) {
	if pid := s.pid.Load(); pid > 0 {
		_ = syscall.Kill(int(pid), sig)
	}
}

// query runs SQL on the local server through its socket.
func (s *server) query(sql string) (string, error) {
	out, err := s.run("psql", "-X", "-A", "-t", "-q", "-h", s.cfg.SocketDir, "-p", strconv.Itoa(s.cfg.Port), "-U", s.cfg.User, "-d", "postgres", "-v", "ON_ERROR_STOP=1", "-c", sql)
	return strings.TrimSpace(out), err
}

// script runs a SQL script on the local server, read from standard input
// (what it holds appears on no command line), in one session.
func (s *server) script(sql string) (string, error) {
	cmd := s.command("psql", "-X", "-A", "-t", "-q", "-h", s.cfg.SocketDir, "-p", strconv.Itoa(s.cfg.Port), "-U", s.cfg.User, "-d", "postgres", "-v", "ON_ERROR_STOP=1", "-f", "-")
	cmd.Stdin = strings.NewReader(sql)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		// Neither the script nor a line quoting it is repeated: it may
		// carry a verifier.
		var lines []string
		for _, l := range strings.Split(lastLines(out.String(), 5), "\n") {
			if !strings.Contains(l, "SCRAM-SHA-256$") {
				lines = append(lines, l)
			}
		}
		return "", fmt.Errorf("psql script: %w: %s", err, strings.TrimSpace(strings.Join(lines, "\n")))
	}
	return strings.TrimSpace(out.String()), nil
}

// recoverCleanly runs crash recovery without accepting any connection
// (single-user mode), so that a data directory left by a crash can be
// rewound.
func (s *server) recoverCleanly() error {
	if err := s.clearStaleLocks(); err != nil {
		return err
	}
	cmd := s.command("postgres", "--single", "-D", s.cfg.DataDir, "-c", "listen_addresses=", "postgres")
	cmd.Stdin = strings.NewReader("")
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("crash recovery in single-user mode: %w: %s", err, lastLines(out.String(), 5))
	}
	return nil
}

// rewind makes a stopped server a standby of the primary at address,
// undoing what it wrote after the two diverged; it reads the primary's
// files as user.
func (s *server) rewind(address, user string) error {
	if err := s.recoverCleanly(); err != nil {
		return err
	}
	// pg_rewind changes the data directory in place: until it and the
	// configuration are on disk, a marker says the directory needs a new
	// clone.
	if err := writeAs(s.cfg, s.rewindMarker(), nil); err != nil {
		return err
	}
	if err := syncDir(filepath.Dir(s.cfg.DataDir)); err != nil {
		return err
	}
	if _, err := s.run("pg_rewind", "-D", s.cfg.DataDir, "--source-server="+s.conninfo(address, user)+" dbname=postgres", "-R"); err != nil {
		return err
	}
	if err := s.configure(s.cfg.DataDir); err != nil {
		return err
	}
	if _, err := s.run("initdb", "--sync-only", "-D", s.cfg.DataDir); err != nil {
		return err
	}
	if err := os.Remove(s.rewindMarker()); err != nil {
		return err
	}
	return syncDir(filepath.Dir(s.cfg.DataDir))
}

// follow points this standby at the primary at address, streaming as
// user (written for the next start, and reloaded when running).
func (s *server) follow(address, user string) error {
	auto := filepath.Join(s.cfg.DataDir, "postgresql.auto.conf")
	b, _ := os.ReadFile(auto)
	var keep []string
	for _, l := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(strings.TrimSpace(l), "primary_conninfo") || strings.TrimSpace(l) == "" {
			continue
		}
		keep = append(keep, l)
	}
	keep = append(keep, fmt.Sprintf("primary_conninfo = '%s'", strings.ReplaceAll(s.conninfo(address, user), "'", "''")))
	if err := writeAs(s.cfg, auto, []byte(strings.Join(keep, "\n")+"\n")); err != nil {
		return err
	}
	if err := writeAs(s.cfg, filepath.Join(s.cfg.DataDir, "standby.signal"), nil); err != nil {
		return err
	}
	if s.running() {
		_, err := s.query("SELECT pg_reload_conf()")
		return err
	}
	return nil
}

// lsn is the server's position: written WAL on a primary; on a standby
// the further of WAL received and flushed and WAL replayed (a standby
// restarted without its primary replays WAL it had received before, while
// its receiver, asking for a segment, reports that segment's start).
func (s *server) lsn(primary bool) (uint64, error) {
	q := "SELECT GREATEST(pg_last_wal_receive_lsn(), pg_last_wal_replay_lsn())"
	if primary {
		q = "SELECT pg_current_wal_lsn()"
	}
	out, err := s.query(q)
	if err != nil {
		return 0, err
	}
	if out == "" {
		return 0, errors.New("the standby has neither received nor replayed WAL yet")
	}
	return parseLSN(out)
}

// timeline is the server's timeline: the one it writes on a primary; on a
// standby the newest its WAL directory has a history file of (a standby
// gets the file when it follows a timeline switch; its last restartpoint's
// timeline, in the control file, can be minutes old), 1 when none.
func (s *server) timeline(primary bool) (uint64, error) {
	q := "SELECT timeline_id FROM pg_control_checkpoint()"
	if !primary {
		q = `SELECT COALESCE(max(('x' || substr(name, 1, 8))::bit(32)::bigint), 1) FROM pg_ls_waldir() WHERE name ~ '^[0-9A-F]{8}[.]history$'`
	}
	out, err := s.query(q)
	if err != nil {
		return 0, err
	}
	return strconv.ParseUint(out, 10, 32)
}

// synchronousStandbys names, on a primary, the standbys whose flush
// acknowledges commits now (their application_name is their member name).
func (s *server) synchronousStandbys() (string, error) {
	return s.query("SELECT COALESCE(string_agg(application_name, ',' ORDER BY application_name), '') FROM pg_stat_replication WHERE sync_state IN ('sync', 'quorum')")
}

// parseLSN reads "16/B374D848".
func parseLSN(s string) (uint64, error) {
	hi, lo, ok := strings.Cut(strings.TrimSpace(s), "/")
	if !ok {
		return 0, fmt.Errorf("LSN %q", s)
	}
	h, err1 := strconv.ParseUint(hi, 16, 32)
	l, err2 := strconv.ParseUint(lo, 16, 32)
	if err1 != nil || err2 != nil {
		return 0, fmt.Errorf("LSN %q", s)
	}
	return h<<32 | l, nil
}

func formatLSN(l uint64) string { return fmt.Sprintf("%X/%X", l>>32, uint32(l)) }
