// Package source resolves the chart of a watch: from a chart repository
// (index.yaml over HTTP(S), optional basic auth and CA), by the highest
// version satisfying the watch's semver constraint and, optionally, a
// resource's own. Downloaded charts are cached on disk by digest; a
// repository that cannot be reached leaves everything on the chart last
// resolved and says so (ErrStale), so nothing is ever uninstalled for it.
package source

import (
	"context"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/Masterminds/semver/v3"

	"github.com/chartpilot/chartpilot/internal/helm"
)

// ErrStale wraps a repository error when the last resolved chart is
// returned instead.
var ErrStale = errors.New("chart repository unreachable; keeping the chart resolved before")

// Repo is a chart in a chart repository.
type Repo struct {
	// URL of the repository (the directory holding index.yaml).
	URL string
	// Name of the chart.
	Name string
	// Constraint on its version, e.g. "~1.4" or ">=1.0.0, <2".
	Constraint string
	// Username and Password for basic auth (never logged).
	Username, Password string
	// CAData is a PEM CA bundle to trust.
	CAData []byte
	// CacheDir holds index.yaml and charts by digest.
	CacheDir string

	mu   sync.Mutex
	last *Resolved
}

// Resolved is a chart version chosen from the repository.
type Resolved struct {
	Chart   *helm.Chart
	Version string
	// Available lists every version in the index, highest first.
	Available []string
	// FetchedAt is when the index was read.
	FetchedAt time.Time
}

func (r *Repo) client() (*http.Client, error) {
	tr := http.DefaultTransport.(*http.Transport).Clone()
	if len(r.CAData) > 0 {
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(r.CAData) {
			return nil, errors.New("the repository CA bundle holds no PEM certificate")
		}
		tr.TLSClientConfig = &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}
	}
	return &http.Client{Transport: tr, Timeout: time.Minute}, nil
}

func (r *Repo) get(ctx context.Context, c *http.Client, u string) ([]byte, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return nil, err
	}
	if r.Username != "" || r.Password != "" {
		req.SetBasicAuth(r.Username, r.Password)
	}
	resp, err := c.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET %s: %s", redact(u), resp.Status)
	}
	return io.ReadAll(io.LimitReader(resp.Body, 256<<20))
}

// redact drops user information from a URL for messages.
func redact(u string) string {
	p, err := url.Parse(u)
	if err != nil {
		return "(unparseable URL)"
	}
	p.User = nil
	return p.String()
}

// Resolve reads the index, picks the highest version that satisfies the
// repo's constraint and extra (may be empty), downloads it unless cached,
// and loads it. If the repository cannot be read and a chart was resolved
// before, that chart comes back with an error wrapping ErrStale.
func (r *Repo) Resolve(ctx context.Context, extra string) (*Resolved, error) {
	res, err := r.resolve(ctx, extra)
	r.mu.Lock()
	defer r.mu.Unlock()
	if err != nil {
		if r.last != nil {
			return r.last, fmt.Errorf("%w: %w", ErrStale, err)
		}
		return nil, err
	}
	r.last = res
	return res, nil
}

func (r *Repo) resolve(ctx context.Context, extra string) (*Resolved, error) {
	constraints := []*semver.Constraints{}
	for _, c := range []string{r.Constraint, extra} {
		if c == "" {
			continue
		}
		sc, err := semver.NewConstraint(c)
		if err != nil {
			return nil, fmt.Errorf("version constraint %q: %w", c, err)
		}
		constraints = append(constraints, sc)
	}
	c, err := r.client()
	if err != nil {
		return nil, err
	}
	base := strings.TrimSuffix(r.URL, "/")
	index, err := r.get(ctx, c, base+"/index.yaml")
	if err != nil {
		return nil, fmt.Errorf("reading index of %s: %w", redact(base), err)
	}
	if err := os.MkdirAll(r.CacheDir, 0o755); err != nil {
		return nil, err
	}
	indexPath := filepath.Join(r.CacheDir, "index.yaml")
	if err := os.WriteFile(indexPath, index, 0o644); err != nil {
		return nil, err
	}
	versions, err := helm.IndexVersions(indexPath, r.Name)
	if err != nil {
		return nil, err
	}
	type cand struct {
		v  *semver.Version
		cv helm.RepoChartVersion
	}
	var all []cand
	for _, cv := range versions {
		v, err := semver.NewVersion(cv.Version)
		if err != nil {
			continue
		}
		all = append(all, cand{v, cv})
	}
	sort.Slice(all, func(i, j int) bool { return all[i].v.GreaterThan(all[j].v) })
	res := &Resolved{FetchedAt: time.Now()}
	var pick *cand
	for i := range all {
		res.Available = append(res.Available, all[i].cv.Version)
		ok := true
		for _, sc := range constraints {
			ok = ok && sc.Check(all[i].v)
		}
		if ok && pick == nil {
			pick = &all[i]
		}
	}
	if pick == nil {
		return nil, fmt.Errorf("no version of chart %s in %s satisfies %q%s (available: %s)", r.Name, redact(base), r.Constraint, andExtra(extra), strings.Join(res.Available, ", "))
	}
	path, err := r.fetch(ctx, c, base, pick.cv)
	if err != nil {
		return nil, err
	}
	ch, err := helm.LoadChart(path)
	if err != nil {
		return nil, err
	}
	res.Chart, res.Version = ch, pick.cv.Version
	return res, nil
}

func andExtra(extra string) string {
	if extra == "" {
		return ""
	}
	return fmt.Sprintf(" and %q", extra)
}

// fetch returns the cached .tgz of cv, downloading (and checking its
// digest) when it is not cached yet.
func (r *Repo) fetch(ctx context.Context, c *http.Client, base string, cv helm.RepoChartVersion) (string, error) {
	if len(cv.URLs) == 0 {
		return "", fmt.Errorf("chart %s %s has no URL in the index", r.Name, cv.Version)
	}
	name := cv.Digest
	if name == "" {
		name = r.Name + "-" + cv.Version
	}
	path := filepath.Join(r.CacheDir, name+".tgz")
	if _, err := os.Stat(path); err == nil && cv.Digest != "" {
		return path, nil
	}
	u := cv.URLs[0]
	if !strings.Contains(u, "://") {
		u = base + "/" + strings.TrimPrefix(u, "/")
	}
	data, err := r.get(ctx, c, u)
	if err != nil {
		return "", fmt.Errorf("downloading chart %s %s: %w", r.Name, cv.Version, err)
	}
	sum := sha256.Sum256(data)
	if cv.Digest != "" && hex.EncodeToString(sum[:]) != cv.Digest {
		return "", fmt.Errorf("chart %s %s: digest %x does not match the index's %s", r.Name, cv.Version, sum, cv.Digest)
	}
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, data, 0o644); err != nil {
		return "", err
	}
	return path, os.Rename(tmp, path)
}
