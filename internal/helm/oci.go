package helm

import (
	"fmt"
	"net/http"
	"strings"

	"helm.sh/helm/v3/pkg/registry"
)

// OCIClient reads charts in an OCI registry.
type OCIClient struct {
	c *registry.Client
}

// OCIOptions configure an OCIClient.
type OCIOptions struct {
	// Username and Password for basic/token auth; empty for anonymous.
	Username, Password string
	// HTTPClient carries TLS settings and timeouts.
	HTTPClient *http.Client
	// PlainHTTP talks HTTP instead of HTTPS (loopback registries).
	PlainHTTP bool
	// CredentialsFile is where Helm would keep logins; chartpilot never logs
	// in, so this only keeps Helm away from the user's own file.
	CredentialsFile string
}

// NewOCIClient makes a registry client.
func NewOCIClient(o OCIOptions) (*OCIClient, error) {
	opts := []registry.ClientOption{registry.ClientOptCredentialsFile(o.CredentialsFile)}
	if o.HTTPClient != nil {
		opts = append(opts, registry.ClientOptHTTPClient(o.HTTPClient))
	}
	if o.PlainHTTP {
		opts = append(opts, registry.ClientOptPlainHTTP())
	}
	if o.Username != "" || o.Password != "" {
		opts = append(opts, registry.ClientOptBasicAuth(o.Username, o.Password))
	}
	c, err := registry.NewClient(opts...)
	if err != nil {
		return nil, err
	}
	return &OCIClient{c: c}, nil
}

// trimScheme turns oci://host/path into host/path, as the registry client wants.
func trimScheme(ref string) string { return strings.TrimPrefix(ref, "oci://") }

// Tags lists the semver tags of a chart repository (host/path/name), highest first.
func (o *OCIClient) Tags(ref string) ([]string, error) {
	return o.c.Tags(trimScheme(ref))
}

// Pull downloads version of the chart at ref and returns the archive.
func (o *OCIClient) Pull(ref, version string) ([]byte, error) {
	res, err := o.c.Pull(trimScheme(ref)+":"+version, registry.PullOptWithChart(true))
	if err != nil {
		return nil, err
	}
	if res.Chart == nil || len(res.Chart.Data) == 0 {
		return nil, fmt.Errorf("%s:%s holds no chart layer", ref, version)
	}
	return res.Chart.Data, nil
}
