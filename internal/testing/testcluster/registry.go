package testcluster

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	stdlog "log"
	"net"
	"net/http"
	"os"
	"path"
	"path/filepath"
	"sort"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

// Registry is an OCI registry on loopback (go-containerregistry's, blobs
// on disk) that the real nodes' containerd pulls from (at HostIP): anyone
// may push an image to Host and run it there.
type Registry struct {
	// Host is 127.0.0.1:PORT.
	Host string
	srv  *http.Server
}

func startRegistry(dir string, log io.Writer) (*Registry, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("registry: %w", err)
	}
	h := registry.New(registry.WithBlobHandler(registry.NewDiskBlobHandler(dir)), registry.Logger(stdlog.New(log, "", stdlog.LstdFlags)))
	r := &Registry{Host: ln.Addr().String(), srv: &http.Server{Handler: h, ReadHeaderTimeout: time.Minute}}
	go func() { _ = r.srv.Serve(ln) }()
	return r, nil
}

// serveAlso serves the registry at ip too (the nodes' way to it), on the
// same port when it is free there, and returns that address.
func (r *Registry) serveAlso(ip string) (string, error) {
	_, port, _ := net.SplitHostPort(r.Host)
	ln, err := net.Listen("tcp", net.JoinHostPort(ip, port))
	if err != nil {
		if ln, err = net.Listen("tcp", net.JoinHostPort(ip, "0")); err != nil {
			return "", fmt.Errorf("registry at %s: %w", ip, err)
		}
	}
	go func() { _ = r.srv.Serve(ln) }()
	return ln.Addr().String(), nil
}

func (r *Registry) stop() {
	if r != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = r.srv.Shutdown(ctx)
	}
}

// File is one file of an image layer: a regular file (Data) or, when Link
// is set, a symbolic link to Link.
type File struct {
	Path string
	Mode int64
	Data []byte
	Link string
}

// Layer is an image layer of files (absolute paths), with the directories
// above them.
func Layer(files []File) (v1.Layer, error) {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	dirs := map[string]bool{}
	for _, f := range files {
		for d := path.Dir(f.Path); d != "/" && d != "." && !dirs[d]; d = path.Dir(d) {
			dirs[d] = true
		}
	}
	sorted := make([]string, 0, len(dirs))
	for d := range dirs {
		sorted = append(sorted, d)
	}
	sort.Strings(sorted) // parents first
	for _, d := range sorted {
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: d[1:] + "/", Mode: 0o755}); err != nil {
			return nil, err
		}
	}
	for _, f := range files {
		h := &tar.Header{Typeflag: tar.TypeReg, Name: f.Path[1:], Mode: f.Mode, Size: int64(len(f.Data))}
		if f.Link != "" {
			h = &tar.Header{Typeflag: tar.TypeSymlink, Name: f.Path[1:], Mode: 0o777, Linkname: f.Link}
		}
		if err := tw.WriteHeader(h); err != nil {
			return nil, err
		}
		if f.Link == "" {
			if _, err := tw.Write(f.Data); err != nil {
				return nil, err
			}
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(buf.Bytes())), nil })
}

// TreeFiles reads the regular files and symbolic links under dir as the
// files of a layer under the absolute path under.
func TreeFiles(dir, under string) ([]File, error) {
	var files []File
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		rel, err := filepath.Rel(dir, p)
		if err != nil {
			return err
		}
		f := File{Path: path.Join(under, filepath.ToSlash(rel))}
		info, err := d.Info()
		if err != nil {
			return err
		}
		switch {
		case info.Mode()&fs.ModeSymlink != 0:
			if f.Link, err = os.Readlink(p); err != nil {
				return err
			}
		case info.Mode().IsRegular():
			f.Mode = int64(info.Mode().Perm())
			if f.Data, err = os.ReadFile(p); err != nil {
				return err
			}
		default:
			return nil
		}
		files = append(files, f)
		return nil
	})
	return files, err
}

// PushFiles pushes image repo:tag, one layer of files on no base, run as
// user (e.g. "65532") with entrypoint, for linux/amd64; it returns the
// reference to give a pod.
func (r *Registry) PushFiles(repo, tag string, files []File, user string, entrypoint []string) (string, error) {
	layer, err := Layer(files)
	if err != nil {
		return "", err
	}
	return r.pushLayers(repo+":"+tag, v1.Config{User: user, Entrypoint: entrypoint, Env: []string{"PATH=/usr/local/bin:/usr/bin:/bin"}}, layer)
}

// Push pushes img as ref (relative to the registry: "repo:tag") and
// returns its full reference.
func (r *Registry) Push(ref string, img v1.Image) (string, error) {
	full := r.Host + "/" + ref
	tag, err := name.ParseReference(full, name.Insecure)
	if err != nil {
		return "", err
	}
	if err := remote.Write(tag, img); err != nil {
		return "", fmt.Errorf("pushing %s: %w", full, err)
	}
	return full, nil
}

var errNotRoot = errors.New("real nodes need root (network interfaces, mounts and cgroups): run the tests as root")

// PushIndex pushes a multi-platform image as ref ("repo:tag") and returns
// its full reference.
func (r *Registry) PushIndex(ref string, idx v1.ImageIndex) (string, error) {
	full := r.Host + "/" + ref
	tag, err := name.ParseReference(full, name.Insecure)
	if err != nil {
		return "", err
	}
	if err := remote.WriteIndex(tag, idx); err != nil {
		return "", fmt.Errorf("pushing %s: %w", full, err)
	}
	return full, nil
}

// PushRootFS pushes image ref ("repo:tag"): the root filesystem tarPath
// (hack/images.sh) with the layers of extra on top, for linux/amd64 with
// config, and returns its full reference.
func (r *Registry) PushRootFS(ref, tarPath string, config v1.Config, extra ...v1.Layer) (string, error) {
	layer, err := tarball.LayerFromFile(tarPath)
	if err != nil {
		return "", err
	}
	return r.pushLayers(ref, config, append([]v1.Layer{layer}, extra...)...)
}

// pushLayers pushes ref, an image of layers alone for linux/amd64 with
// config.
func (r *Registry) pushLayers(ref string, config v1.Config, layers ...v1.Layer) (string, error) {
	img, err := mutate.AppendLayers(empty.Image, layers...)
	if err != nil {
		return "", err
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return "", err
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture = "linux", "amd64"
	cf.Config = config
	if img, err = mutate.ConfigFile(img, cf); err != nil {
		return "", err
	}
	return r.Push(ref, img)
}
