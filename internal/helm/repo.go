package helm

import (
	"fmt"

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
