package source

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/distribution/distribution/v3/configuration"
	"github.com/distribution/distribution/v3/registry/handlers"
	_ "github.com/distribution/distribution/v3/registry/storage/driver/inmemory"
	"github.com/sirupsen/logrus"

	"github.com/chartpilot/chartpilot/internal/helm/helmtest"
	"github.com/chartpilot/chartpilot/internal/policy"
)

var redisChart = filepath.Join("..", "..", "charts", "redis")

// repoServer serves a chart repository built from charts/redis at several
// versions, behind basic auth; down makes it answer 503.
func repoServer(t *testing.T, versions ...string) (*httptest.Server, *atomic.Bool, *atomic.Int32) {
	t.Helper()
	dir := t.TempDir()
	for _, v := range versions {
		if _, err := helmtest.PackageAs(redisChart, v, dir); err != nil {
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
	if err := helmtest.WriteIndex(dir, srv.URL); err != nil {
		t.Fatal(err)
	}
	return srv, &down, &downloads
}

func creds(user, pass string) CredentialsFunc {
	return func(context.Context) (Credentials, error) { return Credentials{Username: user, Password: pass}, nil }
}

func TestRepoListsLoadsCachesAndSurvivesOutage(t *testing.T) {
	srv, down, downloads := repoServer(t, "0.1.0", "0.1.1", "0.2.0", "1.0.0")
	cache := t.TempDir()
	ctx := context.Background()
	s, err := NewRepo(srv.URL, "redis", Options{Credentials: creds("reader", "s3cret"), CacheDir: cache})
	if err != nil {
		t.Fatal(err)
	}
	if v, _ := s.Versions(); len(v) != 0 {
		t.Fatalf("versions before the first refresh: %v", v)
	}
	changed, err := s.Refresh(ctx)
	if err != nil || !changed {
		t.Fatalf("refresh: changed=%v err=%v", changed, err)
	}
	vs, err := s.Versions()
	if err != nil || strings.Join(vs, ",") != "1.0.0,0.2.0,0.1.1,0.1.0" {
		t.Fatalf("versions %v %v", vs, err)
	}
	if changed, _ := s.Refresh(ctx); changed {
		t.Error("an unchanged index reported a change")
	}
	ch, err := s.Load(ctx, "0.2.0")
	if err != nil || ch.Name != "redis" || ch.Version != "0.2.0" {
		t.Fatalf("load: %v %v", ch, err)
	}
	// Cached by digest: loading again (also from a new Source over the same
	// cache, as after a restart) downloads nothing.
	before := downloads.Load()
	if _, err := s.Load(ctx, "0.2.0"); err != nil {
		t.Fatal(err)
	}
	s2, _ := NewRepo(srv.URL, "redis", Options{Credentials: creds("reader", "s3cret"), CacheDir: cache})
	down.Store(true)
	if ch2, err := s2.Load(ctx, "0.2.0"); err != nil || ch2.Digest != ch.Digest {
		t.Fatalf("after restart with the repository down: %v %v", ch2, err)
	}
	if downloads.Load() != before {
		t.Errorf("a cached chart was downloaded again")
	}
	// The repository is down: versions stay, the error says so.
	_, err = s.Refresh(ctx)
	vs, verr := s.Versions()
	if !errors.Is(err, ErrUnavailable) || !errors.Is(verr, ErrUnavailable) || len(vs) != 4 {
		t.Errorf("repository down: refresh=%v versions=%v (%v); want the old list and ErrUnavailable", err, vs, verr)
	}
	if !strings.Contains(err.Error(), "503") {
		t.Errorf("error %q does not say what the repository answered", err)
	}
	// Wrong credentials: the error says so and carries no password.
	bad, _ := NewRepo(srv.URL, "redis", Options{Credentials: creds("reader", "wrong-pass"), CacheDir: t.TempDir()})
	down.Store(false)
	_, err = bad.Refresh(ctx)
	if err == nil || !strings.Contains(err.Error(), "401") || strings.Contains(err.Error(), "wrong-pass") {
		t.Errorf("bad credentials: %v", err)
	}
	// A chart the repository does not have.
	none, _ := NewRepo(srv.URL, "postgresql", Options{Credentials: creds("reader", "s3cret"), CacheDir: t.TempDir()})
	if _, err := none.Refresh(ctx); err == nil || !strings.Contains(err.Error(), "no chart named postgresql") {
		t.Errorf("missing chart: %v", err)
	}
}

func TestRepoRejectsTamperedArchive(t *testing.T) {
	srv, _, _ := repoServer(t, "0.1.0")
	cache := t.TempDir()
	s, _ := NewRepo(srv.URL, "redis", Options{Credentials: creds("reader", "s3cret"), CacheDir: cache})
	if _, err := s.Refresh(context.Background()); err != nil {
		t.Fatal(err)
	}
	// The index states a digest; an archive that does not match is refused.
	r := s.(*remote)
	e := r.entries["0.1.0"]
	e.Digest = strings.Repeat("0", 64)
	r.entries["0.1.0"] = e
	if _, err := s.Load(context.Background(), "0.1.0"); err == nil || !strings.Contains(err.Error(), "does not match") {
		t.Fatalf("tampered archive: %v", err)
	}
	left, _ := filepath.Glob(filepath.Join(cache, "*.tgz"))
	if len(left) != 0 {
		t.Errorf("a refused archive was cached: %v", left)
	}
}

// ociRegistry runs a real OCI registry (distribution) in memory on loopback.
func ociRegistry(t *testing.T) string {
	t.Helper()
	cfg := &configuration.Configuration{Storage: configuration.Storage{"inmemory": configuration.Parameters{}}}
	cfg.Log.Level = "error"
	cfg.Log.AccessLog.Disabled = true
	logrus.SetOutput(io.Discard) // the registry logs every request through logrus
	app := handlers.NewApp(context.Background(), cfg)
	srv := httptest.NewServer(app)
	t.Cleanup(srv.Close)
	return "oci://" + strings.TrimPrefix(srv.URL, "http://") + "/charts"
}

func TestOCIListsAndLoadsTags(t *testing.T) {
	base := ociRegistry(t)
	dir := t.TempDir()
	for _, v := range []string{"1.0.0", "1.1.0", "2.0.0"} {
		if err := helmtest.Push(redisChart, v, base+"/redis", dir); err != nil {
			t.Fatal(err)
		}
	}
	ctx := context.Background()
	cache := t.TempDir()
	s, err := NewOCI(base, "redis", Options{CacheDir: cache, PlainHTTP: true})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Refresh(ctx); err != nil {
		t.Fatal(err)
	}
	vs, _ := s.Versions()
	if strings.Join(vs, ",") != "2.0.0,1.1.0,1.0.0" {
		t.Fatalf("versions %v", vs)
	}
	c, err := policy.Choose(vs, policy.Policy{Chart: "redis", Deployed: "1.0.0"})
	if err != nil || c.Version != "1.1.0" || c.Blocked != policy.ReasonMajorUpgrade {
		t.Fatalf("choice %+v %v", c, err)
	}
	ch, err := s.Load(ctx, c.Version)
	if err != nil || ch.Version != "1.1.0" || ch.Name != "redis" {
		t.Fatalf("load: %v %v", ch, err)
	}
	// A restart with the registry gone still has the list and the archive.
	s2, _ := NewOCI("oci://127.0.0.1:1/charts", "redis", Options{CacheDir: cache, PlainHTTP: true})
	if _, err := s2.Refresh(ctx); !errors.Is(err, ErrUnavailable) {
		t.Fatalf("refresh of an unreachable registry: %v", err)
	}
	if vs2, _ := s2.Versions(); len(vs2) != 3 {
		t.Errorf("versions after restart: %v", vs2)
	}
	if ch2, err := s2.Load(ctx, "1.1.0"); err != nil || ch2.Digest != ch.Digest {
		t.Errorf("cached archive after restart: %v %v", ch2, err)
	}
}

// TestConcurrentLoadsDownloadOnce: a fleet asks for a new version at once;
// every caller gets the chart and it is downloaded once.
func TestConcurrentLoadsDownloadOnce(t *testing.T) {
	srv, _, downloads := repoServer(t, "0.1.0", "0.2.0")
	s, _ := NewRepo(srv.URL, "redis", Options{Credentials: creds("reader", "s3cret"), CacheDir: t.TempDir()})
	if _, err := s.Refresh(context.Background()); err != nil {
		t.Fatal(err)
	}
	errs := make(chan error, 32)
	for range 32 {
		go func() {
			ch, err := s.Load(context.Background(), "0.2.0")
			if err == nil && ch.Version != "0.2.0" {
				err = errors.New("wrong version " + ch.Version)
			}
			errs <- err
		}()
	}
	for range 32 {
		if err := <-errs; err != nil {
			t.Error(err)
		}
	}
	if n := downloads.Load(); n != 1 {
		t.Errorf("%d downloads for 32 concurrent loads, want 1", n)
	}
}

// TestCredentialsStayWithTheRepository: an index may point at archives on
// another server; the repository's credentials are not sent there.
func TestCredentialsStayWithTheRepository(t *testing.T) {
	dir := t.TempDir()
	if _, err := helmtest.PackageAs(redisChart, "0.1.0", dir); err != nil {
		t.Fatal(err)
	}
	var leaked atomic.Bool
	other := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") != "" {
			leaked.Store(true)
		}
		http.FileServer(http.Dir(dir)).ServeHTTP(w, r)
	}))
	t.Cleanup(other.Close)
	// The index lists archives by absolute URL on the other server.
	if err := helmtest.WriteIndex(dir, other.URL); err != nil {
		t.Fatal(err)
	}
	index, err := os.ReadFile(filepath.Join(dir, "index.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	repo := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if u, p, ok := r.BasicAuth(); !ok || u != "reader" || p != "s3cret" {
			http.Error(w, "no", http.StatusUnauthorized)
			return
		}
		_, _ = w.Write(index)
	}))
	t.Cleanup(repo.Close)
	otherHost := strings.TrimPrefix(other.URL, "http://")
	s, _ := NewRepo(repo.URL, "redis", Options{Credentials: creds("reader", "s3cret"), CacheDir: t.TempDir(), AllowedHosts: []string{otherHost}})
	if _, err := s.Refresh(context.Background()); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Load(context.Background(), "0.1.0"); err != nil {
		t.Fatal(err)
	}
	if leaked.Load() {
		t.Error("the repository's credentials were sent to another server")
	}
}
