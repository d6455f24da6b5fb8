package wal_test

import (
	"context"
	"errors"
	"fmt"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/chartpilot/chartpilot/internal/agent/wal"
)

// TestPrunedArchiveRecoversItsWindow: with two base backups in the
// archive of a real server, a prune whose window begins after the second
// ended deletes the first and the WAL before the second's start; a
// recovery to the first point the window holds (the end of the base
// backup kept) then succeeds, with every row committed by then, and one to
// a point before it is refused, naming the oldest base backup left.
func TestPrunedArchiveRecoversItsWindow(t *testing.T) {
	p := newPITR(t)
	p.prefix = "shop/pruned"
	data := filepath.Join(p.dir, "a")
	if out, err := p.r.Command(nil, "initdb", "-D", data, "-U", "postgres", "--auth=trust", "-E", "UTF8").CombinedOutput(); err != nil {
		t.Fatalf("initdb: %v\n%s", err, out)
	}
	a := p.start("a", data)
	a.query(`create table numbered (id int primary key)`)
	a.insert(1, 50)
	base := func() {
		t.Helper()
		if out, err := p.agentRun(a.env(), append([]string{"base-backup"}, p.storeArgs()...)...); err != nil {
			t.Fatalf("base-backup: %v\n%s", err, out)
		}
	}
	base()
	a.insert(51, 150)
	a.switchAndWait()
	time.Sleep(1100 * time.Millisecond) // base backups are named by the second
	base()
	a.insert(151, 200)
	a.switchAndWait()
	before := a.query(`select to_char(pg_xact_commit_timestamp(xmin) at time zone 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"') from numbered where id = 100`)

	arch := p.archive()
	ctx := context.Background()
	bases, err := arch.Bases(ctx)
	if err != nil || len(bases) != 2 {
		t.Fatalf("base backups before the prune: %d, %v", len(bases), err)
	}
	kept := bases[0] // newest first
	start := kept.Manifest.Labels[wal.LabelStartSegment]
	pr, err := arch.Prune(ctx, time.Second, time.Now().Add(time.Minute))
	if err != nil || len(pr.Bases) != 1 || pr.Files == 0 {
		t.Fatalf("prune: %+v, %v; want the older base backup and the WAL before the newer's start deleted", pr, err)
	}
	names, err := arch.List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range names {
		if len(n) == 24 && n < start {
			t.Errorf("segment %s, older than the kept base backup's start %s, is still there", n, start)
		}
	}
	w, err := arch.Window(ctx)
	if err != nil || w.Bases != 1 || w.First.IsZero() {
		t.Fatalf("the window after the prune: %+v, %v", w, err)
	}
	first := w.First.UTC().Format(time.RFC3339Nano)
	want := a.query(fmt.Sprintf(`select string_agg(id::text, ',' order by id) from numbered where pg_xact_commit_timestamp(xmin) <= '%s'`, first))
	dataB, out, err := p.recoverTo("b", "--target-time="+first)
	if err != nil {
		t.Fatalf("recovery to the window's first point %s: %v\n%s", first, err, out)
	}
	b := p.start("b", dataB)
	if got := b.query(`select string_agg(id::text, ',' order by id) from numbered`); got != want {
		t.Fatalf("recovered to %s: rows %s, want %s", first, clip(got), clip(want))
	}
	b.stop()
	_, out, err = p.recoverTo("c", "--target-time="+before)
	var exit *exec.ExitError
	if !errors.As(err, &exit) || !strings.Contains(out, "no base backup ends before") {
		t.Fatalf("recovery to %s, before the window: %v\n%s", before, err, out)
	}
	t.Logf("window from %s; before it: %s", first, lastLine(out))
}
