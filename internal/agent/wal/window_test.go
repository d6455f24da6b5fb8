package wal

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/chartpilot/chartpilot/internal/backup"
)

// TestRecoveryWindowRetention stores base backups and WAL files in a
// directory store and prunes to recovery windows: what a point of the
// window needs stays, the rest goes, history files always stay.
func TestRecoveryWindowRetention(t *testing.T) {
	ctx := context.Background()
	b, err := backup.OpenDir(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	a := &Archive{Bucket: b, Prefix: "shop/orders", Retries: -1}
	now := time.Date(2026, 12, 4, 12, 0, 0, 0, time.UTC)
	base := func(age time.Duration, start Segment) string {
		stop := now.Add(-age)
		loc := a.BasePrefix() + "/" + stop.Format("20060102T150405Z")
		_, err := backup.Write(ctx, b, loc, strings.NewReader("a tar"), backup.Options{Now: func() time.Time { return stop }, Labels: map[string]string{
			LabelMethod: MethodBaseBackup, LabelStartSegment: start.Name(DefaultSegmentSize), LabelStopTime: stop.Format(time.RFC3339Nano), LabelStopLSN: "0/1"}})
		if err != nil {
			t.Fatal(err)
		}
		return loc
	}
	b1 := base(10*24*time.Hour, Segment{1, 2})
	b2 := base(5*24*time.Hour, Segment{1, 10})
	b3 := base(24*time.Hour, Segment{2, 20})
	dir := t.TempDir()
	push := func(name string) {
		path := filepath.Join(dir, name)
		if err := os.WriteFile(path, []byte("wal "+name), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := a.Push(ctx, path); err != nil {
			t.Fatalf("push %s: %v", name, err)
		}
	}
	for no := uint64(1); no <= 15; no++ {
		push(Segment{1, no}.Name(DefaultSegmentSize))
	}
	for no := uint64(15); no <= 25; no++ {
		push(Segment{2, no}.Name(DefaultSegmentSize))
	}
	push("00000002.history")
	push(Segment{1, 2}.Name(DefaultSegmentSize) + ".00000028.backup")

	// A pushed file pushed again is acknowledged; other content is not.
	push(Segment{1, 3}.Name(DefaultSegmentSize))
	other := filepath.Join(t.TempDir(), Segment{1, 3}.Name(DefaultSegmentSize))
	if err := os.WriteFile(other, []byte("other content"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := a.Push(ctx, other); err == nil || !strings.Contains(err.Error(), "archived already with other content") {
		t.Fatalf("a different file under an archived name: %v", err)
	}
	got, err := a.Read(ctx, Segment{1, 3}.Name(DefaultSegmentSize))
	if err != nil || !bytes.Equal(got, []byte("wal "+Segment{1, 3}.Name(DefaultSegmentSize))) {
		t.Fatalf("the archived file after the refused push: %q, %v", got, err)
	}

	// Seven days: b1 is the newest that ended before the window began,
	// so everything from its start stays.
	p, err := a.Prune(ctx, 7*24*time.Hour, now)
	if err != nil || len(p.Bases) != 0 || p.Files != 1 {
		t.Fatalf("prune to 7 days: %+v, %v; want segment 1 alone deleted", p, err)
	}
	// Three days: b2 is; b1 goes, and segments before b2's start.
	p, err = a.Prune(ctx, 3*24*time.Hour, now)
	if err != nil || !slices.Equal(p.Bases, []string{b1}) || p.Files != 9 {
		t.Fatalf("prune to 3 days: %+v, %v; want %s and segments 2 to 9 (and the backup history file) deleted", p, err, b1)
	}
	names, err := a.List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(names, "00000002.history") || names[0] != (Segment{1, 10}).Name(DefaultSegmentSize) || len(names) != 1+6+11 {
		t.Fatalf("left after pruning: %v", names)
	}
	w, err := a.Window(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if w.Bases != 2 || !w.First.Equal(now.Add(-5*24*time.Hour)) || w.Files != 18 || w.LastWAL != (Segment{2, 25}).Name(DefaultSegmentSize) {
		t.Fatalf("window: %+v; want 2 bases, the first point at %s (%s's end), 18 files", w, now.Add(-5*24*time.Hour), b2)
	}
	bases, err := a.Bases(ctx)
	if err != nil || len(bases) != 2 || bases[0].Location != b3 {
		t.Fatalf("bases after pruning: %+v, %v", bases, err)
	}
	if _, err := a.Prune(ctx, 0, now); err == nil {
		t.Fatal("a window of 0 was taken")
	}
}
