package backuptest

import (
	"io"

	"github.com/fsouza/fake-gcs-server/fakestorage"

	"github.com/chartpilot/chartpilot/internal/backup"
	"github.com/chartpilot/chartpilot/internal/testpg"
)

// StartGCS starts a Google Cloud Storage emulator (fake-gcs-server's JSON
// API, in this process, on loopback) with an empty bucket, stopped when
// the test ends, and returns the store's settings (no credentials: the
// emulator does not authenticate).
func StartGCS(t testpg.T) backup.GCS {
	t.Helper()
	srv, err := fakestorage.NewServerWithOptions(fakestorage.Options{
		Scheme: "http", Host: "127.0.0.1", Port: 0, PublicHost: "127.0.0.1", Writer: io.Discard,
	})
	if err != nil {
		t.Fatalf("starting fake-gcs-server: %v", err)
	}
	t.Cleanup(srv.Stop)
	srv.CreateBucketWithOpts(fakestorage.CreateBucketOpts{Name: "backups"})
	return backup.GCS{Endpoint: srv.URL(), Bucket: "backups", Prefix: "chartpilot"}
}
