package source

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
)

// hostileRepo serves index (with {{URL}} replaced by its own URL) and any
// .tgz from archive, counting the archive requests.
func hostileRepo(t *testing.T, index string, archive []byte) (*httptest.Server, *atomic.Int32) {
	t.Helper()
	var fetched atomic.Int32
	var srv *httptest.Server
	srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if strings.HasSuffix(r.URL.Path, "/index.yaml") {
			_, _ = w.Write([]byte(strings.ReplaceAll(index, "{{URL}}", srv.URL)))
			return
		}
		fetched.Add(1)
		_, _ = w.Write(archive)
	}))
	t.Cleanup(srv.Close)
	return srv, &fetched
}

func indexOf(url, digest string) string {
	return fmt.Sprintf("apiVersion: v1\nentries:\n  redis:\n    - {name: redis, version: 1.0.0, digest: %q, urls: [%q]}\n", digest, url)
}

func TestHostileRepositories(t *testing.T) {
	ctx := context.Background()
	t.Run("oversized index", func(t *testing.T) {
		srv, _ := hostileRepo(t, indexOf("{{URL}}/redis-1.0.0.tgz", "")+"# "+strings.Repeat("x", 2<<20)+"\n", nil)
		s, _ := NewRepo(srv.URL, "redis", Options{CacheDir: t.TempDir(), MaxIndexSize: 1 << 20})
		if _, err := s.Refresh(ctx); !errors.Is(err, ErrTooLarge) {
			t.Fatalf("a 2 MiB index with a 1 MiB limit: %v", err)
		}
	})
	t.Run("digest naming another file", func(t *testing.T) {
		srv, fetched := hostileRepo(t, indexOf("{{URL}}/redis-1.0.0.tgz", "../../../../etc/passwd"), nil)
		s, _ := NewRepo(srv.URL, "redis", Options{CacheDir: t.TempDir()})
		if _, err := s.Refresh(ctx); err == nil {
			if vs, _ := s.Versions(); len(vs) != 0 {
				t.Fatalf("a version with the digest ../../../../etc/passwd was listed: %v", vs)
			}
		}
		if fetched.Load() != 0 {
			t.Error("an archive was fetched for it")
		}
	})
	t.Run("index pointing at the metadata address", func(t *testing.T) {
		srv, _ := hostileRepo(t, indexOf("http://169.254.169.254/latest/meta-data/redis-1.0.0.tgz", ""), nil)
		s, _ := NewRepo(srv.URL, "redis", Options{CacheDir: t.TempDir()})
		if _, err := s.Refresh(ctx); err != nil {
			t.Fatal(err)
		}
		_, err := s.Load(ctx, "1.0.0")
		if err == nil || !strings.Contains(err.Error(), "not to the repository's own host") {
			t.Fatalf("a download from 169.254.169.254: %v", err)
		}
	})
	t.Run("oversized archive", func(t *testing.T) {
		srv, _ := hostileRepo(t, indexOf("{{URL}}/redis-1.0.0.tgz", ""), bytes.Repeat([]byte{0}, 2<<20))
		s, _ := NewRepo(srv.URL, "redis", Options{CacheDir: t.TempDir(), MaxArchiveSize: 1 << 20})
		if _, err := s.Refresh(ctx); err != nil {
			t.Fatal(err)
		}
		if _, err := s.Load(ctx, "1.0.0"); !errors.Is(err, ErrTooLarge) && (err == nil || !strings.Contains(err.Error(), "larger than")) {
			t.Fatalf("a 2 MiB archive with a 1 MiB limit: %v", err)
		}
	})
	t.Run("tar bomb", func(t *testing.T) {
		var buf bytes.Buffer
		zw := gzip.NewWriter(&buf)
		tw := tar.NewWriter(zw)
		chart := []byte("apiVersion: v2\nname: redis\nversion: 1.0.0\n")
		_ = tw.WriteHeader(&tar.Header{Name: "redis/Chart.yaml", Mode: 0o644, Size: int64(len(chart))})
		_, _ = tw.Write(chart)
		const big = 200 << 20
		_ = tw.WriteHeader(&tar.Header{Name: "redis/templates/big.yaml", Mode: 0o644, Size: big})
		zeros := make([]byte, 1<<20)
		for range big >> 20 {
			_, _ = tw.Write(zeros)
		}
		_ = tw.Close()
		_ = zw.Close()
		srv, _ := hostileRepo(t, indexOf("{{URL}}/redis-1.0.0.tgz", ""), buf.Bytes())
		s, _ := NewRepo(srv.URL, "redis", Options{CacheDir: t.TempDir()})
		if _, err := s.Refresh(ctx); err != nil {
			t.Fatal(err)
		}
		if _, err := s.Load(ctx, "1.0.0"); err == nil {
			t.Fatalf("a %d-byte archive holding a 200 MiB file was loaded", buf.Len())
		}
	})
}
