package helm

import (
	"bytes"
	"compress/gzip"
	"encoding/json"
	"testing"

	"helm.sh/helm/v3/pkg/release"
)

func gzipRelease(t testing.TB, rel *release.Release) []byte {
	raw, err := json.Marshal(rel)
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	zw := gzip.NewWriter(&buf)
	_, _ = zw.Write(raw)
	if err := zw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// TestDecodeBodyReusesReadersSafely: the pooled decompressors read each
// body whole and right, after a broken body as well.
func TestDecodeBodyReusesReadersSafely(t *testing.T) {
	a := gzipRelease(t, &release.Release{Name: "a", Version: 1, Manifest: trickyManifest})
	b := gzipRelease(t, &release.Release{Name: "b", Version: 2, Manifest: "kind: ConfigMap\n"})
	broken := append([]byte{}, a[:len(a)/2]...)
	for i := 0; i < 3; i++ {
		if _, err := decodeBody("broken", broken, 1<<20); err == nil {
			t.Fatal("a truncated body decoded")
		}
		for _, c := range []struct {
			gz      []byte
			name    string
			version int
			size    int
		}{{a, "a", 1, len(trickyManifest)}, {b, "b", 2, len("kind: ConfigMap\n")}} {
			rel, err := decodeBody(c.name, c.gz, 1<<20)
			if err != nil || rel.Name != c.name || rel.Version != c.version || len(rel.Manifest) != c.size {
				t.Fatalf("round %d: %s decoded as %+v, %v", i, c.name, rel, err)
			}
		}
	}
	if _, err := decodeBody("a", a, 100); err == nil {
		t.Fatal("a body over the limit decoded")
	}
}

func BenchmarkDecodeBody(b *testing.B) {
	gz := gzipRelease(b, &release.Release{Name: "a", Version: 1, Manifest: trickyManifest})
	b.ReportAllocs()
	for i := 0; i < b.N; i++ {
		if _, err := decodeBody("a", gz, 1<<20); err != nil {
			b.Fatal(err)
		}
	}
}
