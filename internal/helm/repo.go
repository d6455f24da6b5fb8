package helm

import (
	"errors"
	"fmt"
	"net/http"
	"regexp"
	"time"

	"helm.sh/helm/v3/pkg/getter"
	"helm.sh/helm/v3/pkg/repo"
)

// RepoChartVersion is one version of a chart in a repository index.
type RepoChartVersion struct {
	Version    string
	AppVersion string
	// Digest is the sha256 of the .tgz, as the index states it.
	Digest string
	URLs   []string
}

// IndexVersions reads a repository index file and lists the versions of
// chart name.
func IndexVersions(indexPath, name string) ([]RepoChartVersion, error) {
	idx, err := repo.LoadIndexFile(indexPath)
	if err != nil {
		return nil, fmt.Errorf("reading repository index: %w", err)
	}
	var out []RepoChartVersion
	for _, cv := range idx.Entries[name] {
		if cv == nil || cv.Metadata == nil {
			continue
		}
		out = append(out, RepoChartVersion{Version: cv.Version, AppVersion: cv.AppVersion, Digest: cv.Digest, URLs: cv.URLs})
	}
	return out, nil
}

// HTTPGet fetches href with Helm's HTTP getter. Basic auth is sent only when
// href has the scheme and host of repoURL, so credentials of a repository
// never reach a server its index points to.
func HTTPGet(repoURL, href, username, password string, transport *http.Transport, timeout time.Duration) ([]byte, error) {
	g, err := getter.NewHTTPGetter(
		getter.WithURL(repoURL),
		getter.WithBasicAuth(username, password),
		getter.WithTransport(transport),
		getter.WithTimeout(timeout),
	)
	if err != nil {
		return nil, err
	}
	buf, err := g.Get(href)
	if err != nil {
		return nil, errors.New(userInfo.ReplaceAllString(err.Error(), "://"))
	}
	return buf.Bytes(), nil
}

// userInfo matches credentials in URLs, which errors must not carry.
var userInfo = regexp.MustCompile(`://[^/@\s]+@`)
