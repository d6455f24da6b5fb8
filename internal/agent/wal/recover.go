package wal

import (
	"archive/tar"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/chartpilot/chartpilot/internal/agent/pgproc"
	"github.com/chartpilot/chartpilot/internal/backup"
)

// Target is the point a recovery stops at (inclusive: what committed at
// the target is kept). At most one is set; none: the end of the archive.
type Target struct {
	Time time.Time
	LSN  string
	XID  string
}

// Validate names what is wrong with the target.
func (t Target) Validate() error {
	set := 0
	if !t.Time.IsZero() {
		set++
	}
	if t.LSN != "" {
		set++
		if _, err := ParseLSN(t.LSN); err != nil {
			return fmt.Errorf("target LSN: %w", err)
		}
	}
	if t.XID != "" {
		set++
		if n, err := strconv.ParseUint(t.XID, 10, 64); err != nil || n < 3 {
			return fmt.Errorf("target XID %q: a transaction ID (a number of 3 or more)", t.XID)
		}
	}
	if set > 1 {
		return errors.New("one target at most: a time, an LSN or a transaction ID")
	}
	return nil
}

func (t Target) String() string {
	switch {
	case !t.Time.IsZero():
		return "time " + t.Time.UTC().Format(time.RFC3339Nano)
	case t.LSN != "":
		return "LSN " + t.LSN
	case t.XID != "":
		return "transaction " + t.XID
	}
	return "the end of the archive"
}

// Plan is what a recovery replays.
type Plan struct {
	// Base is the base backup's location, Manifest its manifest.
	Base     string
	Manifest *backup.Manifest
	// Start is the segment the base backup starts in, Stop the one it
	// stops in.
	Start, Stop Segment
	// Timeline is the timeline recovery follows (the newest archived).
	Timeline uint32
	// Last is the newest segment of Timeline archived ("" when none).
	Last string
	// Gap is the first segment missing between the base backup and Last
	// ("" when none): recovery cannot pass it.
	Gap string
	// Segments is how many segments recovery may fetch from the archive.
	Segments int
}

// Plan chooses the base backup a recovery to t starts from (base: that
// one; "": the newest that ends before t) and checks that the archive
// holds every segment from it to the newest of the newest timeline. A
// recovery to the end of the archive, or to an LSN, past a gap is refused,
// naming the missing segment; one to a time or a transaction is not (the
// point may lie before the gap), and PostgreSQL refuses to promote when it
// did not reach the target.
func (a *Archive) Plan(ctx context.Context, t Target, base string) (*Plan, error) {
	if err := t.Validate(); err != nil {
		return nil, err
	}
	bases, err := a.Bases(ctx)
	if err != nil {
		return nil, err
	}
	if len(bases) == 0 {
		return nil, fmt.Errorf("the store holds no base backup under %s/: take one first", a.BasePrefix())
	}
	var chosen *backup.Stored
	for i := range bases {
		s := &bases[i]
		if base != "" {
			if strings.TrimSuffix(s.Location, "/") == strings.TrimSuffix(base, "/") {
				chosen = s
				break
			}
			continue
		}
		if ok, err := endsBefore(s.Manifest, t); err != nil {
			return nil, fmt.Errorf("base backup %s: %w", s.Location, err)
		} else if ok {
			chosen = s
			break
		}
	}
	if chosen == nil {
		if base != "" {
			return nil, fmt.Errorf("no base backup at %s", base)
		}
		oldest := bases[len(bases)-1].Manifest.Labels
		return nil, fmt.Errorf("no base backup ends before %s: the oldest ends at %s (LSN %s); the store cannot recover to a point before that",
			t, oldest[LabelStopTime], oldest[LabelStopLSN])
	}
	if ok, err := endsBefore(chosen.Manifest, t); err != nil || !ok {
		return nil, fmt.Errorf("base backup %s ends at %s (LSN %s), after %s: choose an older one", chosen.Location,
			chosen.Manifest.Labels[LabelStopTime], chosen.Manifest.Labels[LabelStopLSN], t)
	}
	p := &Plan{Base: chosen.Location, Manifest: chosen.Manifest}
	labels := chosen.Manifest.Labels
	if p.Start, err = ParseSegment(labels[LabelStartSegment], a.segSize()); err != nil {
		return nil, fmt.Errorf("base backup %s: %w", chosen.Location, err)
	}
	stopLSN, err := ParseLSN(labels[LabelStopLSN])
	if err != nil {
		return nil, fmt.Errorf("base backup %s: %w", chosen.Location, err)
	}
	p.Stop = Segment{TLI: p.Start.TLI, No: stopLSN / uint64(a.segSize())}

	names, err := a.List(ctx)
	if err != nil {
		return nil, err
	}
	present := map[string]bool{}
	p.Timeline = p.Start.TLI
	newest := map[uint32]uint64{}
	for _, n := range names {
		present[n] = true
		if IsHistory(n) {
			tli, _ := strconv.ParseUint(n[:8], 16, 32)
			p.Timeline = max(p.Timeline, uint32(tli))
		} else if s, err := ParseSegment(n, a.segSize()); err == nil {
			p.Timeline = max(p.Timeline, s.TLI)
			newest[s.TLI] = max(newest[s.TLI], s.No)
		}
	}
	var hist []Switch
	if p.Timeline != p.Start.TLI {
		data, err := a.Read(ctx, HistoryName(p.Timeline))
		if err != nil {
			return nil, fmt.Errorf("timeline %d's history: %w", p.Timeline, err)
		}
		if hist, err = ParseHistory(string(data)); err != nil {
			return nil, fmt.Errorf("timeline %d's history: %w", p.Timeline, err)
		}
	}
	last, ok := newest[p.Timeline]
	if ok {
		p.Last = Segment{TLI: p.Timeline, No: last}.Name(a.segSize())
	}
	// The base backup holds the segments up to the one it stops in.
	expected, err := Expected(p.Stop, p.Timeline, hist, last, a.segSize())
	if err != nil {
		return nil, fmt.Errorf("base backup %s (timeline %d) and the archive's newest timeline %d: %w", chosen.Location, p.Start.TLI, p.Timeline, err)
	}
	p.Segments = len(expected)
	for _, s := range expected {
		if !present[s.Name(a.segSize())] {
			p.Gap = s.Name(a.segSize())
			break
		}
	}
	if p.Gap != "" && t.Time.IsZero() && t.XID == "" {
		gap, _ := ParseSegment(p.Gap, a.segSize())
		lsn, _ := ParseLSN(t.LSN)
		if t.LSN == "" || lsn/uint64(a.segSize()) >= gap.No {
			return p, fmt.Errorf("the archive has a gap: segment %s is missing while %s, newer, is there; recovery to %s would stop at the gap, so it is refused (restore the missing segment to the store, or recover to a point before it)",
				p.Gap, p.Last, t)
		}
	}
	return p, nil
}

// endsBefore reports whether base backup m ends at or before t.
func endsBefore(m *backup.Manifest, t Target) (bool, error) {
	switch {
	case !t.Time.IsZero():
		stop, err := time.Parse(time.RFC3339Nano, m.Labels[LabelStopTime])
		if err != nil {
			return false, fmt.Errorf("its stop time %q: %w", m.Labels[LabelStopTime], err)
		}
		return !stop.After(t.Time), nil
	case t.LSN != "":
		stop, err := ParseLSN(m.Labels[LabelStopLSN])
		if err != nil {
			return false, err
		}
		want, _ := ParseLSN(t.LSN)
		return stop <= want, nil
	}
	return true, nil
}

// RecoveryBlock marks the settings Prepare adds to postgresql.auto.conf,
// removed by Replay once the server promoted.
const (
	blockBegin = "# chartpilot recovery: begin"
	blockEnd   = "# chartpilot recovery: end"
)

// Prepare restores p's base backup into dataDir (absent or empty; made
// with mode 0700) and sets it up to recover to t: recovery.signal, and
// restore_command (run by PostgreSQL with %f and %p), the target and
// promotion at the target in postgresql.auto.conf. The backup is checked
// against want and its checksum before anything is written (staged in
// stagingDir). Nothing outside dataDir is written: the tar's entries are
// opened through an os.Root, and links are refused.
func (a *Archive) Prepare(ctx context.Context, p *Plan, dataDir, stagingDir, restoreCommand string, t Target, want backup.Expect) error {
	if err := os.MkdirAll(dataDir, 0o700); err != nil {
		return err
	}
	if entries, err := os.ReadDir(dataDir); err != nil {
		return err
	} else if len(entries) > 0 {
		return fmt.Errorf("data directory %s is not empty: a recovery never writes over a data directory", dataDir)
	}
	if err := os.Chmod(dataDir, 0o700); err != nil {
		return err
	}
	r, m, err := backup.Open(ctx, a.Bucket, p.Base, a.Identity, stagingDir, want)
	if err != nil {
		return err
	}
	defer r.Close()
	root, err := os.OpenRoot(dataDir)
	if err != nil {
		return err
	}
	defer root.Close()
	if err := untar(root, r, m.PlainSize); err != nil {
		return fmt.Errorf("restoring base backup %s into %s: %w", p.Base, dataDir, err)
	}
	_ = root.Remove("standby.signal")
	if err := writeFile(root, "recovery.signal", nil); err != nil {
		return err
	}
	settings := [][2]string{
		{"restore_command", restoreCommand},
		{"recovery_target_timeline", "latest"},
		{"recovery_target_action", "promote"},
		{"recovery_target_inclusive", "on"},
	}
	switch {
	case !t.Time.IsZero():
		settings = append(settings, [2]string{"recovery_target_time", t.Time.UTC().Format("2006-01-02 15:04:05.999999-07:00")})
	case t.LSN != "":
		settings = append(settings, [2]string{"recovery_target_lsn", t.LSN})
	case t.XID != "":
		settings = append(settings, [2]string{"recovery_target_xid", t.XID})
	}
	old, err := root.ReadFile("postgresql.auto.conf")
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	var b strings.Builder
	b.Write(old)
	if len(old) > 0 && !strings.HasSuffix(string(old), "\n") {
		b.WriteByte('\n')
	}
	b.WriteString(blockBegin + "\n")
	for _, s := range settings {
		fmt.Fprintf(&b, "%s = '%s'\n", s[0], strings.ReplaceAll(s[1], "'", "''"))
	}
	b.WriteString(blockEnd + "\n")
	return writeFile(root, "postgresql.auto.conf", []byte(b.String()))
}

// untar writes the tar r into root, at most max bytes of file content.
func untar(root *os.Root, r io.Reader, max int64) error {
	tr := tar.NewReader(r)
	var written int64
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
		name := filepath.Clean(strings.TrimPrefix(h.Name, "./"))
		if name == "." {
			continue
		}
		switch h.Typeflag {
		case tar.TypeDir:
			if err := root.MkdirAll(name, 0o700); err != nil {
				return err
			}
		case tar.TypeReg:
			written += h.Size
			if written > max {
				return fmt.Errorf("the tar holds more than the %d bytes the backup's manifest says", max)
			}
			if dir := filepath.Dir(name); dir != "." {
				if err := root.MkdirAll(dir, 0o700); err != nil {
					return err
				}
			}
			f, err := root.OpenFile(name, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
			if err != nil {
				return err
			}
			_, err = io.CopyN(f, tr, h.Size)
			if err == nil {
				err = f.Sync()
			}
			if cerr := f.Close(); err == nil {
				err = cerr
			}
			if err != nil {
				return fmt.Errorf("%s: %w", name, err)
			}
		default:
			return fmt.Errorf("%s: a link or special file (tar type %q); a base backup of a server without tablespaces has none", name, h.Typeflag)
		}
	}
}

// writeFile writes name in root through a temporary file, synced.
func writeFile(root *os.Root, name string, data []byte) error {
	tmp := name + ".chartpilot-tmp"
	f, err := root.OpenFile(tmp, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, 0o600)
	if err == nil {
		err = writeSynced(f, data)
	}
	if err == nil {
		err = root.Rename(tmp, name)
	}
	return err
}

// Replay runs PostgreSQL (postgres and pg_controldata from PATH) on a
// prepared data directory, with no TCP listener and its socket in
// socketDir, until it has recovered and promoted; then it stops it with a
// fast shutdown and removes the recovery settings. The server's messages
// go to logPath. A server that ends first (the target not reached: a gap,
// or a target past the archive's end) is an error with its last messages.
func Replay(ctx context.Context, dataDir, socketDir, logPath string, options []string) error {
	log, err := os.OpenFile(logPath, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, 0o600)
	if err != nil {
		return err
	}
	defer log.Close()
	args := []string{"-D", dataDir, "-c", "listen_addresses=", "-c", "unix_socket_directories=" + socketDir}
	for _, o := range options {
		args = append(args, "-c", o)
	}
	cmd := exec.Command("postgres", args...)
	cmd.Stdout, cmd.Stderr = log, log
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("starting postgres: %w", err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	tick := time.NewTicker(500 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case err := <-exited:
			return fmt.Errorf("postgres ended before it promoted (%v): %s", err, serverErrors(logPath))
		case <-ctx.Done():
			stopRunning(cmd, exited)
			return ctx.Err()
		case <-tick.C:
		}
		// The base backup's control file says "in production" already
		// (it was copied from a running server): promoted is when the
		// server has also removed recovery.signal, at the end of recovery.
		if _, err := os.Stat(filepath.Join(dataDir, "recovery.signal")); err == nil || state(dataDir) != "in production" {
			continue
		}
		stopRunning(cmd, exited)
		return removeRecoveryBlock(dataDir)
	}
}

// stopRunning stops a postgres process whose Wait runs in another
// goroutine that reports to exited.
func stopRunning(cmd *exec.Cmd, exited chan error) {
	done := make(chan struct{})
	go func() { <-exited; close(done) }()
	pgproc.Signal(cmd, done)
}

var stateLine = regexp.MustCompile(`(?m)^Database cluster state:\s+(.+)$`)

// state is the cluster state pg_controldata reads from the control file.
func state(dataDir string) string {
	out, err := exec.Command("pg_controldata", "-D", dataDir).Output()
	if err != nil {
		return ""
	}
	if m := stateLine.FindSubmatch(out); m != nil {
		return strings.TrimSpace(string(m[1]))
	}
	return ""
}

func removeRecoveryBlock(dataDir string) error {
	root, err := os.OpenRoot(dataDir)
	if err != nil {
		return err
	}
	defer root.Close()
	data, err := root.ReadFile("postgresql.auto.conf")
	if err != nil {
		return err
	}
	s := string(data)
	i, j := strings.Index(s, blockBegin+"\n"), strings.Index(s, blockEnd+"\n")
	if i < 0 || j < i {
		return nil
	}
	return writeFile(root, "postgresql.auto.conf", []byte(s[:i]+s[j+len(blockEnd)+1:]))
}

// serverErrors is the server's last FATAL, PANIC and ERROR lines with
// the line before each (a FATAL's cause is often a LOG line), or its last
// lines when it wrote none.
func serverErrors(logPath string) string {
	data, _ := os.ReadFile(logPath)
	lines := strings.Split(string(data), "\n")
	var picked []string
	for i, l := range lines {
		if strings.Contains(l, "FATAL:") || strings.Contains(l, "PANIC:") || strings.Contains(l, "ERROR:") {
			if i > 0 && (len(picked) == 0 || picked[len(picked)-1] != strings.TrimSpace(lines[i-1])) {
				picked = append(picked, strings.TrimSpace(lines[i-1]))
			}
			picked = append(picked, strings.TrimSpace(l))
		}
	}
	if len(picked) == 0 {
		return lastLines(string(data), 5)
	}
	if len(picked) > 6 {
		picked = picked[len(picked)-6:]
	}
	return strings.Join(picked, "\n")
}
