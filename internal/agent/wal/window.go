package wal

import (
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	"gocloud.dev/blob"

	"github.com/chartpilot/chartpilot/internal/backup"
)

// Window is what an archive can recover to.
type Window struct {
	// First is the earliest point a recovery can stop at: the end of the
	// oldest base backup. Zero when there is no base backup.
	First time.Time
	// Last is when the newest WAL file was archived: no commit after it
	// is in the archive (a commit just before it may be in a segment not
	// yet archived).
	Last time.Time
	// LastWAL is the newest WAL segment's name (the highest timeline,
	// then position).
	LastWAL string
	Bases   int
	Files   int
}

// Window reads what the archive can recover to.
func (a *Archive) Window(ctx context.Context) (*Window, error) {
	bases, err := a.Bases(ctx)
	if err != nil {
		return nil, err
	}
	w := &Window{Bases: len(bases)}
	if len(bases) > 0 {
		oldest := bases[len(bases)-1].Manifest
		if w.First, err = time.Parse(time.RFC3339Nano, oldest.Labels[LabelStopTime]); err != nil {
			return nil, fmt.Errorf("base backup %s: its stop time: %w", bases[len(bases)-1].Location, err)
		}
	}
	err = a.eachFile(ctx, func(name string, obj *blob.ListObject) error {
		w.Files++
		if obj.ModTime.After(w.Last) {
			w.Last = obj.ModTime
		}
		// By name, not by time: segments pushed in the same second (the
		// store's precision) are ordered by their position in the WAL.
		if segmentName.MatchString(name) && name > w.LastWAL {
			w.LastWAL = name
		}
		return nil
	})
	return w, err
}

func (a *Archive) eachFile(ctx context.Context, fn func(string, *blob.ListObject) error) error {
	if err := a.check(); err != nil {
		return err
	}
	it := a.Bucket.List(&blob.ListOptions{Prefix: a.prefix() + "/wal/"})
	for {
		obj, err := it.Next(ctx)
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
		if n := obj.Key[len(a.prefix())+len("/wal/"):]; ValidName(n) {
			if err := fn(n, obj); err != nil {
				return err
			}
		}
	}
}

// Pruned is what Prune deleted.
type Pruned struct {
	Bases []string
	Files int
}

// Prune keeps what a recovery to any point of the last window needs and
// deletes the rest: the newest base backup that ended at or before
// now-window and every newer one are kept (all of them when none is that
// old), older base backups are deleted, and so are WAL segments older
// than the oldest kept base backup's start, on every timeline. History
// files are always kept. Nothing is deleted when a listing fails, when
// the archive has no base backup, or when a read of the kept base's
// manifest fails.
func (a *Archive) Prune(ctx context.Context, window time.Duration, now time.Time) (*Pruned, error) {
	if window <= 0 {
		return nil, fmt.Errorf("recovery window %s: must be positive", window)
	}
	bases, err := a.Bases(ctx)
	if err != nil {
		return nil, err
	}
	if len(bases) == 0 {
		return &Pruned{}, nil
	}
	keep := len(bases) // bases[:keep] are kept (newest first)
	cutoff := now.Add(-window)
	for i, s := range bases {
		stop, err := time.Parse(time.RFC3339Nano, s.Manifest.Labels[LabelStopTime])
		if err != nil {
			return nil, fmt.Errorf("base backup %s: its stop time: %w (nothing pruned)", s.Location, err)
		}
		if !stop.After(cutoff) {
			keep = i + 1
			break
		}
	}
	oldest := bases[keep-1]
	start, err := ParseSegment(oldest.Manifest.Labels[LabelStartSegment], a.segSize())
	if err != nil {
		return nil, fmt.Errorf("base backup %s: %w (nothing pruned)", oldest.Location, err)
	}
	var doomed []string
	err = a.eachFile(ctx, func(name string, _ *blob.ListObject) error {
		if IsHistory(name) || len(name) < 24 {
			return nil
		}
		if s, err := ParseSegment(name[:24], a.segSize()); err == nil && s.No < start.No {
			doomed = append(doomed, name)
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("listing the archive: %w (nothing pruned)", err)
	}
	p := &Pruned{}
	// Base backups first, oldest first: a cut-short prune leaves WAL that
	// no base needs, never a base without its WAL.
	for i := len(bases) - 1; i >= keep; i-- {
		if err := backup.Delete(ctx, a.Bucket, bases[i].Location); err != nil {
			return p, err
		}
		p.Bases = append(p.Bases, bases[i].Location)
	}
	for _, name := range doomed {
		if err := a.Bucket.Delete(ctx, a.Key(name)); err != nil {
			return p, fmt.Errorf("deleting %s: %w", name, err)
		}
		p.Files++
	}
	return p, nil
}
