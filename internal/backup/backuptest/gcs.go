package backuptest

import (
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"io"

	"github.com/fsouza/fake-gcs-server/fakestorage"

	"github.com/chartpilot/chartpilot/internal/backup"
	"github.com/chartpilot/chartpilot/internal/testing/testpg"
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

// ServiceAccountKey is a GCS service account's JSON key of the shape Google
// issues, with a fresh RSA key; mutate, when set, changes its fields (a
// token_uri, an extra field) before it is encoded.
func ServiceAccountKey(t testpg.T, mutate func(map[string]any)) string {
	t.Helper()
	pk, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	der, err := x509.MarshalPKCS8PrivateKey(pk)
	if err != nil {
		t.Fatal(err)
	}
	k := map[string]any{
		"type": "service_account", "project_id": "p", "private_key_id": "abc",
		"private_key":  string(pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der})),
		"client_email": "backups@p.iam.gserviceaccount.com", "client_id": "1",
		"auth_uri": "https://accounts.google.com/o/oauth2/auth", "token_uri": backup.GoogleTokenURL,
		"auth_provider_x509_cert_url": "https://www.googleapis.com/oauth2/v1/certs",
		"client_x509_cert_url":        "https://www.googleapis.com/robot/v1/metadata/x509/backups",
		"universe_domain":             "googleapis.com",
	}
	if mutate != nil {
		mutate(k)
	}
	b, err := json.Marshal(k)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}
