package wal

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
)

// Outcome is what a recovery into a new cluster reports (a pod's
// termination message, read by the operator into the Postgres's
// status.recovery): small, never a credential.
type Outcome struct {
	// Phase is Completed, Skipped (the cluster has data already) or Failed.
	Phase   string `json:"phase"`
	Message string `json:"message,omitempty"`
	Target  string `json:"target,omitempty"`
	Base    string `json:"base,omitempty"`
	// Timeline is the one the recovered server was promoted on.
	Timeline int64 `json:"timeline,omitempty"`
	// LastTransactionTime is the commit time of the last transaction
	// replayed, as the server logged it.
	LastTransactionTime string `json:"lastTransactionTime,omitempty"`
}

// Outcome phases.
const (
	OutcomeCompleted = "Completed"
	OutcomeSkipped   = "Skipped"
	OutcomeFailed    = "Failed"
)

// NewCluster is a recovery that makes the first data directory of a
// cluster which never had a primary: it recovers beside DataDir, sets the
// superuser the new cluster's clients use, writes Marker (the instance
// manager's moved-data marker: with no primary, the member holding it
// takes the primary's Lease) and only then moves the data into place. A
// run killed halfway leaves no PG_VERSION in DataDir and starts over.
type NewCluster struct {
	DataDir, Marker string
	// EverLed reports whether the cluster had a primary (and why it
	// thinks so): then no recovery runs, whatever DataDir holds.
	EverLed func(ctx context.Context) (bool, string, error)
	// User gets Password, SUPERUSER and LOGIN in the recovered data (made
	// when the archive's server had no such role; see SetSuperuser).
	// Empty: left as it was.
	User, Password string
	// Command makes the postgres command of SetSuperuser (nil: from PATH).
	Command func(name string, args ...string) *exec.Cmd
}

// Skip reports why no recovery is due ("" when one is): the cluster had a
// primary (this member joins it), or this recovery completed before (its
// marker is there). A data directory holding a cluster that never had a
// primary and that no recovery made (a volume kept from an earlier
// Postgres of the name) is an error: a recovery never writes over data.
func (n NewCluster) Skip(ctx context.Context) (string, error) {
	if n.EverLed != nil {
		led, why, err := n.EverLed(ctx)
		if err != nil {
			return "", fmt.Errorf("reading whether the cluster had a primary: %w", err)
		}
		if led {
			return "the cluster had a primary (" + why + "): this member joins it instead of recovering", nil
		}
	}
	if _, err := os.Stat(filepath.Join(n.DataDir, "PG_VERSION")); err != nil {
		return "", nil
	}
	if _, err := os.Stat(n.Marker); err == nil {
		return "recovered already: the instance manager leads with the recovered data", nil
	}
	return "", fmt.Errorf("%s holds a cluster that no recovery made, and this cluster never had a primary: a volume kept from an earlier Postgres of this name? A recovery never writes over data: move what the volume holds away (or delete its claim), or recover into a Postgres of another name", n.DataDir)
}

// Work is where the recovery is made, beside DataDir.
func (n NewCluster) Work() string { return filepath.Clean(n.DataDir) + ".recovering" }

// Finish checks again that the cluster never had a primary, sets the
// superuser in the recovered data at Work, writes the marker and moves
// the data into DataDir.
func (n NewCluster) Finish(ctx context.Context) error {
	work := n.Work()
	// The recovery took a while: a cluster that got a primary meanwhile
	// (its Lease deleted and taken again) keeps it, and the recovered
	// copy is not moved in beside it.
	if n.EverLed != nil {
		led, why, err := n.EverLed(ctx)
		if err != nil {
			return fmt.Errorf("reading whether the cluster had a primary: %w", err)
		}
		if led {
			_ = os.RemoveAll(work)
			return fmt.Errorf("the cluster got a primary while this recovery ran (%s): the recovered data is not moved into place; this member joins the cluster", why)
		}
	}
	if n.User != "" {
		if err := SetSuperuser(n.Command, work, n.User, n.Password); err != nil {
			return err
		}
	}
	if err := historyReady(work); err != nil {
		return err
	}
	if err := os.WriteFile(n.Marker, []byte("recovered from a WAL archive\n"), 0o600); err != nil {
		return fmt.Errorf("writing the marker %s: %w", n.Marker, err)
	}
	if err := os.Remove(n.DataDir); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("%s holds files but no PG_VERSION: not a data directory a recovery may replace; move them away: %w", n.DataDir, err)
	}
	if err := os.Rename(work, n.DataDir); err != nil {
		return err
	}
	return syncDir(filepath.Dir(filepath.Clean(n.DataDir)))
}

// historyReady marks the history files the promotion wrote as ready to
// archive: the replay ran with archiving off, and the server that starts
// on the data archives (to its own archive) what is marked, so that its
// timeline's history is there beside its WAL.
func historyReady(dataDir string) error {
	names, err := filepath.Glob(filepath.Join(dataDir, "pg_wal", "*.history"))
	if err != nil {
		return err
	}
	for _, path := range names {
		name := filepath.Base(path)
		if !IsHistory(name) {
			continue
		}
		status := filepath.Join(dataDir, "pg_wal", "archive_status", name)
		if _, err := os.Stat(status + ".done"); err == nil {
			continue
		}
		if err := os.WriteFile(status+".ready", nil, 0o600); err != nil {
			return fmt.Errorf("marking %s ready to archive: %w", name, err)
		}
	}
	return nil
}

func syncDir(dir string) error {
	f, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer f.Close()
	return f.Sync()
}

// SetSuperuser gives role user the password, SUPERUSER and LOGIN in the
// stopped cluster at dataDir, in single-user mode (as the cluster's
// bootstrap superuser; no trigger or user code runs), with the statement
// logged nowhere. The role is made when the recovered cluster has none of
// that name; one that exists must be a superuser already: a role of the
// archive's server that was not (its members, its functions, its
// settings) never becomes one. command makes the postgres command (nil:
// exec.Command, postgres from PATH).
func SetSuperuser(command func(name string, args ...string) *exec.Cmd, dataDir, user, password string) error {
	if command == nil {
		command = exec.Command
	}
	if user == "" || strings.ContainsAny(user, "\x00\n\r") || len(user) > 63 {
		return fmt.Errorf("the superuser's name %q: 1 to 63 characters, no line breaks", user)
	}
	if password == "" {
		return errors.New("the Postgres's Secret holds no superuser password: set its key password")
	}
	for _, r := range password {
		if r < 0x20 || r > 0x7e {
			return errors.New("the superuser's password holds a character that is not printable ASCII: set one of printable ASCII")
		}
	}
	var tag string
	for {
		b := make([]byte, 8)
		if _, err := rand.Read(b); err != nil {
			return err
		}
		tag = "$cp" + hex.EncodeToString(b) + "$"
		if !strings.Contains(user, tag) && !strings.Contains(password, tag) {
			break
		}
	}
	lit := func(s string) string { return "'" + strings.ReplaceAll(s, "'", "''") + "'" }
	// One statement on one line: single-user mode ends a statement at a
	// line break, and goes on after a failed one.
	stmt := "DO " + tag + "BEGIN " +
		"IF EXISTS (SELECT FROM pg_roles WHERE rolname = " + lit(user) + " AND NOT rolsuper) THEN " +
		"RAISE EXCEPTION 'chartpilot: the recovered cluster has a role %, which is not a superuser: it does not become one', " + lit(user) + "; " +
		"END IF; " +
		"IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = " + lit(user) + ") THEN " +
		"EXECUTE format('CREATE ROLE %I', " + lit(user) + "); " +
		"END IF; " +
		"EXECUTE format('ALTER ROLE %I WITH SUPERUSER LOGIN PASSWORD %L', " + lit(user) + ", " + lit(password) + "); " +
		"END" + tag + ";\n"
	cmd := command("postgres", "--single", "-D", dataDir, "-c", "log_statement=none", "-c", "log_min_error_statement=panic",
		"-c", "standard_conforming_strings=on", "-c", "listen_addresses=", "postgres")
	cmd.Stdin = strings.NewReader(stmt)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	// Single-user mode prints results and messages, never the statement;
	// only its ERROR and FATAL lines are shown, the password taken out.
	var bad []string
	for _, l := range strings.Split(out.String(), "\n") {
		if strings.Contains(l, "ERROR:") || strings.Contains(l, "FATAL:") {
			bad = append(bad, strings.ReplaceAll(strings.TrimSpace(l), password, "[redacted]"))
		}
	}
	if joined := strings.Join(bad, "; "); strings.Contains(joined, "which is not a superuser") {
		return fmt.Errorf("the recovered cluster has a role %q (the Postgres's Secret's username), which is not a superuser there: it does not become one, since its members, functions and settings come from the archive's server; give the new Postgres a superuser name the archive's server has no role of (auth.username in spec.values), or that server's superuser's", user)
	} else if err != nil || len(bad) > 0 {
		return fmt.Errorf("setting the superuser %s in the recovered data: %v %s", user, err, joined)
	}
	return nil
}

var (
	lastTxLine   = regexp.MustCompile(`(?m)last completed transaction was at log time (.+)$`)
	timelineLine = regexp.MustCompile(`(?m)^Latest checkpoint's TimeLineID:\s+([0-9]+)$`)
)

// LastTransaction is the commit time of the last transaction a replay
// logged at its end ("" when it logged none).
func LastTransaction(logPath string) string {
	data, _ := os.ReadFile(logPath)
	m := lastTxLine.FindAllSubmatch(data, -1)
	if len(m) == 0 {
		return ""
	}
	return strings.TrimSpace(string(m[len(m)-1][1]))
}

// Timeline is the timeline of the stopped cluster at dataDir's newest
// checkpoint (0 when pg_controldata cannot tell).
func Timeline(dataDir string) int64 {
	out, err := exec.Command("pg_controldata", "-D", dataDir).Output()
	if err != nil {
		return 0
	}
	m := timelineLine.FindSubmatch(out)
	if m == nil {
		return 0
	}
	n, _ := strconv.ParseInt(string(m[1]), 10, 64)
	return n
}
