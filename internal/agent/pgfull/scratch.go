package pgfull

import (
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// Scratch is a throwaway PostgreSQL server of this process's own: a data
// directory made by initdb, reached only through a socket in its
// directory (no TCP), trusted for local connections, without durability
// (nothing of it outlives the drill). Its environment holds nothing of
// this process's: a role's code that reached it could read no credential
// there.
type Scratch struct {
	dir, bin string
	// user is the server's superuser: a random name, which no role of
	// a backup can have (it would be taken for the server's own).
	user   string
	cred   *syscall.Credential
	cmd    *exec.Cmd
	exited chan error
}

// serverBin is the directory of initdb and postgres: PATH's, else the
// newest under /usr/lib/postgresql (Debian's layout, which its images and
// the official ones share).
func serverBin() (string, error) {
	if p, err := exec.LookPath("initdb"); err == nil {
		return filepath.Dir(p), nil
	}
	dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	sort.Slice(dirs, func(i, j int) bool {
		a, _ := strconv.Atoi(filepath.Base(filepath.Dir(dirs[i])))
		b, _ := strconv.Atoi(filepath.Base(filepath.Dir(dirs[j])))
		return a > b
	})
	for _, d := range dirs {
		if _, err := os.Stat(filepath.Join(d, "initdb")); err == nil {
			return d, nil
		}
	}
	return "", errors.New("no initdb in PATH or under /usr/lib/postgresql/*/bin: a restore drill starts a server of its own from the database's image")
}

// StartScratch initialises and starts a scratch server in a new directory
// below parent; Stop removes it. Its commands run as cred (nil: this
// process's user; PostgreSQL refuses root).
func StartScratch(ctx context.Context, parent string, cred *syscall.Credential) (*Scratch, error) {
	bin, err := serverBin()
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp(parent, "chartpilot-scratch-")
	if err != nil {
		return nil, fmt.Errorf("the scratch server's directory: %w", err)
	}
	s := &Scratch{dir: dir, bin: bin, cred: cred, user: "chartpilot_scratch_" + hex.EncodeToString(randomBytes(8))}
	if cred != nil {
		if err := os.Chown(dir, int(cred.Uid), int(cred.Gid)); err != nil {
			os.RemoveAll(dir)
			return nil, err
		}
	}
	env := []string{"LANG=C.UTF-8", "PATH=" + bin + ":/usr/bin:/bin"}
	initdb := exec.CommandContext(ctx, filepath.Join(bin, "initdb"), "-D", filepath.Join(dir, "data"), "-U", s.user,
		"--auth=trust", "-E", "UTF8", "--no-sync", "--no-instructions")
	initdb.Env = env
	initdb.SysProcAttr = &syscall.SysProcAttr{Credential: cred}
	if out, err := initdb.CombinedOutput(); err != nil {
		os.RemoveAll(dir)
		return nil, fmt.Errorf("initdb of the scratch server: %w: %s", err, lastLine(string(out)))
	}
	logf, err := os.Create(filepath.Join(dir, "server.log"))
	if err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	defer logf.Close()
	if cred != nil {
		if err := logf.Chown(int(cred.Uid), int(cred.Gid)); err != nil {
			os.RemoveAll(dir)
			return nil, err
		}
	}
	s.cmd = exec.Command(filepath.Join(bin, "postgres"), "-D", filepath.Join(dir, "data"),
		"-c", "listen_addresses=", "-c", "unix_socket_directories="+dir, "-c", "port=5432",
		"-c", "fsync=off", "-c", "full_page_writes=off", "-c", "synchronous_commit=off",
		"-c", "max_connections=20", "-c", "shared_buffers=32MB", "-c", "max_wal_size=1GB")
	s.cmd.Env = env
	s.cmd.Stdout, s.cmd.Stderr = logf, logf
	s.cmd.SysProcAttr = &syscall.SysProcAttr{Credential: cred, Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := s.cmd.Start(); err != nil {
		os.RemoveAll(dir)
		return nil, fmt.Errorf("starting the scratch server: %w", err)
	}
	s.exited = make(chan error, 1)
	go func() { s.exited <- s.cmd.Wait() }()
	deadline := time.Now().Add(2 * time.Minute)
	for {
		if _, err := s.Commander().run(ctx, nil, nil, nil, "psql", "-X", "-A", "-t", "-q", "--dbname", "postgres", "-c", "SELECT 1"); err == nil {
			return s, nil
		}
		select {
		case err := <-s.exited:
			s.exited <- err
			b, _ := os.ReadFile(logf.Name())
			s.Stop()
			return nil, fmt.Errorf("the scratch server did not start: %v: %s", err, lastLine(string(b)))
		case <-time.After(200 * time.Millisecond):
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			s.Stop()
			return nil, errors.New("the scratch server did not answer within 2 minutes")
		}
	}
}

// Commander runs the client tools against the scratch server as its
// superuser.
func (s *Scratch) Commander() Commander {
	return func(ctx context.Context, env []string, name string, args ...string) *exec.Cmd {
		path := name
		if p, err := exec.LookPath(name); err == nil {
			path = p
		} else if _, err := os.Stat(filepath.Join(s.bin, name)); err == nil {
			path = filepath.Join(s.bin, name)
		}
		cmd := exec.CommandContext(ctx, path, args...)
		cmd.Env = append([]string{"LANG=C.UTF-8", "PATH=" + s.bin + ":/usr/bin:/bin", "PGCLIENTENCODING=UTF8",
			"PGHOST=" + s.dir, "PGPORT=5432", "PGUSER=" + s.user, "PGDATABASE=postgres"}, env...)
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: s.cred}
		return cmd
	}
}

// Stop ends the server (fast shutdown, then SIGKILL) and removes its
// directory.
func (s *Scratch) Stop() {
	if s.cmd != nil && s.cmd.Process != nil {
		_ = s.cmd.Process.Signal(syscall.SIGINT)
		select {
		case <-s.exited:
		case <-time.After(30 * time.Second):
			_ = syscall.Kill(-s.cmd.Process.Pid, syscall.SIGKILL)
			<-s.exited
		}
	}
	_ = os.RemoveAll(s.dir)
}

func lastLine(s string) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return lines[len(lines)-1]
}

// DrillScratch is a restore drill of a backup stream in a server of its
// own (StartScratch below dir): a full backup (Magic already read; see
// IsFull) restored whole, roles included, as a restore would restore it
// (one database's pg_dump -Fc, full false, is refused: it has no roles).
// The server backed up is never touched. It returns the tables of every
// database restored.
func DrillScratch(ctx context.Context, r io.Reader, full bool, dir string, cred *syscall.Credential) (int, error) {
	if !full {
		return 0, errors.New("the backup is one database's pg_dump, from before backups were full: a drill restores a backup whole, roles included, in a server of its own, " +
			"and this one has no roles; take a new backup (every backup is full now) and drill that")
	}
	s, err := StartScratch(ctx, dir, cred)
	if err != nil {
		return 0, err
	}
	defer s.Stop()
	c := s.Commander()
	if _, err := RestoreWith(ctx, r, c, Options{StageDir: dir}); err != nil {
		return 0, err
	}
	dbs, err := Databases(ctx, c)
	if err != nil {
		return 0, err
	}
	tables := 0
	for _, db := range dbs {
		out, err := c.run(ctx, []string{"PGDATABASE=" + db}, nil, nil, "psql", "-X", "-A", "-t", "-v", "ON_ERROR_STOP=1", "-c",
			"SELECT count(*) FROM pg_catalog.pg_tables WHERE schemaname NOT IN ('pg_catalog', 'information_schema')")
		if err != nil {
			return 0, err
		}
		n, err := strconv.Atoi(strings.TrimSpace(out))
		if err != nil {
			return 0, err
		}
		tables += n
	}
	return tables, nil
}
