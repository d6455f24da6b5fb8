package source

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/chartpilot/chartpilot/internal/helm"
	"github.com/chartpilot/chartpilot/internal/redact"
)

// Options configure a remote source.
type Options struct {
	// Credentials are read for every refresh and download (nil: anonymous).
	Credentials CredentialsFunc
	// CacheDir holds the version list and archives by digest.
	CacheDir string
	// Interval between refreshes.
	Interval time.Duration
	// PlainHTTP lets an OCI registry be reached over HTTP (the watch allows
	// it for loopback hosts, or with allowInsecure).
	PlainHTTP bool
	// MaxIndexSize and MaxArchiveSize bound a download (0: the defaults);
	// OCI manifests and layers take MaxArchiveSize.
	MaxIndexSize, MaxArchiveSize int64
	// AllowedHosts are hosts besides the repository's own that its index may
	// send archive downloads to.
	AllowedHosts []string
}

func (o Options) maxIndex() int64 {
	if o.MaxIndexSize > 0 {
		return o.MaxIndexSize
	}
	return DefaultMaxIndexSize
}

func (o Options) maxArchive() int64 {
	if o.MaxArchiveSize > 0 {
		return o.MaxArchiveSize
	}
	return DefaultMaxArchiveSize
}

// NewRepo is chart name in the chart repository at repoURL (the
// directory holding index.yaml).
func NewRepo(repoURL, name string, o Options) (Source, error) {
	r, err := newRemote(name, &repo{url: strings.TrimSuffix(repoURL, "/"), name: name, cacheDir: o.CacheDir, opts: o}, o.Credentials, o.CacheDir, o.Interval)
	if err != nil {
		return nil, err
	}
	return r, nil
}

type repo struct {
	url, name, cacheDir string
	opts                Options
}

func (p *repo) where() string { return redact.URL(p.url) }

// transport trusts the credentials' CA bundle, if any.
func transport(cr Credentials) (*http.Transport, error) {
	tr := http.DefaultTransport.(*http.Transport).Clone()
	if len(cr.CAData) > 0 {
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(cr.CAData) {
			return nil, errors.New("the CA bundle (key ca.crt) holds no PEM certificate")
		}
		tr.TLSClientConfig = &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}
	}
	return tr, nil
}

func httpClient(cr Credentials, max int64) (*http.Client, error) {
	tr, err := transport(cr)
	if err != nil {
		return nil, err
	}
	return &http.Client{Transport: limitedTransport{RoundTripper: tr, max: max}, Timeout: fetchTimeout}, nil
}

// fetchTimeout bounds one download (Helm's getters take no context).
const fetchTimeout = 2 * time.Minute

// get fetches u, reading at most max bytes. Basic auth is sent only to the
// repository's own scheme and host, so its credentials never reach a server
// its index points to. Errors name the URL without credentials.
func (p *repo) get(ctx context.Context, cr Credentials, u string, max int64) ([]byte, error) {
	hc, err := httpClient(cr, max)
	if err != nil {
		return nil, err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", redact.URL(u), err)
	}
	req.URL.User = nil
	if (cr.Username != "" || cr.Password != "") && sameHost(p.url, u) {
		req.SetBasicAuth(cr.Username, cr.Password)
	}
	resp, err := hc.Do(req)
	if err != nil {
		return nil, errors.New(redact.Text(err.Error()))
	}
	defer func() { _ = resp.Body.Close() }()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("%s: %s", redact.URL(u), resp.Status)
	}
	return io.ReadAll(resp.Body)
}

func (p *repo) list(ctx context.Context, cr Credentials) ([]entry, error) {
	data, err := p.get(ctx, cr, p.url+"/index.yaml", p.opts.maxIndex())
	if err != nil {
		return nil, err
	}
	path := filepath.Join(p.cacheDir, "index.yaml")
	if err := writeFileAtomic(path, data); err != nil {
		return nil, err
	}
	defer func() { _ = os.Remove(path) }()
	versions, err := helm.IndexVersions(path, p.name)
	if err != nil {
		return nil, err
	}
	if len(versions) == 0 {
		return nil, fmt.Errorf("the index of %s has no chart named %s", redact.URL(p.url), p.name)
	}
	out := make([]entry, 0, len(versions))
	for _, v := range versions {
		if !validDigest(v.Digest) {
			continue // a digest names a cache file: only hex is taken
		}
		e := entry{Version: v.Version, Digest: strings.ToLower(v.Digest)}
		if len(v.URLs) > 0 {
			e.URL = v.URLs[0]
		}
		out = append(out, e)
	}
	return out, nil
}

func (p *repo) fetch(ctx context.Context, cr Credentials, e entry) ([]byte, error) {
	if e.URL == "" {
		return nil, fmt.Errorf("version %s has no URL in the index", e.Version)
	}
	u := e.URL
	if !strings.Contains(u, "://") {
		u = p.url + "/" + strings.TrimPrefix(u, "/")
	}
	if !sameHost(p.url, u) && !p.allowedHost(u) {
		return nil, fmt.Errorf("the index sends version %s to %s, not to the repository's own host: refused (list the host under chart.allowedHosts in watches.yaml to allow it)", e.Version, redact.URL(u))
	}
	return p.get(ctx, cr, u, p.opts.maxArchive())
}

func (p *repo) allowedHost(u string) bool {
	pu, err := url.Parse(u)
	if err != nil {
		return false
	}
	for _, h := range p.opts.AllowedHosts {
		if strings.EqualFold(h, pu.Host) {
			return true
		}
	}
	return false
}
