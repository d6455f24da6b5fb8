package wal

import (
	"bytes"
	"context"
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
	// when the archive's server had no such role). Empty: left as it was.
	User, Password string
}

// Skip reports why no recovery is due ("" when one is).
func (n NewCluster) Skip(ctx context.Context) (string, error) {
	if _, err := os.Stat(filepath.Join(n.DataDir, "PG_VERSION")); err == nil {
		return fmt.Sprintf("%s holds a cluster already: nothing to recover", n.DataDir), nil
	}
	if n.EverLed == nil {
		return "", nil
	}
	led, why, err := n.EverLed(ctx)
	if err != nil {
		return "", fmt.Errorf("reading whether the cluster had a primary: %w", err)
	}
	if led {
		return "the cluster had a primary (" + why + "): this member joins it instead of recovering", nil
	}
	return "", nil
}

// Work is where the recovery is made, beside DataDir.
func (n NewCluster) Work() string { return filepath.Clean(n.DataDir) + ".recovering" }

// Finish sets the superuser in the recovered data at Work, writes the
// marker and moves the data into DataDir.
func (n NewCluster) Finish() error {
	work := n.Work()
	if n.User != "" {
		if err := SetSuperuser(work, n.User, n.Password); err != nil {
			return err
		}
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

func syncDir(dir string) error {
	f, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer f.Close()
	return f.Sync()
}

// SetSuperuser gives role user the password, SUPERUSER and LOGIN in the
// stopped cluster at dataDir (made when missing), in single-user mode (as
// the cluster's bootstrap superuser; no trigger or user code runs), with
// the statement logged nowhere. postgres comes from PATH.
func SetSuperuser(dataDir, user, password string) error {
	if user == "" || strings.ContainsAny(user, "\x00\n\r") || len(user) > 63 {
		return fmt.Errorf("the superuser's name %q: 1 to 63 characters, no line breaks", user)
	}
	for _, r := range password {
		if r < 0x20 || r > 0x7e {
			return errors.New("the superuser's password holds a character that is not printable ASCII: set one of printable ASCII")
		}
	}
	lit := func(s string) string { return "'" + strings.ReplaceAll(s, "'", "''") + "'" }
	ident := `"` + strings.ReplaceAll(user, `"`, `""`) + `"`
	stmt := fmt.Sprintf("DO $chartpilot$BEGIN IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = %s) THEN CREATE ROLE %s; END IF; END$chartpilot$;\n", lit(user), ident)
	if strings.Contains(user, "$chartpilot$") {
		return fmt.Errorf("the superuser's name %q holds $chartpilot$", user)
	}
	stmt += fmt.Sprintf("ALTER ROLE %s WITH SUPERUSER LOGIN", ident)
	if password != "" {
		stmt += " PASSWORD " + lit(password)
	}
	stmt += ";\n"
	cmd := exec.Command("postgres", "--single", "-D", dataDir, "-c", "log_statement=none", "-c", "log_min_error_statement=panic",
		"-c", "standard_conforming_strings=on", "-c", "listen_addresses=", "postgres")
	cmd.Stdin = strings.NewReader(stmt)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	// The output never echoes the statement (single-user mode prints
	// results and messages, and errors carry no statement at this level);
	// still, only its ERROR and FATAL lines are shown.
	var bad []string
	for _, l := range strings.Split(out.String(), "\n") {
		if strings.Contains(l, "ERROR:") || strings.Contains(l, "FATAL:") {
			bad = append(bad, strings.TrimSpace(l))
		}
	}
	if password != "" {
		for i := range bad {
			bad[i] = strings.ReplaceAll(bad[i], password, "[redacted]")
		}
	}
	if err != nil || len(bad) > 0 {
		return fmt.Errorf("setting the superuser %s in the recovered data: %v %s", user, err, strings.Join(bad, "; "))
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
