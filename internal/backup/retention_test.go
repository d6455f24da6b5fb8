package backup_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/chartpilot/chartpilot/internal/backup"
)

// TestRetention on a real S3 server and on a directory: the newest Count
// are kept, those older than MaxAge go, the newest good backup always
// stays, a backup without a manifest is left alone, and an unreadable
// manifest stops the pruning before anything is deleted.
func TestRetention(t *testing.T) {
	_, stores := testStores(t)
	for _, store := range stores {
		t.Run(store.name, func(t *testing.T) {
			ctx := context.Background()
			b := store.b
			t0 := time.Date(2026, 11, 30, 0, 0, 0, 0, time.UTC)
			var all []string
			for i := range 5 {
				at := t0.Add(time.Duration(i) * time.Hour)
				loc := "orders/" + at.Format("20060102T150405Z")
				if _, err := backup.Write(ctx, b, loc, strings.NewReader(fmt.Sprint("dump ", i)), backup.Options{Now: func() time.Time { return at }}); err != nil {
					t.Fatal(err)
				}
				all = append(all, loc)
			}
			if err := b.WriteAll(ctx, "orders/being-written/data", []byte("partial"), nil); err != nil {
				t.Fatal(err)
			}
			if _, err := backup.Write(ctx, b, "payments/20261130T000000Z", strings.NewReader("other series"), backup.Options{Now: func() time.Time { return t0 }}); err != nil {
				t.Fatal(err)
			}
			kept := func() []string {
				t.Helper()
				complete, incomplete, err := backup.List(ctx, b, "orders")
				if err != nil {
					t.Fatal(err)
				}
				if !slices.Equal(incomplete, []string{"orders/being-written"}) {
					t.Errorf("incomplete backups %v, want the one without a manifest", incomplete)
				}
				var out []string
				for _, s := range complete {
					out = append(out, s.Location)
				}
				return out
			}
			now := t0.Add(4*time.Hour + time.Minute)
			if got := kept(); !slices.Equal(got, []string{all[4], all[3], all[2], all[1], all[0]}) {
				t.Fatalf("listed %v, want newest first", got)
			}

			pruned, err := backup.Prune(ctx, b, "orders", backup.Retention{Count: 3}, now)
			if err != nil || !slices.Equal(pruned, []string{all[1], all[0]}) {
				t.Fatalf("count 3 pruned %v (%v), want the two oldest", pruned, err)
			}
			if got := kept(); !slices.Equal(got, []string{all[4], all[3], all[2]}) {
				t.Errorf("after count 3: %v", got)
			}
			if pruned, err := backup.Prune(ctx, b, "orders", backup.Retention{MaxAge: 90 * time.Minute}, now); err != nil || !slices.Equal(pruned, []string{all[2]}) {
				t.Errorf("maxAge 90m pruned %v (%v), want the one 2 h old", pruned, err)
			}
			later := now.Add(30 * 24 * time.Hour)
			if pruned, err := backup.Prune(ctx, b, "orders", backup.Retention{Count: 1, MaxAge: time.Minute}, later); err != nil || !slices.Equal(pruned, []string{all[3]}) {
				t.Errorf("everything old: pruned %v (%v), want all but the newest", pruned, err)
			}
			if got := kept(); !slices.Equal(got, []string{all[4]}) {
				t.Errorf("the newest good backup is gone: %v", got)
			}
			if ok, _ := b.Exists(ctx, "payments/20261130T000000Z/manifest.json"); !ok {
				t.Errorf("another series was pruned")
			}

			// An unreadable manifest: nothing is deleted.
			at := t0.Add(5 * time.Hour)
			if _, err := backup.Write(ctx, b, "orders/20261130T050000Z", strings.NewReader("dump 5"), backup.Options{Now: func() time.Time { return at }}); err != nil {
				t.Fatal(err)
			}
			if err := b.WriteAll(ctx, all[4]+"/manifest.json", []byte("{not json"), nil); err != nil {
				t.Fatal(err)
			}
			if pruned, err := backup.Prune(ctx, b, "orders", backup.Retention{Count: 1}, later); err == nil || len(pruned) > 0 {
				t.Errorf("with an unreadable manifest: pruned %v, err %v; want an error and nothing deleted", pruned, err)
			}
			if ok, _ := b.Exists(ctx, all[4]+"/data"); !ok {
				t.Errorf("data deleted although the listing failed")
			}
		})
	}
	if _, err := backup.Prune(context.Background(), stores[1].b, "x", backup.Retention{Count: -1}, time.Now()); err == nil {
		t.Errorf("a negative count was accepted")
	}
}
