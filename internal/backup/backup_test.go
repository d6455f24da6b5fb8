package backup

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"filippo.io/age"
)

func roundTrip(t *testing.T, o Options, identity string) []byte {
	t.Helper()
	dir := t.TempDir()
	b, err := OpenDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	data := make([]byte, 3<<20)
	_, _ = rand.Read(data[:1<<20]) // a part that does not compress
	copy(data[1<<20:], bytes.Repeat([]byte("row,"), 1<<19))
	m, err := Write(context.Background(), b, "orders/2026-11-30T0000", bytes.NewReader(data), o)
	if err != nil {
		t.Fatal(err)
	}
	if m.PlainSize != int64(len(data)) || m.Size == 0 || len(m.SHA256) != 64 {
		t.Fatalf("manifest %+v", m)
	}
	r, m2, err := Open(context.Background(), b, "orders/2026-11-30T0000", identity, t.TempDir(), Expect{})
	if err != nil {
		t.Fatal(err)
	}
	got, err := io.ReadAll(r)
	r.Close()
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, data) {
		t.Fatalf("restored %d bytes differ from the %d backed up", len(got), len(data))
	}
	if m2.SHA256 != m.SHA256 {
		t.Fatalf("manifest read back differs")
	}
	stored, err := os.ReadFile(filepath.Join(dir, "orders/2026-11-30T0000/data"))
	if err != nil {
		t.Fatal(err)
	}
	return stored
}

func TestRoundTrip(t *testing.T) {
	id, err := age.GenerateX25519Identity()
	if err != nil {
		t.Fatal(err)
	}
	t.Run("zstd", func(t *testing.T) {
		stored := roundTrip(t, Options{}, "")
		if len(stored) >= 3<<20 {
			t.Errorf("stored %d bytes of 3 MiB: not compressed", len(stored))
		}
	})
	t.Run("zstd and age", func(t *testing.T) {
		stored := roundTrip(t, Options{Recipient: id.Recipient().String()}, id.String())
		if bytes.Contains(stored, []byte("row,row,")) {
			t.Errorf("the stored data holds plaintext")
		}
		if !bytes.HasPrefix(stored, []byte("age-encryption.org/v1")) {
			t.Errorf("the stored data is not age-encrypted")
		}
	})
	t.Run("uncompressed", func(t *testing.T) {
		stored := roundTrip(t, Options{Compression: CompressionNone}, "")
		if len(stored) != 3<<20 {
			t.Errorf("stored %d bytes, want the 3 MiB as they are", len(stored))
		}
	})
}

func TestRefusals(t *testing.T) {
	ctx := context.Background()
	id, _ := age.GenerateX25519Identity()
	other, _ := age.GenerateX25519Identity()
	dir := t.TempDir()
	b, err := OpenDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	if _, err := Write(ctx, b, "a", strings.NewReader("first"), Options{Recipient: id.Recipient().String()}); err != nil {
		t.Fatal(err)
	}
	if _, err := Write(ctx, b, "a", strings.NewReader("second"), Options{}); !errors.Is(err, ErrExists) {
		t.Errorf("a second backup at the same location: %v, want ErrExists", err)
	}
	check := func(name, identity, want string) {
		t.Helper()
		r, _, err := Open(ctx, b, "a", identity, t.TempDir(), Expect{})
		if err == nil {
			r.Close()
			t.Errorf("%s: opened", name)
			return
		}
		if !strings.Contains(err.Error(), want) {
			t.Errorf("%s: %v, want it to say %q", name, err, want)
		}
		if identity != "" && strings.Contains(err.Error(), identity) {
			t.Errorf("%s: the error shows the key", name)
		}
	}
	check("no key", "", "is encrypted")
	check("another key", other.String(), "use the key it was made with")
	check("not a key", "hunter2", "not an age X25519 secret key")
	if _, err := Write(ctx, b, "b", strings.NewReader("x"), Options{Recipient: "hunter2"}); err == nil || !strings.Contains(err.Error(), "age1") {
		t.Errorf("a bad recipient: %v", err)
	}
	// One byte changed in the stored data: refused before anything is read.
	path := filepath.Join(dir, "a", "data")
	data, _ := os.ReadFile(path)
	data[len(data)/2] ^= 0xff
	if err := os.WriteFile(path, data, 0o600); err != nil {
		t.Fatal(err)
	}
	check("corrupted", id.String(), "is corrupted")
	if _, _, err := Open(ctx, b, "nothing-here", "", t.TempDir(), Expect{}); err == nil || !strings.Contains(err.Error(), "no backup at nothing-here") {
		t.Errorf("no backup: %v", err)
	}
}

// TestManifestBounded: a manifest.json that anyone with write access to
// the store made 100 MiB large is refused after MaxManifestSize bytes,
// without reading the rest; one whose fields are not a manifest's (a
// 4000-digit sha256, an unknown compression) is refused naming the field.
func TestManifestBounded(t *testing.T) {
	dir := t.TempDir()
	if err := os.MkdirAll(filepath.Join(dir, "db", "1"), 0o755); err != nil {
		t.Fatal(err)
	}
	big, err := os.Create(filepath.Join(dir, "db", "1", "manifest.json"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.Copy(big, io.LimitReader(zeros{}, 100<<20)); err != nil {
		t.Fatal(err)
	}
	big.Close()
	b, err := OpenDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	if _, err := ReadManifest(context.Background(), b, "db/1"); err == nil || !strings.Contains(err.Error(), "larger than") {
		t.Errorf("a 100 MiB manifest: %v", err)
	}
	runtime.ReadMemStats(&after)
	if grew := after.TotalAlloc - before.TotalAlloc; grew > 50<<20 {
		t.Errorf("reading a 100 MiB manifest allocated %d MiB", grew>>20)
	}
	for field, body := range map[string]string{
		"sha256":      `{"format":"` + Format + `","sha256":"` + strings.Repeat("f", 4000) + `","compression":"zstd"}`,
		"compression": `{"format":"` + Format + `","sha256":"` + strings.Repeat("a", 64) + `","compression":"$(rm -rf /)"}`,
		"recipient":   `{"format":"` + Format + `","sha256":"` + strings.Repeat("a", 64) + `","compression":"zstd","encryption":"age","recipient":"\u001b[2J"}`,
	} {
		if err := os.WriteFile(filepath.Join(dir, "db", "1", "manifest.json"), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
		if _, err := ReadManifest(context.Background(), b, "db/1"); err == nil || !strings.Contains(err.Error(), field) {
			t.Errorf("a manifest with a bad %s: %v", field, err)
		}
	}
}

type zeros struct{}

func (zeros) Read(p []byte) (int, error) {
	clear(p)
	return len(p), nil
}
