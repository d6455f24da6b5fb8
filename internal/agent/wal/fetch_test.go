package wal_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"filippo.io/age"
	"gocloud.dev/blob/memblob"

	"github.com/chartpilot/chartpilot/internal/agent/wal"
)

// TestFetchRefusesUnencryptedWithAKey: an archive whose files are
// encrypted (a key is configured) refuses a WAL file stored without
// encryption, which anyone who can write the store could have put there;
// an encrypted one is fetched.
func TestFetchRefusesUnencryptedWithAKey(t *testing.T) {
	ctx := context.Background()
	b := memblob.OpenBucket(nil)
	defer b.Close()
	id, err := age.GenerateX25519Identity()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	const seg = 1 << 20
	for name, recipient := range map[string]string{"000000010000000000000001": "", "000000010000000000000002": id.Recipient().String()} {
		path := filepath.Join(dir, name)
		if err := os.WriteFile(path, make([]byte, seg), 0o600); err != nil {
			t.Fatal(err)
		}
		pusher := &wal.Archive{Bucket: b, Prefix: "ns/db", Recipient: recipient, SegmentSize: seg}
		if err := pusher.Push(ctx, path); err != nil {
			t.Fatalf("pushing %s: %v", name, err)
		}
	}
	a := &wal.Archive{Bucket: b, Prefix: "ns/db", Identity: id.String(), SegmentSize: seg}
	err = a.Fetch(ctx, "000000010000000000000001", filepath.Join(dir, "fetched-1"))
	if err == nil || !strings.Contains(err.Error(), "not encrypted") {
		t.Errorf("fetching the unencrypted file with a key configured: %v", err)
	}
	if _, err := os.Stat(filepath.Join(dir, "fetched-1")); !os.IsNotExist(err) {
		t.Errorf("the refused file was written: %v", err)
	}
	if err := a.Fetch(ctx, "000000010000000000000002", filepath.Join(dir, "fetched-2")); err != nil {
		t.Errorf("fetching the encrypted file: %v", err)
	}
}
