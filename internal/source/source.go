// Package source provides the charts of watches.yaml entries: a local
// directory or archive, a chart repository (index.yaml over HTTP(S)) or an
// OCI registry. Remote sources list the versions they hold, refresh that
// list on an interval and on demand, and download a version once: archives
// are cached on disk by digest, and the version list is kept on disk too, so
// a repository that is down (even across a restart) leaves every release on
// what it has. Which version a resource gets is decided by Choose.
package source

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"sync"
	"time"

	"github.com/Masterminds/semver/v3"

	"github.com/chartpilot/chartpilot/internal/helm"
)

// ErrUnavailable wraps a refresh error: the source answers from what it
// read before.
var ErrUnavailable = errors.New("chart source unreachable; keeping the versions read before")

// Source is where one watch's chart comes from.
type Source interface {
	// Name is the chart's name.
	Name() string
	// String says where the chart comes from, without credentials.
	String() string
	// Versions lists the versions known, highest first. err wraps
	// ErrUnavailable when the last refresh failed (the list is what was
	// read before, possibly empty).
	Versions() ([]string, error)
	// Refresh reads the version list now and reports whether it changed.
	Refresh(ctx context.Context) (changed bool, err error)
	// Load returns the chart of an exact version.
	Load(ctx context.Context, version string) (*helm.Chart, error)
	// Interval is how often Refresh should run (0: never; the source is static).
	Interval() time.Duration
}

// Local is a chart directory or archive shipped with the operator.
type Local struct{ chart *helm.Chart }

// NewLocal loads the chart at path.
func NewLocal(path string) (*Local, error) {
	ch, err := helm.LoadChart(path)
	if err != nil {
		return nil, err
	}
	return &Local{chart: ch}, nil
}

// Name implements Source.
func (l *Local) Name() string { return l.chart.Name }

// String implements Source.
func (l *Local) String() string { return l.chart.Path }

// Versions implements Source.
func (l *Local) Versions() ([]string, error) { return []string{l.chart.Version}, nil }

// Refresh implements Source.
func (l *Local) Refresh(context.Context) (bool, error) { return false, nil }

// Interval implements Source.
func (l *Local) Interval() time.Duration { return 0 }

// Load implements Source.
func (l *Local) Load(_ context.Context, version string) (*helm.Chart, error) {
	if version != l.chart.Version {
		return nil, fmt.Errorf("chart %s holds version %s, not %s", l.chart.Path, l.chart.Version, version)
	}
	return l.chart, nil
}

// Credentials authenticate to a remote source. They are read again for
// every refresh and download, so a rotated Secret takes effect.
type Credentials struct {
	Username, Password string
	// CAData is a PEM bundle of CAs to trust.
	CAData []byte
}

// CredentialsFunc reads the credentials (nil: anonymous).
type CredentialsFunc func(ctx context.Context) (Credentials, error)

// entry is one version a remote source holds.
type entry struct {
	Version string `json:"version"`
	// Digest is the sha256 of the archive, when the source states it (chart
	// repositories do) or once it was downloaded.
	Digest string `json:"digest,omitempty"`
	// URL is where a chart repository serves the archive.
	URL string `json:"url,omitempty"`
}

// backend is what differs between chart repositories and OCI registries.
type backend interface {
	list(ctx context.Context, cr Credentials) ([]entry, error)
	fetch(ctx context.Context, cr Credentials, e entry) ([]byte, error)
	where() string
}

// remote is a Source over a backend, with the on-disk cache.
type remote struct {
	name     string
	b        backend
	creds    CredentialsFunc
	cacheDir string
	interval time.Duration

	// fetchMu serialises downloads and loads from disk: many resources
	// ask for a new version at the same moment, and it is read once.
	fetchMu sync.Mutex

	mu       sync.Mutex
	entries  map[string]entry
	versions []string
	lastErr  error
	charts   map[string]*helm.Chart // by digest
}

func newRemote(name string, b backend, creds CredentialsFunc, cacheDir string, interval time.Duration) (*remote, error) {
	if err := os.MkdirAll(cacheDir, 0o755); err != nil {
		return nil, fmt.Errorf("chart cache: %w", err)
	}
	r := &remote{name: name, b: b, creds: creds, cacheDir: cacheDir, interval: interval, entries: map[string]entry{}, charts: map[string]*helm.Chart{}}
	// What was read before a restart is what the source holds until a refresh succeeds.
	if data, err := os.ReadFile(r.listPath()); err == nil {
		var es []entry
		if json.Unmarshal(data, &es) == nil {
			r.setEntries(es)
		}
	}
	return r, nil
}

func (r *remote) listPath() string { return filepath.Join(r.cacheDir, "versions.json") }

func (r *remote) Name() string            { return r.name }
func (r *remote) String() string          { return r.b.where() }
func (r *remote) Interval() time.Duration { return r.interval }

func (r *remote) Versions() ([]string, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.versions), r.lastErr
}

func (r *remote) credentials(ctx context.Context) (Credentials, error) {
	if r.creds == nil {
		return Credentials{}, nil
	}
	return r.creds(ctx)
}

func (r *remote) Refresh(ctx context.Context) (bool, error) {
	cr, err := r.credentials(ctx)
	var es []entry
	if err == nil {
		es, err = r.b.list(ctx, cr)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if err != nil {
		r.lastErr = fmt.Errorf("%w: %s: %w", ErrUnavailable, r.b.where(), err)
		return false, r.lastErr
	}
	r.lastErr = nil
	before := slices.Clone(r.versions)
	// Digests learnt by downloading are kept when the list does not state them.
	for i := range es {
		if es[i].Digest == "" {
			es[i].Digest = r.entries[es[i].Version].Digest
		}
	}
	r.setEntries(es)
	if data, err := json.Marshal(es); err == nil {
		_ = writeFileAtomic(r.listPath(), data)
	}
	return !slices.Equal(before, r.versions), nil
}

// setEntries replaces the version list; r.mu is held (or r is new).
func (r *remote) setEntries(es []entry) {
	type v struct {
		sv *semver.Version
		e  entry
	}
	var vs []v
	for _, e := range es {
		sv, err := semver.NewVersion(e.Version)
		if err != nil {
			continue
		}
		vs = append(vs, v{sv, e})
	}
	sort.SliceStable(vs, func(i, j int) bool { return vs[i].sv.GreaterThan(vs[j].sv) })
	r.entries = make(map[string]entry, len(vs))
	r.versions = r.versions[:0]
	for _, x := range vs {
		if _, dup := r.entries[x.e.Version]; dup {
			continue
		}
		r.entries[x.e.Version] = x.e
		r.versions = append(r.versions, x.e.Version)
	}
}

func (r *remote) cached(version string) (entry, *helm.Chart, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	e, ok := r.entries[version]
	if !ok || e.Digest == "" {
		return e, nil, ok
	}
	return e, r.charts[e.Digest], ok
}

func (r *remote) Load(ctx context.Context, version string) (*helm.Chart, error) {
	if _, ch, _ := r.cached(version); ch != nil {
		return ch, nil
	}
	r.fetchMu.Lock()
	defer r.fetchMu.Unlock()
	e, ch, ok := r.cached(version)
	if ch != nil {
		return ch, nil // loaded while this one waited
	}
	if !ok {
		return nil, fmt.Errorf("%s holds no version %s of chart %s", r.b.where(), version, r.name)
	}
	path := ""
	if e.Digest != "" {
		if p := filepath.Join(r.cacheDir, e.Digest+".tgz"); fileExists(p) {
			path = p
		}
	}
	if path == "" {
		cr, err := r.credentials(ctx)
		if err != nil {
			return nil, err
		}
		data, err := r.b.fetch(ctx, cr, e)
		if err != nil {
			return nil, fmt.Errorf("downloading chart %s %s from %s: %w", r.name, version, r.b.where(), err)
		}
		sum := sha256.Sum256(data)
		digest := hex.EncodeToString(sum[:])
		if e.Digest != "" && digest != e.Digest {
			return nil, fmt.Errorf("chart %s %s from %s: the archive's digest %s does not match the stated %s", r.name, version, r.b.where(), digest, e.Digest)
		}
		path = filepath.Join(r.cacheDir, digest+".tgz")
		if err := writeFileAtomic(path, data); err != nil {
			return nil, err
		}
		e.Digest = digest
	}
	ch, err := helm.LoadChart(path)
	if err != nil {
		return nil, err
	}
	if ch.Name != r.name || ch.Version != version {
		return nil, fmt.Errorf("%s serves chart %s %s as %s %s: fix the repository", r.b.where(), ch.Name, ch.Version, r.name, version)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.charts[e.Digest] = ch
	if cur, ok := r.entries[version]; ok && cur.Digest == "" {
		cur.Digest = e.Digest
		r.entries[version] = cur
		es := make([]entry, 0, len(r.entries))
		for _, v := range r.versions {
			es = append(es, r.entries[v])
		}
		if data, err := json.Marshal(es); err == nil {
			_ = writeFileAtomic(r.listPath(), data)
		}
	}
	return ch, nil
}

func fileExists(p string) bool {
	_, err := os.Stat(p)
	return err == nil
}

// writeFileAtomic writes through a temporary file of its own, so that
// concurrent writers (two operator processes sharing a cache) never see or
// leave a partial file.
func writeFileAtomic(path string, data []byte) error {
	f, err := os.CreateTemp(filepath.Dir(path), filepath.Base(path)+".*.tmp")
	if err != nil {
		return err
	}
	_, werr := f.Write(data)
	cerr := f.Close()
	if err := errors.Join(werr, cerr); err != nil {
		_ = os.Remove(f.Name())
		return err
	}
	if err := os.Chmod(f.Name(), 0o644); err != nil {
		_ = os.Remove(f.Name())
		return err
	}
	return os.Rename(f.Name(), path)
}

// CacheKey names a source's cache directory: one per location and chart.
func CacheKey(location, name string) string {
	sum := sha256.Sum256([]byte(location + "\x00" + name))
	return name + "-" + hex.EncodeToString(sum[:6])
}
