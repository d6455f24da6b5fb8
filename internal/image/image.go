// Package image builds chartpilot's container image without Docker and
// without a base image: for each platform, one layer with what a static
// binary needs of an operating system (CA certificates, /etc/passwd and
// /etc/group with the nonroot user 65532, /tmp), one with the binary, and
// one with watches.yaml and the charts it names at /etc/chartpilot. Every
// file has a fixed owner, mode and time, and the files are in order, so
// the same inputs give the same digest.
package image

import (
	"archive/tar"
	"bytes"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"sort"
	"strings"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"

	"github.com/chartpilot/chartpilot/internal/watches"
)

// Paths inside the image.
const (
	BinaryPath = "/usr/local/bin/chartpilot"
	// ManagerPath is chartpilot-manager, the image's entrypoint when it
	// holds one: the manager without the backup data path, which runs
	// BinaryPath for it (backup Jobs copy BinaryPath too).
	ManagerPath = "/usr/local/bin/chartpilot-manager"
	DataDir     = "/etc/chartpilot"
	WatchesPath = DataDir + "/watches.yaml"
	// User is the nonroot user and group the image runs as.
	User = "65532:65532"
)

// Options are the inputs of an image index.
type Options struct {
	// Binaries maps a platform ("linux/amd64") to a static chartpilot
	// binary built for it.
	Binaries map[string]string
	// Managers maps a platform to its chartpilot-manager binary (built
	// with -tags manager); a platform with one runs it, else Binaries'.
	Managers map[string]string
	// Root is the repository: watches.yaml and the charts it names under
	// charts/ are copied from it.
	Root string
	// CACertificates is a PEM bundle (default: this machine's
	// /etc/ssl/certs/ca-certificates.crt).
	CACertificates string
	// Version, Revision (a commit) and Source (the repository's URL) label
	// the image (org.opencontainers.image.*).
	Version, Revision, Source string
	// Created is every file's and the image's time (reproducible builds
	// use the commit's time); zero: the Unix epoch.
	Created time.Time
}

// Build makes the multi-platform image index.
func Build(o Options) (v1.ImageIndex, error) {
	if len(o.Binaries) == 0 {
		return nil, fmt.Errorf("no binaries: give at least one platform=path")
	}
	if o.Created.IsZero() {
		o.Created = time.Unix(0, 0)
	}
	o.Created = o.Created.UTC()
	if o.CACertificates == "" {
		o.CACertificates = "/etc/ssl/certs/ca-certificates.crt"
	}
	system, err := systemLayer(o)
	if err != nil {
		return nil, err
	}
	data, err := dataLayer(o)
	if err != nil {
		return nil, err
	}
	platforms := make([]string, 0, len(o.Binaries))
	for p := range o.Binaries {
		platforms = append(platforms, p)
	}
	sort.Strings(platforms)
	idx := mutate.IndexMediaType(empty.Index, types.OCIImageIndex)
	for _, p := range platforms {
		plat, err := v1.ParsePlatform(p)
		if err != nil {
			return nil, fmt.Errorf("platform %q: %w", p, err)
		}
		img, err := platformImage(o, *plat, o.Binaries[p], o.Managers[p], system, data)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", p, err)
		}
		idx = mutate.AppendManifests(idx, mutate.IndexAddendum{
			Add:        img,
			Descriptor: v1.Descriptor{Platform: plat},
		})
	}
	return mutate.Annotations(idx, labels(o)).(v1.ImageIndex), nil
}

func labels(o Options) map[string]string {
	l := map[string]string{
		"org.opencontainers.image.title":       "chartpilot",
		"org.opencontainers.image.description": "Kubernetes operator that turns custom resources into healthy Helm releases",
		"org.opencontainers.image.licenses":    "Apache-2.0",
		"org.opencontainers.image.created":     o.Created.Format(time.RFC3339),
	}
	for k, v := range map[string]string{"source": o.Source, "revision": o.Revision, "version": o.Version} {
		if v != "" {
			l["org.opencontainers.image."+k] = v
		}
	}
	return l
}

func platformImage(o Options, plat v1.Platform, binary, manager string, system, data v1.Layer) (v1.Image, error) {
	bin, err := os.ReadFile(binary)
	if err != nil {
		return nil, fmt.Errorf("reading the binary: %w", err)
	}
	files, entrypoint := []file{{name: BinaryPath, mode: 0o755, data: bin}}, BinaryPath
	if manager != "" {
		m, err := os.ReadFile(manager)
		if err != nil {
			return nil, fmt.Errorf("reading the manager: %w", err)
		}
		files, entrypoint = append(files, file{name: ManagerPath, mode: 0o755, data: m}), ManagerPath
	}
	binLayer, err := layer(o.Created, files)
	if err != nil {
		return nil, err
	}
	img := mutate.MediaType(empty.Image, types.OCIManifestSchema1)
	img = mutate.ConfigMediaType(img, types.OCIConfigJSON)
	img, err = mutate.AppendLayers(img, system, binLayer, data)
	if err != nil {
		return nil, err
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return nil, err
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture, cf.Variant = plat.OS, plat.Architecture, plat.Variant
	cf.Created = v1.Time{Time: o.Created}
	cf.Author = "chartpilot"
	cf.Config = v1.Config{
		Entrypoint: []string{entrypoint},
		Cmd:        []string{"run", "--watches", WatchesPath},
		User:       User,
		WorkingDir: "/",
		Env:        []string{"PATH=/usr/local/bin:/usr/bin:/bin", "SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt", "HOME=/home/nonroot"},
		Labels:     labels(o),
	}
	cf.History = nil
	img, err = mutate.ConfigFile(img, cf)
	if err != nil {
		return nil, err
	}
	return mutate.Annotations(img, labels(o)).(v1.Image), nil
}

// file is one entry of a layer; dir marks a directory.
type file struct {
	name string
	mode int64
	data []byte
	dir  bool
	uid  int
}

// layer writes files (and their parent directories) as a tar in path
// order, every entry with the same time, and gzips it.
func layer(created time.Time, files []file) (v1.Layer, error) {
	all := map[string]file{}
	for _, f := range files {
		all[f.name] = f
		for d := path.Dir(f.name); d != "/" && d != "."; d = path.Dir(d) {
			if _, ok := all[d]; !ok {
				all[d] = file{name: d, mode: 0o755, dir: true}
			}
		}
	}
	names := make([]string, 0, len(all))
	for n := range all {
		names = append(names, n)
	}
	sort.Strings(names)
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, n := range names {
		f := all[n]
		h := &tar.Header{
			Name: strings.TrimPrefix(n, "/"), Mode: f.mode, ModTime: created,
			Uid: f.uid, Gid: f.uid, Format: tar.FormatPAX,
		}
		if f.dir {
			h.Typeflag, h.Name = tar.TypeDir, h.Name+"/"
		} else {
			h.Typeflag, h.Size = tar.TypeReg, int64(len(f.data))
		}
		if err := tw.WriteHeader(h); err != nil {
			return nil, err
		}
		if !f.dir {
			if _, err := tw.Write(f.data); err != nil {
				return nil, err
			}
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	b := buf.Bytes()
	return tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(b)), nil
	}, tarball.WithMediaType(types.OCILayer))
}

// systemLayer is what a static binary needs of an operating system.
func systemLayer(o Options) (v1.Layer, error) {
	ca, err := os.ReadFile(o.CACertificates)
	if err != nil {
		return nil, fmt.Errorf("CA certificates: %w (give Options.CACertificates, a PEM bundle)", err)
	}
	return layer(o.Created, []file{
		{name: "/etc/passwd", mode: 0o644, data: []byte("root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n")},
		{name: "/etc/group", mode: 0o644, data: []byte("root:x:0:\nnonroot:x:65532:\n")},
		{name: "/etc/nsswitch.conf", mode: 0o644, data: []byte("hosts: files dns\n")},
		{name: "/etc/ssl/certs/ca-certificates.crt", mode: 0o644, data: ca},
		{name: "/home/nonroot", mode: 0o700, dir: true, uid: 65532},
		{name: "/tmp", mode: 0o1777, dir: true},
	})
}

// dataLayer holds watches.yaml and the charts under /etc/chartpilot, so
// that the default watches need no volume.
func dataLayer(o Options) (v1.Layer, error) {
	raw, err := os.ReadFile(filepath.Join(o.Root, "watches.yaml"))
	if err != nil {
		return nil, err
	}
	files := []file{{name: WatchesPath, mode: 0o644, data: raw}}
	ws, err := watches.Load(filepath.Join(o.Root, "watches.yaml")) // chart paths resolved as the manager resolves them
	if err != nil {
		return nil, err
	}
	for _, w := range ws {
		if w.Chart == "" {
			continue // a remote chart: fetched at run time
		}
		fs, err := chartFiles(o.Root, w.Chart)
		if err != nil {
			return nil, fmt.Errorf("watch %s: %w", w, err)
		}
		files = append(files, fs...)
	}
	return layer(o.Created, files)
}

// chartFiles are a chart directory's files at their path under DataDir
// (relative to the repository, as watches.yaml names them).
func chartFiles(root, chart string) ([]file, error) {
	absRoot, err := filepath.Abs(root)
	if err != nil {
		return nil, err
	}
	var files []file
	err = filepath.WalkDir(chart, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		if !d.Type().IsRegular() {
			return fmt.Errorf("%s: only regular files are copied into the image", p)
		}
		abs, err := filepath.Abs(p)
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(absRoot, abs)
		if err != nil || strings.HasPrefix(rel, "..") {
			return fmt.Errorf("chart %s is outside the repository: only charts under it are copied into the image", chart)
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		files = append(files, file{name: path.Join(DataDir, filepath.ToSlash(rel)), mode: 0o644, data: b})
		return nil
	})
	return files, err
}
