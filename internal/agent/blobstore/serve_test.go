package blobstore_test

import (
	"bytes"
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/chartpilot/chartpilot/internal/agent/blobstore"
	"github.com/chartpilot/chartpilot/internal/backup"
	"github.com/chartpilot/chartpilot/internal/backup/backuptest"
)

// serve runs one request through Serve, as the helper process does.
func serve(t *testing.T, req backup.StoreRequest) backup.StoreReply {
	t.Helper()
	in, err := json.Marshal(req)
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	if err := blobstore.Serve(context.Background(), bytes.NewReader(in), &out); err != nil {
		t.Fatal(err)
	}
	var reply backup.StoreReply
	if err := json.Unmarshal(out.Bytes(), &reply); err != nil || !reply.Done {
		t.Fatalf("answer %q: %v", out.String(), err)
	}
	return reply
}

// TestServeAgainstRealStores: the helper's probe and manifest read on a
// real S3 server (versitygw), Azurite and fake-gcs-server; a wrong key, a
// missing backup and settings that cannot open a store each say so, and
// no answer holds the credentials it was given.
func TestServeAgainstRealStores(t *testing.T) {
	s3 := backuptest.StartS3(t, t.TempDir())
	az := backuptest.StartAzure(t, t.TempDir())
	gcs := backuptest.StartGCS(t)
	for _, req := range []backup.StoreRequest{{S3: &s3}, {Azure: &az}, {GCS: &gcs}} {
		req.Op = "probe"
		if r := serve(t, req); r.Invalid != "" || r.Failed != "" {
			t.Errorf("probe of %s: %+v", name(req), r)
		}
	}

	// A backup written to S3 is read back by its manifest; another location is not there.
	b, err := blobstore.OpenS3(context.Background(), s3)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	written, err := backup.Write(context.Background(), b, "db/1", strings.NewReader("a dump"), backup.Options{})
	if err != nil {
		t.Fatal(err)
	}
	r := serve(t, backup.StoreRequest{Op: "manifest", S3: &s3, Location: "db/1"})
	if r.Manifest == nil || r.Manifest.SHA256 != written.SHA256 || r.Failed != "" {
		t.Errorf("manifest of db/1: %+v, want sha256 %s", r, written.SHA256)
	}
	if r := serve(t, backup.StoreRequest{Op: "manifest", S3: &s3, Location: "db/2"}); r.Failed == "" || r.Manifest != nil {
		t.Errorf("manifest of a location never written: %+v", r)
	}

	wrong := s3
	wrong.SecretAccessKey = "wrong-secret-never-shown-987654"
	r = serve(t, backup.StoreRequest{Op: "probe", S3: &wrong})
	if r.Failed == "" || strings.Contains(r.Failed, wrong.SecretAccessKey) {
		t.Errorf("probe with a wrong secret: %+v", r)
	}
	badKey := backup.Azure{AccountName: "acct", Container: "c", AccountKey: "bm90LWEta2V5", Endpoint: "ftp://x"}
	if r := serve(t, backup.StoreRequest{Op: "probe", Azure: &badKey}); !strings.Contains(r.Invalid, "azure.endpoint") || strings.Contains(r.Invalid, badKey.AccountKey) {
		t.Errorf("probe of an Azure store with an ftp endpoint: %+v", r)
	}
	if r := serve(t, backup.StoreRequest{Op: "probe"}); !strings.Contains(r.Invalid, "exactly one of s3, azure or gcs") {
		t.Errorf("a request naming no store: %+v", r)
	}
	if r := serve(t, backup.StoreRequest{Op: "list", S3: &s3}); !strings.Contains(r.Invalid, `op "list"`) {
		t.Errorf("an unknown op: %+v", r)
	}
	var out bytes.Buffer
	if err := blobstore.Serve(context.Background(), strings.NewReader("not json"), &out); err == nil {
		t.Errorf("a request that is not JSON was answered: %q", out.String())
	}
}

func name(r backup.StoreRequest) string {
	switch {
	case r.S3 != nil:
		return "s3"
	case r.Azure != nil:
		return "azure"
	}
	return "gcs"
}
