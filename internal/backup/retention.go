package backup

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sort"
	"strings"
	"time"

	"gocloud.dev/blob"
)

// Retention says which backups of a series to keep. A backup is pruned
// when it is beyond the newest Count, or older than MaxAge; zero turns a
// rule off. The newest complete backup is never pruned.
type Retention struct {
	Count  int
	MaxAge time.Duration
}

// Stored is a complete backup of a series (its manifest read).
type Stored struct {
	Location string
	Manifest *Manifest
}

// List returns the complete backups under series (each a location
// series/<name>/ holding a manifest), newest first, and the locations that
// hold data but no manifest (a backup that did not finish, or one being
// written). An error reading any of them is returned with nothing else:
// a partial list must not drive deletions.
func List(ctx context.Context, b *blob.Bucket, series string) ([]Stored, []string, error) {
	prefix := strings.TrimSuffix(series, "/") + "/"
	it := b.List(&blob.ListOptions{Prefix: prefix, Delimiter: "/"})
	var complete []Stored
	var incomplete []string
	for {
		obj, err := it.Next(ctx)
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, nil, fmt.Errorf("listing the backups under %s: %w", prefix, err)
		}
		if !obj.IsDir {
			continue
		}
		location := strings.TrimSuffix(obj.Key, "/")
		hasManifest, err := b.Exists(ctx, manifestKey(location))
		if err != nil {
			return nil, nil, fmt.Errorf("listing the backups under %s: %w", prefix, err)
		}
		if !hasManifest {
			incomplete = append(incomplete, location)
			continue
		}
		m, err := ReadManifest(ctx, b, location)
		if err != nil {
			return nil, nil, fmt.Errorf("listing the backups under %s: %w", prefix, err)
		}
		complete = append(complete, Stored{Location: location, Manifest: m})
	}
	sort.SliceStable(complete, func(i, j int) bool {
		a, c := complete[i].Manifest.Created, complete[j].Manifest.Created
		if !a.Equal(c) {
			return a.After(c)
		}
		return complete[i].Location > complete[j].Location
	})
	return complete, incomplete, nil
}

// Prune deletes the complete backups of series that r does not keep and
// returns their locations. Nothing is deleted when the listing fails, the
// newest complete backup is always kept, and backups without a manifest
// are left alone (one may be being written). A backup's manifest is
// deleted before its data, so one cut short is incomplete, never a
// manifest without data.
func Prune(ctx context.Context, b *blob.Bucket, series string, r Retention, now time.Time) ([]string, error) {
	if r.Count < 0 || r.MaxAge < 0 {
		return nil, fmt.Errorf("retention: count and maxAge cannot be negative")
	}
	complete, _, err := List(ctx, b, series)
	if err != nil {
		return nil, err
	}
	var pruned []string
	for i, s := range complete {
		if i == 0 {
			continue // the newest good backup
		}
		beyondCount := r.Count > 0 && i >= r.Count
		tooOld := r.MaxAge > 0 && now.Sub(s.Manifest.Created) > r.MaxAge
		if !beyondCount && !tooOld {
			continue
		}
		if err := Delete(ctx, b, s.Location); err != nil {
			return pruned, err
		}
		pruned = append(pruned, s.Location)
	}
	return pruned, nil
}

// Delete deletes the backup at location: its manifest first, then its
// data, so that one cut short is incomplete, never a manifest without
// data.
func Delete(ctx context.Context, b *blob.Bucket, location string) error {
	for _, key := range []string{manifestKey(location), dataKey(location)} {
		if err := b.Delete(ctx, key); err != nil && !isNotFound(err) {
			return fmt.Errorf("pruning %s: %w", location, err)
		}
	}
	return nil
}
