package image_test

import (
	"archive/tar"
	"context"
	"io"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/distribution/distribution/v3/configuration"
	"github.com/distribution/distribution/v3/registry/handlers"
	_ "github.com/distribution/distribution/v3/registry/storage/driver/inmemory"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/sirupsen/logrus"

	"github.com/chartpilot/chartpilot/internal/image"
)

// root is the repository.
var root = filepath.Join("..", "..")

// staticBinary builds chartpilot for this machine's platform as the image
// build does (static, trimmed paths), with a version to read back.
// (tags "manager": chartpilot-manager).
func staticBinary(t *testing.T, version, tags string) string {
	t.Helper()
	out := filepath.Join(t.TempDir(), "chartpilot")
	cmd := exec.Command("go", "build", "-tags", tags, "-trimpath", "-ldflags", "-s -w -X main.version="+version, "-o", out, "./cmd/chartpilot")
	cmd.Dir = root
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux", "GOARCH="+runtime.GOARCH)
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("building chartpilot: %v\n%s", err, b)
	}
	return out
}

func registry(t *testing.T) string {
	t.Helper()
	cfg := &configuration.Configuration{Storage: configuration.Storage{"inmemory": configuration.Parameters{}}}
	cfg.Log.Level = "error"
	cfg.Log.AccessLog.Disabled = true
	logrus.SetOutput(io.Discard)
	srv := httptest.NewServer(handlers.NewApp(context.Background(), cfg))
	t.Cleanup(srv.Close)
	return strings.TrimPrefix(srv.URL, "http://")
}

// TestImageBuiltPushedAndRun builds the image twice (the same digest),
// pushes it to a registry, pulls it back, checks its configuration and
// files, and runs the binary found in its layer.
func TestImageBuiltPushedAndRun(t *testing.T) {
	bin, manager := staticBinary(t, "v9.8.7-test", ""), staticBinary(t, "v9.8.7-test", "manager")
	platform := "linux/" + runtime.GOARCH
	o := image.Options{
		Binaries: map[string]string{platform: bin}, Managers: map[string]string{platform: manager}, Root: root,
		Version: "v9.8.7-test", Revision: "0123456789abcdef", Source: "https://example.com/chartpilot",
		Created: time.Date(2026, 11, 30, 0, 0, 0, 0, time.UTC),
	}
	idx, err := image.Build(o)
	if err != nil {
		t.Fatal(err)
	}
	again, err := image.Build(o)
	if err != nil {
		t.Fatal(err)
	}
	d1, _ := idx.Digest()
	d2, _ := again.Digest()
	if d1 != d2 {
		t.Errorf("the same inputs gave two digests: %s and %s", d1, d2)
	}
	later := o
	later.Revision = "fedcba9876543210"
	other, err := image.Build(later)
	if err != nil {
		t.Fatal(err)
	}
	if d3, _ := other.Digest(); d3 == d1 {
		t.Errorf("another revision gave the same digest %s", d3)
	}

	ref, err := name.ParseReference(registry(t)+"/chartpilot:v9.8.7-test", name.Insecure)
	if err != nil {
		t.Fatal(err)
	}
	if err := remote.WriteIndex(ref, idx); err != nil {
		t.Fatalf("push: %v", err)
	}
	pulled, err := remote.Index(ref)
	if err != nil {
		t.Fatalf("pull: %v", err)
	}
	if d, _ := pulled.Digest(); d != d1 {
		t.Errorf("pulled digest %s, pushed %s", d, d1)
	}
	im, err := pulled.IndexManifest()
	if err != nil {
		t.Fatal(err)
	}
	if len(im.Manifests) != 1 || im.Manifests[0].Platform == nil || im.Manifests[0].Platform.Architecture != runtime.GOARCH {
		t.Fatalf("index manifests %+v, want one for %s", im.Manifests, platform)
	}
	img, err := pulled.Image(im.Manifests[0].Digest)
	if err != nil {
		t.Fatal(err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	c := cf.Config
	if strings.Join(c.Entrypoint, " ") != image.ManagerPath || c.User != "65532:65532" || strings.Join(c.Cmd, " ") != "run --watches "+image.WatchesPath {
		t.Errorf("entrypoint %v, cmd %v, user %q", c.Entrypoint, c.Cmd, c.User)
	}
	for k, want := range map[string]string{
		"org.opencontainers.image.version": "v9.8.7-test", "org.opencontainers.image.revision": "0123456789abcdef",
		"org.opencontainers.image.source": "https://example.com/chartpilot",
	} {
		if c.Labels[k] != want {
			t.Errorf("label %s = %q, want %q", k, c.Labels[k], want)
		}
	}
	if cf.OS != "linux" || cf.Architecture != runtime.GOARCH {
		t.Errorf("config for %s/%s", cf.OS, cf.Architecture)
	}

	files := extract(t, img)
	for _, f := range []string{"etc/passwd", "etc/ssl/certs/ca-certificates.crt", "etc/chartpilot/watches.yaml", "etc/chartpilot/charts/postgresql/Chart.yaml", "etc/chartpilot/charts/redis/values.yaml", "tmp"} {
		if _, ok := files[f]; !ok {
			t.Errorf("%s is not in the image", f)
		}
	}
	if _, ok := files["etc/chartpilot/charts/chartpilot/Chart.yaml"]; ok {
		t.Errorf("the operator's own chart is in the image: only the charts watches.yaml names belong there")
	}
	if !strings.Contains(string(files["etc/passwd"].data), "nonroot:x:65532:65532:") {
		t.Errorf("/etc/passwd has no nonroot user 65532:\n%s", files["etc/passwd"].data)
	}
	run := func(path string, args ...string) (string, error) {
		t.Helper()
		f := files[strings.TrimPrefix(path, "/")]
		if f.mode&0o111 == 0 {
			t.Fatalf("%s is not executable (mode %o)", path, f.mode)
		}
		exe := filepath.Join(t.TempDir(), filepath.Base(path))
		if err := os.WriteFile(exe, f.data, 0o755); err != nil {
			t.Fatal(err)
		}
		out, err := exec.Command(exe, args...).CombinedOutput()
		return strings.TrimSpace(string(out)), err
	}
	for _, p := range []string{image.BinaryPath, image.ManagerPath} {
		if out, err := run(p, "version"); err != nil || out != "v9.8.7-test" {
			t.Errorf("the image's %s version = %q, %v", p, out, err)
		}
	}
	// The manager has no data path of its own: it runs chartpilot for it.
	if out, err := run(image.ManagerPath, "store"); err == nil || !strings.Contains(out, "built without the backup data path") {
		t.Errorf("chartpilot-manager store = %q, %v; want a refusal naming the data path", out, err)
	}
	if out, err := run(image.BinaryPath, "store"); err == nil || !strings.Contains(out, "the request is not JSON") {
		t.Errorf("chartpilot store with no request = %q, %v; want the helper's refusal of it", out, err)
	}
}

type entry struct {
	mode int64
	data []byte
}

// extract reads the image's flattened filesystem.
func extract(t *testing.T, img v1.Image) map[string]entry {
	t.Helper()
	rc := mutate.Extract(img)
	defer rc.Close()
	tr := tar.NewReader(rc)
	out := map[string]entry{}
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return out
		}
		if err != nil {
			t.Fatal(err)
		}
		b, err := io.ReadAll(tr)
		if err != nil {
			t.Fatal(err)
		}
		out[strings.TrimSuffix(h.Name, "/")] = entry{mode: h.Mode, data: b}
	}
}
