package operator

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/chartpilot/chartpilot/internal/source"
	"github.com/chartpilot/chartpilot/internal/watches"
)

// The manager's download limits (flags --max-index-size, --max-chart-size)
// reach every remote source it makes.
func TestSourcesTakeTheManagersDownloadLimits(t *testing.T) {
	index := "apiVersion: v1\nentries:\n  redis:\n    - {name: redis, version: 1.0.0, urls: [redis-1.0.0.tgz]}\n# " + strings.Repeat("x", 256<<10) + "\n"
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = w.Write([]byte(index))
	}))
	defer srv.Close()
	w := watches.Watch{Remote: &watches.RemoteChart{Repo: srv.URL, Name: "redis"}}

	small, err := newSource(w, t.TempDir(), source.Options{MaxIndexSize: 128 << 10}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := small.Refresh(context.Background()); !errors.Is(err, source.ErrTooLarge) {
		t.Fatalf("a 256 KiB index under a 128 KiB limit: %v, want ErrTooLarge", err)
	}
	dflt, err := newSource(w, t.TempDir(), source.Options{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := dflt.Refresh(context.Background()); err != nil {
		t.Fatalf("the same index under the default limit: %v", err)
	}
	if vs, _ := dflt.Versions(); len(vs) != 1 {
		t.Fatalf("versions %v, want [1.0.0]", vs)
	}
}
