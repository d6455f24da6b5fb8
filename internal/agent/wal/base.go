package wal

import (
	"archive/tar"
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/chartpilot/chartpilot/internal/backup"
)

// Labels of a base backup's manifest.
const (
	LabelMethod       = "method"
	MethodBaseBackup  = "basebackup"
	LabelTimeline     = "timeline"
	LabelStartLSN     = "startLSN"
	LabelStartSegment = "startSegment"
	LabelStartTime    = "startTime"
	LabelStopLSN      = "stopLSN"
	LabelStopTime     = "stopTime"
	LabelSegmentSize  = "segmentSize"
)

// BasePrefix is where base backups are stored, one location each.
func (a *Archive) BasePrefix() string { return a.prefix() + "/base" }

// BaseBackup takes a base backup of the server libpq's environment
// reaches (PGHOST, PGPORT, PGUSER, a passfile; env, or this process's when
// nil) with pg_basebackup from PATH, as one tar with the WAL it needs
// (-X fetch), streamed through the backup data path to location (a name
// directly below BasePrefix(); empty: BasePrefix()/<now>), and returns
// its manifest: where it started and
// stopped are its labels. The user needs the REPLICATION attribute; a
// standby serves it as well as the primary.
func (a *Archive) BaseBackup(ctx context.Context, env []string, now time.Time, location string) (*backup.Manifest, error) {
	if err := a.check(); err != nil {
		return nil, err
	}
	if location == "" {
		location = a.BasePrefix() + "/" + now.UTC().Format("20060102T150405Z")
	}
	if rest, ok := strings.CutPrefix(location, a.BasePrefix()+"/"); !ok || rest == "" || strings.Contains(rest, "/") || strings.Contains(rest, "..") {
		return nil, fmt.Errorf("base backup location %q: a name directly below %s/, where recoveries look for base backups", location, a.BasePrefix())
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	head := &headWriter{max: 1 << 20}
	var stderr bytes.Buffer
	pr, pw := io.Pipe()
	done := make(chan error, 1)
	go func() {
		cmd := exec.CommandContext(ctx, "pg_basebackup", "-D", "-", "-F", "tar", "-X", "fetch",
			"--checkpoint=fast", "--no-password", "--verbose", "--label", "chartpilot "+location)
		cmd.Env = env
		cmd.Stdout = io.MultiWriter(pw, head)
		cmd.Stderr = &limitedBuffer{buf: &stderr, max: 64 << 10}
		err := cmd.Run()
		if err != nil {
			err = fmt.Errorf("pg_basebackup failed: %w: %s", err, lastLines(stderr.String(), 5))
		}
		_ = pw.CloseWithError(err)
		done <- err
	}()
	var labelErr error
	o := backup.Options{Compression: a.Compression, Recipient: a.Recipient, Now: func() time.Time { return now },
		Labels: map[string]string{LabelMethod: MethodBaseBackup, LabelSegmentSize: strconv.FormatInt(a.segSize(), 10)},
		LateLabels: func() map[string]string {
			l, err := baseLabels(head.buf.Bytes(), stderr.String(), a.segSize())
			if err != nil {
				labelErr = err
				return nil
			}
			l[LabelStopTime] = time.Now().UTC().Format(time.RFC3339Nano)
			return l
		}}
	m, err := backup.Write(ctx, a.Bucket, location, pr, o)
	if err != nil {
		_ = pr.CloseWithError(err)
		cancel()
		if perr := <-done; perr != nil {
			return nil, fmt.Errorf("%w (%v)", err, perr)
		}
		return nil, err
	}
	if err := <-done; err != nil {
		return nil, err
	}
	if labelErr != nil {
		return nil, fmt.Errorf("the base backup at %s is stored, but where it starts cannot be read: %w", location, labelErr)
	}
	return m, nil
}

var (
	startLine = regexp.MustCompile(`(?m)^START WAL LOCATION: ([0-9A-F]+/[0-9A-F]+) \(file ([0-9A-F]{24})\)$`)
	timeLine  = regexp.MustCompile(`(?m)^START TIME: (.+)$`)
	tliLine   = regexp.MustCompile(`(?m)^START TIMELINE: ([0-9]+)$`)
	endLine   = regexp.MustCompile(`write-ahead log end point: ([0-9A-F]+/[0-9A-F]+)`)
)

// baseLabels reads where a base backup starts from the backup_label at
// the head of its tar, and where it stops from pg_basebackup's messages.
func baseLabels(tarHead []byte, messages string, segSize int64) (map[string]string, error) {
	label, err := tarFile(tarHead, "backup_label")
	if err != nil {
		return nil, err
	}
	s := startLine.FindStringSubmatch(label)
	t := timeLine.FindStringSubmatch(label)
	if s == nil || t == nil {
		return nil, fmt.Errorf("backup_label has no START WAL LOCATION or START TIME")
	}
	seg, err := ParseSegment(s[2], segSize)
	if err != nil {
		return nil, err
	}
	tli := strconv.FormatUint(uint64(seg.TLI), 10)
	if m := tliLine.FindStringSubmatch(label); m != nil {
		tli = m[1]
	}
	start, err := time.Parse("2006-01-02 15:04:05 MST", strings.TrimSpace(t[1]))
	if err != nil {
		return nil, fmt.Errorf("backup_label's START TIME %q: %w", t[1], err)
	}
	e := endLine.FindStringSubmatch(messages)
	if e == nil {
		return nil, fmt.Errorf("pg_basebackup did not say where the backup ends (write-ahead log end point)")
	}
	return map[string]string{
		LabelTimeline:     tli,
		LabelStartLSN:     s[1],
		LabelStartSegment: s[2],
		LabelStartTime:    start.UTC().Format(time.RFC3339),
		LabelStopLSN:      e[1],
	}, nil
}

// headWriter keeps the first max bytes written to it.
type headWriter struct {
	buf bytes.Buffer
	max int
}

func (h *headWriter) Write(p []byte) (int, error) {
	if room := h.max - h.buf.Len(); room > 0 {
		h.buf.Write(p[:min(room, len(p))])
	}
	return len(p), nil
}

// limitedBuffer keeps the first max bytes written to it.
type limitedBuffer struct {
	buf *bytes.Buffer
	max int
}

func (l *limitedBuffer) Write(p []byte) (int, error) {
	if room := l.max - l.buf.Len(); room > 0 {
		l.buf.Write(p[:min(room, len(p))])
	}
	return len(p), nil
}

// lastLines is the last n lines of s.
func lastLines(s string, n int) string {
	var lines []string
	sc := bufio.NewScanner(strings.NewReader(s))
	for sc.Scan() {
		lines = append(lines, sc.Text())
	}
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// Bases is the base backups stored, newest first.
func (a *Archive) Bases(ctx context.Context) ([]backup.Stored, error) {
	if err := a.check(); err != nil {
		return nil, err
	}
	all, _, err := backup.List(ctx, a.Bucket, a.BasePrefix())
	if err != nil {
		return nil, err
	}
	var out []backup.Stored
	for _, s := range all {
		if s.Manifest.Labels[LabelMethod] == MethodBaseBackup {
			out = append(out, s)
		}
	}
	return out, nil
}

// tarFile is the content of the regular file name in the tar whose first
// bytes are head.
func tarFile(head []byte, name string) (string, error) {
	tr := tar.NewReader(bytes.NewReader(head))
	for {
		h, err := tr.Next()
		if err != nil {
			return "", fmt.Errorf("the base backup's tar has no %s at its head: %w", name, err)
		}
		if strings.TrimPrefix(h.Name, "./") != name {
			continue
		}
		if h.Size > 64<<10 {
			return "", fmt.Errorf("%s is %d bytes: not one PostgreSQL wrote", name, h.Size)
		}
		data, err := io.ReadAll(tr)
		if err != nil {
			return "", fmt.Errorf("reading %s: %w", name, err)
		}
		return string(data), nil
	}
}
