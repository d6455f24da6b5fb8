package source

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net/http"
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
	// PlainHTTP lets an OCI registry be reached over HTTP (loopback only).
	PlainHTTP bool
}

// NewRepo is chart name in the chart repository at repoURL (the
// directory holding index.yaml).
func NewRepo(repoURL, name string, o Options) (Source, error) {
	r, err := newRemote(name, &repo{url: strings.TrimSuffix(repoURL, "/"), name: name, cacheDir: o.CacheDir}, o.Credentials, o.CacheDir, o.Interval)
	if err != nil {
		return nil, err
	}
	return r, nil
}

type repo struct {
	url, name, cacheDir string
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

func httpClient(cr Credentials) (*http.Client, error) {
	tr, err := transport(cr)
	if err != nil {
		return nil, err
	}
	return &http.Client{Transport: tr, Timeout: fetchTimeout}, nil
}

// fetchTimeout bounds one download (Helm's getters take no context).
const fetchTimeout = 2 * time.Minute

// get fetches u with Helm's HTTP getter (credentials only for the
// repository's own host).
func (p *repo) get(ctx context.Context, cr Credentials, u string) ([]byte, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	tr, err := transport(cr)
	if err != nil {
		return nil, err
	}
	// Helm's errors name the URL (credentials removed) and the answer.
	return helm.HTTPGet(p.url, u, cr.Username, cr.Password, tr, fetchTimeout)
}

func (p *repo) list(ctx context.Context, cr Credentials) ([]entry, error) {
	data, err := p.get(ctx, cr, p.url+"/index.yaml")
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
		e := entry{Version: v.Version, Digest: v.Digest}
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
	return p.get(ctx, cr, u)
}
