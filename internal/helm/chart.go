package helm

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sort"

	"helm.sh/helm/v3/pkg/chart"
	"helm.sh/helm/v3/pkg/chart/loader"
)

// Chart is a loaded chart and the digest of its content.
type Chart struct {
	chart *chart.Chart
	// Path is where the chart was loaded from.
	Path string
	// Digest is the sha256 of the chart's files (directory) or archive (.tgz):
	// it changes exactly when the chart's content changes.
	Digest string
	// Name, Version and AppVersion come from Chart.yaml.
	Name, Version, AppVersion string
}

// LoadChart loads a chart directory or .tgz archive, and validates it.
func LoadChart(path string) (*Chart, error) {
	ch, err := loader.Load(path)
	if err != nil {
		return nil, fmt.Errorf("loading chart %s: %w", path, err)
	}
	if err := ch.Validate(); err != nil {
		return nil, fmt.Errorf("chart %s is not valid: %w", path, err)
	}
	digest, err := digestPath(path)
	if err != nil {
		return nil, fmt.Errorf("hashing chart %s: %w", path, err)
	}
	return &Chart{
		chart:      ch,
		Path:       path,
		Digest:     digest,
		Name:       ch.Metadata.Name,
		Version:    ch.Metadata.Version,
		AppVersion: ch.Metadata.AppVersion,
	}, nil
}

// digestPath hashes a file, or every regular file of a directory by relative
// path and content, in a stable order.
func digestPath(path string) (string, error) {
	h := sha256.New()
	st, err := os.Stat(path)
	if err != nil {
		return "", err
	}
	if !st.IsDir() {
		f, err := os.Open(path)
		if err != nil {
			return "", err
		}
		defer f.Close()
		if _, err := io.Copy(h, f); err != nil {
			return "", err
		}
		return hex.EncodeToString(h.Sum(nil)), nil
	}
	var files []string
	err = filepath.WalkDir(path, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.Type().IsRegular() {
			files = append(files, p)
		}
		return nil
	})
	if err != nil {
		return "", err
	}
	sort.Strings(files)
	for _, p := range files {
		rel, _ := filepath.Rel(path, p)
		b, err := os.ReadFile(p)
		if err != nil {
			return "", err
		}
		fmt.Fprintf(h, "%s\x00%d\x00", filepath.ToSlash(rel), len(b))
		h.Write(b)
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}
