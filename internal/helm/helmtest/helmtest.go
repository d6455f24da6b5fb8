// Package helmtest builds chart repositories and registries for tests and
// the benchmark: a chart directory packaged at a version, a repository
// index, a push to a loopback OCI registry. The operator never uses it.
package helmtest

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"helm.sh/helm/v3/pkg/chart/loader"
	"helm.sh/helm/v3/pkg/chartutil"
	"helm.sh/helm/v3/pkg/registry"
	"helm.sh/helm/v3/pkg/repo"
)

// PackageAs packages the chart directory dir as version into outDir and
// returns the .tgz path.
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

// Push packages the chart directory dir as version (in workDir) and pushes
// it to a plain-HTTP registry as ref:version, ref being oci://host/path/name.
func Push(dir, version, ref, workDir string) error {
	tgz, err := PackageAs(dir, version, workDir)
	if err != nil {
		return err
	}
	data, err := os.ReadFile(tgz)
	if err != nil {
		return err
	}
	c, err := registry.NewClient(registry.ClientOptPlainHTTP(), registry.ClientOptCredentialsFile(filepath.Join(workDir, "registry-credentials.json")))
	if err != nil {
		return err
	}
	if _, err := c.Push(data, strings.TrimPrefix(ref, "oci://")+":"+version, registry.PushOptStrictMode(false)); err != nil {
		return fmt.Errorf("pushing %s:%s: %w", ref, version, err)
	}
	return nil
}
