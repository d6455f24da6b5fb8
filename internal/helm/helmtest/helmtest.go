// Package helmtest builds chart repositories and registries for tests and
// the benchmark: a chart directory packaged at a version, a repository
// index, a push to a loopback OCI registry. The operator never uses it.
package helmtest

import (
	"bytes"
	"compress/gzip"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"helm.sh/helm/v3/pkg/chart/loader"
	"helm.sh/helm/v3/pkg/chartutil"
	"helm.sh/helm/v3/pkg/registry"
	"helm.sh/helm/v3/pkg/release"
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

// EditManifest rewrites the manifest of a stored release record (the
// "release" key of a Helm storage Secret), as anyone who may write Secrets
// in the release's namespace could.
func EditManifest(record []byte, edit func(manifest string) string) ([]byte, error) {
	gz, err := base64.StdEncoding.DecodeString(string(record))
	if err != nil {
		return nil, fmt.Errorf("decoding record: %w", err)
	}
	zr, err := gzip.NewReader(bytes.NewReader(gz))
	if err != nil {
		return nil, fmt.Errorf("decompressing record: %w", err)
	}
	var rel release.Release
	if err := json.NewDecoder(zr).Decode(&rel); err != nil {
		return nil, fmt.Errorf("reading record: %w", err)
	}
	rel.Manifest = edit(rel.Manifest)
	raw, err := json.Marshal(&rel)
	if err != nil {
		return nil, err
	}
	var buf bytes.Buffer
	zw := gzip.NewWriter(&buf)
	if _, err := zw.Write(raw); err != nil {
		return nil, err
	}
	if err := zw.Close(); err != nil {
		return nil, err
	}
	return []byte(base64.StdEncoding.EncodeToString(buf.Bytes())), nil
}
