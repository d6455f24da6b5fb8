package source

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/chartpilot/chartpilot/internal/helm"
)

// repoServer serves a chart repository built from charts/redis at several
// versions, behind basic auth; down makes it answer 503.
func repoServer(t *testing.T, versions ...string) (*httptest.Server, *atomic.Bool, *atomic.Int32) {
	t.Helper()
	dir := t.TempDir()
	for _, v := range versions {
		if _, err := helm.PackageAs(filepath.Join("..", "..", "charts", "redis"), v, dir); err != nil {
			t.Fatal(err)
		}
	}
	var down atomic.Bool
	var downloads atomic.Int32
	files := http.FileServer(http.Dir(dir))
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if down.Load() {
			http.Error(w, "down", http.StatusServiceUnavailable)
			return
		}
		if u, p, ok := r.BasicAuth(); !ok || u != "reader" || p != "s3cret" {
			http.Error(w, "no", http.StatusUnauthorized)
			return
		}
		if strings.HasSuffix(r.URL.Path, ".tgz") {
			downloads.Add(1)
		}
		files.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	if err := helm.WriteIndex(dir, srv.URL); err != nil {
		t.Fatal(err)
	}
	return srv, &down, &downloads
}

func TestRepoResolvesHighestSatisfyingVersion(t *testing.T) {
	srv, down, downloads := repoServer(t, "0.1.0", "0.1.1", "0.2.0", "1.0.0")
	r := &Repo{URL: srv.URL, Name: "redis", Constraint: "<1.0.0", Username: "reader", Password: "s3cret", CacheDir: t.TempDir()}
	ctx := context.Background()

	res, err := r.Resolve(ctx, "")
	if err != nil {
		t.Fatal(err)
	}
	if res.Version != "0.2.0" || res.Chart.Version != "0.2.0" || res.Chart.Name != "redis" {
		t.Errorf("resolved %s (chart %s %s), want 0.2.0", res.Version, res.Chart.Name, res.Chart.Version)
	}
	if strings.Join(res.Available, ",") != "1.0.0,0.2.0,0.1.1,0.1.0" {
		t.Errorf("available = %v", res.Available)
	}
	// A resource's own constraint narrows the choice.
	res, err = r.Resolve(ctx, "~0.1")
	if err != nil || res.Version != "0.1.1" {
		t.Fatalf("with ~0.1: %v %v", res, err)
	}
	// Cached by digest: resolving again downloads nothing.
	before := downloads.Load()
	if _, err := r.Resolve(ctx, "~0.1"); err != nil {
		t.Fatal(err)
	}
	if downloads.Load() != before {
		t.Errorf("a cached chart was downloaded again")
	}
	// Nothing satisfies: a clear error listing what exists.
	_, err = (&Repo{URL: srv.URL, Name: "redis", Constraint: ">=2", Username: "reader", Password: "s3cret", CacheDir: t.TempDir()}).Resolve(ctx, "")
	if err == nil || !strings.Contains(err.Error(), "no version of chart redis") || !strings.Contains(err.Error(), "1.0.0, 0.2.0") {
		t.Errorf("unsatisfiable: %v", err)
	}
	// Wrong credentials: the error says so and carries no password.
	_, err = (&Repo{URL: srv.URL, Name: "redis", Username: "reader", Password: "wrong", CacheDir: t.TempDir()}).Resolve(ctx, "")
	if err == nil || !strings.Contains(err.Error(), "401") || strings.Contains(err.Error(), "wrong") {
		t.Errorf("bad credentials: %v", err)
	}
	// The repository goes down: the last chart stays, flagged stale.
	down.Store(true)
	res, err = r.Resolve(ctx, "~0.1")
	if !errors.Is(err, ErrStale) || res == nil || res.Version != "0.1.1" {
		t.Errorf("repository down: got %v, %v; want the last chart and ErrStale", res, err)
	}
}
