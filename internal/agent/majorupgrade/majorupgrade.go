// Package majorupgrade moves a PostgreSQL database to a new major version:
// writes stopped on the old server, everything dumped (pgfull: roles as
// rows, each database with pg_dump) and
// restored into a new data directory initialised by the new major's
// initdb, then every table's row count and checksum compared on both. The
// old data directory is only read. Any failure leaves the old server
// serving writes again, removes the new data directory, and names the step.
package majorupgrade

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/chartpilot/chartpilot/internal/agent/pgfull"
	"github.com/chartpilot/chartpilot/internal/agent/pgproc"
)

// Steps, in order (Plan.Fail injects a failure at one of them).
const (
	StepStopWrites = "stop-writes"
	StepDump       = "dump"
	StepInit       = "init"
	StepStart      = "start-new"
	StepRestore    = "restore"
	StepVerify     = "verify"
	StepStop       = "stop-new"
)

// Steps lists the steps in order.
var Steps = []string{StepStopWrites, StepDump, StepInit, StepStart, StepRestore, StepVerify, StepStop}

// Plan is one major upgrade.
type Plan struct {
	// ClientBin holds psql, pg_dump and pg_restore (the newest client the machine
	// has); NewBin the new major's initdb and postgres.
	ClientBin, NewBin string
	// OldHost and OldPort reach the old server (a socket directory or a host).
	OldHost string
	OldPort int
	// OldEnv is libpq's environment for the old server alone (how it is
	// authenticated: PGSSLMODE, PGSSLROOTCERT, PGCHANNELBINDING,
	// PGREQUIREAUTH); the new server is reached through its socket.
	OldEnv []string
	// NewData is created; WorkDir holds the dump and the new server's socket.
	NewData, WorkDir string
	NewPort          int
	User, Password   string
	// Credential runs the commands as the servers' user (nil: this process's).
	Credential *syscall.Credential
	// Fail makes the step of that name fail (tests).
	Fail string
	Log  func(step, msg string)
}

// Result is what a finished upgrade moved.
type Result struct {
	Databases, Tables int
	Rows              int64
	Took              time.Duration
}

// Error is a failed upgrade: the step and the cause.
type Error struct {
	Step string
	Err  error
}

func (e *Error) Error() string {
	return fmt.Sprintf("major upgrade failed at step %s (the old server serves writes again; the new data directory was removed): %v", e.Step, e.Err)
}

func (e *Error) Unwrap() error { return e.Err }

// Run carries the plan out.
func Run(ctx context.Context, p Plan) (res Result, err error) {
	start := time.Now()
	step := ""
	var newServer *exec.Cmd
	defer func() {
		if err == nil {
			return
		}
		if newServer != nil {
			pgproc.Stop(newServer)
		}
		_ = os.RemoveAll(p.NewData)
		// This session first: the server's default is still read-only.
		if _, rerr := p.psql(ctx, p.OldHost, p.OldPort, "postgres", "SET default_transaction_read_only = off", "ALTER SYSTEM RESET default_transaction_read_only", "SELECT pg_reload_conf()", releaseLogins); rerr != nil {
			err = errors.Join(err, fmt.Errorf("allowing writes on the old server again: %w", rerr))
		}
		err = &Error{Step: step, Err: err}
	}()
	do := func(name string, f func() error) error {
		step = name
		if p.Log != nil {
			p.Log(name, "")
		}
		if p.Fail == name {
			return errors.New("failure injected")
		}
		return f()
	}
	// The dump holds the roles' password hashes: it goes with the upgrade.
	dump := filepath.Join(p.WorkDir, "full.dump")
	_ = os.Remove(dump)
	defer os.Remove(dump)
	if err := do(StepStopWrites, func() error {
		// No other role may log in (a session could turn a read-only
		// default off; a role that cannot log in cannot write), new
		// transactions are read-only, and the sessions running end: client
		// backends, and walsenders connected to a database
		// (replication=database), which run SQL too. Standbys' physical
		// walsenders (no database) only stream.
		_, err := p.psql(ctx, p.OldHost, p.OldPort, "postgres", holdLogins, "ALTER SYSTEM SET default_transaction_read_only = on", "SELECT pg_reload_conf()",
			"SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE (backend_type = 'client backend' OR backend_type = 'walsender' AND datname IS NOT NULL) AND pid <> pg_backend_pid()")
		return err
	}); err != nil {
		return res, err
	}
	if err := do(StepDump, func() error {
		// Everything the server holds, its roles as rows (pgfull).
		f, err := os.OpenFile(dump, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
		if err != nil {
			return err
		}
		defer f.Close()
		if err := pgfull.Dump(ctx, f, p.commander(p.OldHost, p.OldPort)); err != nil {
			return fmt.Errorf("dumping: %w", err)
		}
		return f.Close()
	}); err != nil {
		return res, err
	}
	if err := do(StepInit, func() error {
		if _, err := os.Stat(p.NewData); err == nil {
			return fmt.Errorf("%s exists: the new major gets a new data directory", p.NewData)
		}
		args := []string{"-D", p.NewData, "-U", p.User, "--auth-local=trust", "--auth-host=scram-sha-256", "--no-sync"}
		if p.Password != "" {
			pw := filepath.Join(p.WorkDir, ".pw")
			if err := p.write(pw, []byte(p.Password+"\n")); err != nil {
				return err
			}
			defer os.Remove(pw)
			args = append(args, "--pwfile="+pw)
		}
		out, err := p.command(ctx, filepath.Join(p.NewBin, "initdb"), args...)
		if err != nil {
			return fmt.Errorf("initdb: %w: %s", err, out)
		}
		return nil
	}); err != nil {
		return res, err
	}
	if err := do(StepStart, func() error {
		var err error
		newServer, err = p.startNew(ctx)
		return err
	}); err != nil {
		return res, err
	}
	if err := do(StepRestore, func() error {
		// Each table's rows are loaded with no more rights than its
		// owner's (pgfull); the roles keep every attribute: it is the
		// same server.
		f, err := os.Open(dump)
		if err != nil {
			return err
		}
		defer f.Close()
		if _, err := f.Seek(int64(len(pgfull.Magic)), io.SeekStart); err != nil {
			return err
		}
		if _, err := pgfull.RestoreWith(ctx, f, p.commander(p.WorkDir, p.NewPort), pgfull.Options{Privileged: true, StageDir: p.WorkDir}); err != nil {
			return fmt.Errorf("restoring the dump: %w", err)
		}
		// The roles were dumped with their logins held: the new server
		// lets them in again.
		if _, err := p.psql(ctx, p.WorkDir, p.NewPort, "postgres", releaseLogins); err != nil {
			return fmt.Errorf("allowing logins on the new server: %w", err)
		}
		return nil
	}); err != nil {
		return res, err
	}
	if err := do(StepVerify, func() error {
		var err error
		res, err = p.verify(ctx)
		return err
	}); err != nil {
		return res, err
	}
	if err := do(StepStop, func() error {
		pgproc.Stop(newServer)
		newServer = nil
		// initdb ran with --no-sync: everything reaches the disk now.
		if out, err := p.command(ctx, filepath.Join(p.NewBin, "initdb"), "--sync-only", "-D", p.NewData); err != nil {
			return fmt.Errorf("initdb --sync-only: %w: %s", err, out)
		}
		return nil
	}); err != nil {
		return res, err
	}
	res.Took = time.Since(start)
	return res, nil
}

// loginHeld marks, as a setting of the role (which nothing reads), a role
// whose login the upgrade took away: it gives back exactly those, also
// after a process that held them died (the next attempt releases them
// when it fails, and the new server when it succeeds).
const loginHeld = "chartpilot.login_held"

// holdLogins takes the login of every role but the upgrade's own.
const holdLogins = `DO $chartpilot$DECLARE r record; BEGIN
  FOR r IN SELECT rolname FROM pg_roles WHERE rolcanlogin AND rolname <> current_user LOOP
    EXECUTE format('ALTER ROLE %I SET ` + loginHeld + ` = on', r.rolname);
    EXECUTE format('ALTER ROLE %I NOLOGIN', r.rolname);
  END LOOP;
END$chartpilot$`

// releaseLogins gives back the logins holdLogins took.
const releaseLogins = `DO $chartpilot$DECLARE r record; BEGIN
  FOR r IN SELECT DISTINCT a.rolname FROM pg_roles a JOIN pg_db_role_setting s ON s.setrole = a.oid AND s.setdatabase = 0
      WHERE s.setconfig @> ARRAY['` + loginHeld + `=on'] LOOP
    EXECUTE format('ALTER ROLE %I LOGIN', r.rolname);
    EXECUTE format('ALTER ROLE %I RESET ` + loginHeld + `', r.rolname);
  END LOOP;
END$chartpilot$`

// verify compares every table of every database on both servers: rows and
// a checksum of their text forms (a sum of per-row hashes: independent of
// order, constant in memory). Names are read NUL-separated and a database
// is named only through PGDATABASE: a name may hold white space, or read
// as a connection string where libpq takes one.
func (p Plan) verify(ctx context.Context) (Result, error) {
	var res Result
	dbs, err := p.list(ctx, p.OldHost, p.OldPort, "postgres", "SELECT datname FROM pg_database WHERE datallowconn ORDER BY 1")
	if err != nil {
		return res, err
	}
	for _, db := range dbs {
		res.Databases++
		tables, err := p.list(ctx, p.OldHost, p.OldPort, db, "SELECT format('%I.%I', schemaname, tablename) FROM pg_tables WHERE schemaname NOT IN ('pg_catalog', 'information_schema') ORDER BY 1")
		if err != nil {
			return res, err
		}
		for _, t := range tables {
			q := fmt.Sprintf("SELECT count(*) || ' ' || coalesce(sum(('x' || substr(md5(x::text), 1, 15))::bit(60)::bigint::numeric), 0) FROM %s x", t)
			before, err := p.psql(ctx, p.OldHost, p.OldPort, db, q)
			if err != nil {
				return res, err
			}
			after, err := p.psql(ctx, p.WorkDir, p.NewPort, db, q)
			if err != nil {
				return res, fmt.Errorf("table %q.%s on the new server: %w", db, t, err)
			}
			if before != after {
				return res, fmt.Errorf("table %q.%s differs: rows and checksum %s before, %s after", db, t, before, after)
			}
			n, _ := strconv.ParseInt(strings.Fields(before)[0], 10, 64)
			res.Tables++
			res.Rows += n
		}
	}
	return res, nil
}

// list is a query's one column, each value whole (NUL-separated by psql).
func (p Plan) list(ctx context.Context, host string, port int, db, sql string) ([]string, error) {
	out, err := p.query(ctx, host, port, db, []string{"-0"}, sql)
	if err != nil {
		return nil, err
	}
	var vals []string
	for _, v := range strings.Split(out, "\x00") {
		if v = strings.TrimSuffix(v, "\n"); v != "" {
			vals = append(vals, v)
		}
	}
	return vals, nil
}

func (p Plan) startNew(ctx context.Context) (*exec.Cmd, error) {
	cmd := exec.Command(filepath.Join(p.NewBin, "postgres"), "-D", p.NewData, "-c", "listen_addresses=", "-c", "port="+strconv.Itoa(p.NewPort), "-c", "unix_socket_directories="+p.WorkDir)
	cmd.Env = []string{"LANG=C"}
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: p.Credential, Setpgid: true, Pdeathsig: syscall.SIGKILL}
	logf, err := os.Create(filepath.Join(p.WorkDir, "new-server.log"))
	if err != nil {
		return nil, err
	}
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	deadline := time.Now().Add(time.Minute)
	for time.Now().Before(deadline) {
		if _, err := p.psql(ctx, p.WorkDir, p.NewPort, "postgres", "SELECT 1"); err == nil {
			return cmd, nil
		}
		time.Sleep(200 * time.Millisecond)
	}
	pgproc.Stop(cmd)
	b, _ := os.ReadFile(logf.Name())
	return nil, fmt.Errorf("the new server did not start: %s", lastLines(string(b), 5))
}

// psql runs each statement on its own (ALTER SYSTEM cannot run in a
// transaction block).
func (p Plan) psql(ctx context.Context, host string, port int, db string, sql ...string) (string, error) {
	out, err := p.query(ctx, host, port, db, nil, sql...)
	return strings.TrimSpace(out), err
}

// query runs psql with extra flags; the database goes by PGDATABASE,
// never as an argument libpq could read as a connection string.
func (p Plan) query(ctx context.Context, host string, port int, db string, flags []string, sql ...string) (string, error) {
	args := append([]string{"-X", "-A", "-t", "-q", "-v", "ON_ERROR_STOP=1", "-h", host, "-p", strconv.Itoa(port), "-U", p.User}, flags...)
	for _, s := range sql {
		args = append(args, "-c", s)
	}
	out, err := p.commandEnv(ctx, append(p.serverEnv(host, port), "PGDATABASE="+db), filepath.Join(p.ClientBin, "psql"), args...)
	if err != nil {
		return "", fmt.Errorf("psql on %s:%d, database %q: %w: %s", host, port, db, err, out)
	}
	return out, nil
}

// serverEnv is OldEnv and the password for the old server, nothing for
// the new one: it trusts its socket, and it runs code of the database's
// roles, which could read the environment of the processes talking to
// it (they run as its user).
func (p Plan) serverEnv(host string, port int) []string {
	if host != p.OldHost || port != p.OldPort {
		return nil
	}
	env := slices.Clone(p.OldEnv)
	if p.Password != "" {
		env = append(env, "PGPASSWORD="+p.Password)
	}
	return env
}

func (p Plan) command(ctx context.Context, name string, args ...string) (string, error) {
	return p.commandEnv(ctx, nil, name, args...)
}

func (p Plan) commandEnv(ctx context.Context, env []string, name string, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Env = append([]string{"LANG=C", "PGCONNECT_TIMEOUT=5"}, env...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: p.Credential}
	var out, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &stderr
	err := cmd.Run()
	if err != nil {
		return lastLines(stderr.String()+out.String(), 5), err
	}
	return out.String(), nil
}

// commander runs the client tools against the server at host:port as the
// upgrade's user.
func (p Plan) commander(host string, port int) pgfull.Commander {
	return func(ctx context.Context, env []string, name string, args ...string) *exec.Cmd {
		cmd := exec.CommandContext(ctx, filepath.Join(p.ClientBin, name), args...)
		cmd.Env = append(append([]string{"LANG=C", "PGCONNECT_TIMEOUT=5", "PGCLIENTENCODING=UTF8", "PGHOST=" + host, "PGPORT=" + strconv.Itoa(port), "PGUSER=" + p.User}, p.serverEnv(host, port)...), env...)
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: p.Credential}
		return cmd
	}
}

func (p Plan) write(path string, b []byte) error {
	if err := os.WriteFile(path, b, 0o600); err != nil {
		return err
	}
	if p.Credential != nil {
		return os.Chown(path, int(p.Credential.Uid), int(p.Credential.Gid))
	}
	return nil
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// Report is what a major upgrade tells whoever runs it (a Job's
// termination message): the figures compared, or the step that failed.
type Report struct {
	OK bool `json:"ok"`
	// Major is the new data directory's PostgreSQL major (its PG_VERSION).
	Major     string  `json:"major,omitempty"`
	Databases int     `json:"databases,omitempty"`
	Tables    int     `json:"tables,omitempty"`
	Rows      int64   `json:"rows,omitempty"`
	Seconds   float64 `json:"seconds,omitempty"`
	Step      string  `json:"step,omitempty"`
	Error     string  `json:"error,omitempty"`
}

// ReportOf is the report of a finished Run of p.
func ReportOf(p Plan, res Result, err error) Report {
	if err != nil {
		r := Report{Error: err.Error()}
		var e *Error
		if errors.As(err, &e) {
			r.Step, r.Error = e.Step, e.Err.Error()
		}
		return r
	}
	major, rerr := os.ReadFile(filepath.Join(p.NewData, "PG_VERSION"))
	if rerr != nil {
		return Report{Step: "report", Error: "the new data directory has no PG_VERSION: " + rerr.Error()}
	}
	return Report{OK: true, Major: strings.TrimSpace(string(major)), Databases: res.Databases, Tables: res.Tables, Rows: res.Rows, Seconds: res.Took.Seconds()}
}
