package blobstore_test

import (
	"context"
	"encoding/base64"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"

	"gocloud.dev/blob"

	"github.com/chartpilot/chartpilot/internal/agent/blobstore"
	"github.com/chartpilot/chartpilot/internal/backup"
)

// TestStoresFollowNoRedirect: a GCS or Azure endpoint that answers every
// request with a redirect to another server does not send the request
// (and, for Azure, its signed SharedKey header) there.
func TestStoresFollowNoRedirect(t *testing.T) {
	var elsewhere atomic.Int32
	other := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		elsewhere.Add(1)
		w.WriteHeader(http.StatusOK)
	}))
	defer other.Close()
	store := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, other.URL+r.URL.RequestURI(), http.StatusTemporaryRedirect)
	}))
	defer store.Close()
	ctx := context.Background()
	open := map[string]func() (*blob.Bucket, error){
		"gcs": func() (*blob.Bucket, error) {
			return blobstore.OpenGCS(ctx, backup.GCS{Bucket: "b", Endpoint: store.URL})
		},
		"azure": func() (*blob.Bucket, error) {
			return blobstore.OpenAzure(ctx, backup.Azure{AccountName: "acct", Container: "c", Endpoint: store.URL,
				AccountKey: base64.StdEncoding.EncodeToString([]byte("not a real key, 32 bytes long..."))})
		},
	}
	for name, o := range open {
		b, err := o()
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		_, _ = b.ReadAll(ctx, "x/manifest.json")
		_, _ = b.List(&blob.ListOptions{Prefix: "x/"}).Next(ctx)
		b.Close()
		if n := elsewhere.Load(); n != 0 {
			t.Errorf("%s: the server redirected to received %d requests", name, n)
		}
	}
}
