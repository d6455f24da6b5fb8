package source

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"

	"github.com/chartpilot/chartpilot/internal/helm"
)

// NewOCI is chart name under an OCI registry path (oci://host/path): the
// chart's repository is oci://host/path/name and its tags are versions.
// Tags are treated as immutable once downloaded (Helm publishes a version once).
func NewOCI(base, name string, o Options) (Source, error) {
	b := &oci{ref: strings.TrimSuffix(base, "/") + "/" + name, plainHTTP: o.PlainHTTP, credFile: filepath.Join(o.CacheDir, "registry.json"), max: o.maxArchive()}
	return newRemote(name, b, o.Credentials, o.CacheDir, o.Interval)
}

type oci struct {
	ref       string
	plainHTTP bool
	credFile  string
	// max bounds every response (tag list, manifest, layer).
	max int64
}

func (p *oci) where() string { return p.ref }

func (p *oci) client(cr Credentials) (*helm.OCIClient, error) {
	hc, err := httpClient(cr, p.max)
	if err != nil {
		return nil, err
	}
	return helm.NewOCIClient(helm.OCIOptions{Username: cr.Username, Password: cr.Password, HTTPClient: hc, PlainHTTP: p.plainHTTP, CredentialsFile: p.credFile})
}

func (p *oci) list(_ context.Context, cr Credentials) ([]entry, error) {
	c, err := p.client(cr)
	if err != nil {
		return nil, err
	}
	tags, err := c.Tags(p.ref)
	if err != nil {
		return nil, fmt.Errorf("listing tags: %w", err)
	}
	if len(tags) == 0 {
		return nil, fmt.Errorf("%s has no semver tags", p.ref)
	}
	out := make([]entry, 0, len(tags))
	for _, t := range tags {
		out = append(out, entry{Version: t})
	}
	return out, nil
}

func (p *oci) fetch(_ context.Context, cr Credentials, e entry) ([]byte, error) {
	c, err := p.client(cr)
	if err != nil {
		return nil, err
	}
	return c.Pull(p.ref, e.Version)
}
