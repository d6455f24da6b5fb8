package helm

import (
	"fmt"
	"os"
	"path/filepath"

	"helm.sh/helm/v3/pkg/chart/loader"
	"helm.sh/helm/v3/pkg/chartutil"
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

// PackageAs packages the chart directory dir as version into outDir and
// returns the .tgz path (tests and tools build repositories with it).
func PackageAs(dir, version, outDir string) (string, error) {
	ch, err := loader.Load(dir)
	if err != nil {
		return "", err
	}
	ch.Metadata.Version = version
	if err := os.MkdirAll(outDir, 0o755); err != nil {
		return "", err
	}
	return chartutil.Save(ch, outDir)
}

// WriteIndex writes index.yaml for every .tgz in dir, with URLs under baseURL.
func WriteIndex(dir, baseURL string) error {
	idx, err := repo.IndexDirectory(dir, baseURL)
	if err != nil {
		return err
	}
	return idx.WriteFile(filepath.Join(dir, "index.yaml"), 0o644)
}
