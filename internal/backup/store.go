// Package backup is the data path of backups: a stream (a database dump)
// compressed, encrypted on the client, checksummed and uploaded to a blob
// store with a manifest beside it; and back, verified before anything is
// restored. Stores are gocloud.dev buckets (S3 and S3-compatible servers,
// Azure Blob Storage, Google Cloud Storage, a directory for volumes); this
// package holds their settings and opens only a directory: the clients of
// the object stores are in package blobstore, which the manager does not
// link (it reaches stores through the store helper, helper.go).
package backup

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strings"

	"gocloud.dev/blob"
	"gocloud.dev/blob/fileblob"
)

// S3 is an S3 bucket or an S3-compatible server's.
type S3 struct {
	// Endpoint is the server's URL ("" for AWS itself).
	Endpoint string
	Bucket   string
	// Prefix is prepended to every key (a "directory" of the bucket).
	Prefix         string
	Region         string
	ForcePathStyle bool
	// AccessKeyID and SecretAccessKey authenticate; they never appear in
	// an error or a log line of this package.
	AccessKeyID, SecretAccessKey string
	// CABundle, when set, is the PEM of the CAs the endpoint's certificate
	// is checked against (instead of the system's).
	CABundle []byte
}

// Validate names the first missing or wrong field.
func (s S3) Validate() error {
	switch {
	case s.Bucket == "":
		return errors.New("s3.bucket: required")
	case s.AccessKeyID == "" || s.SecretAccessKey == "":
		return errors.New("s3 credentials: an access key ID and a secret access key are required")
	case s.Endpoint != "" && !strings.HasPrefix(s.Endpoint, "https://") && !strings.HasPrefix(s.Endpoint, "http://"):
		return fmt.Errorf("s3.endpoint: %q is not an http(s) URL", s.Endpoint)
	}
	return nil
}

// OpenDir opens a directory (a mounted volume) as a store; it must exist.
func OpenDir(path string) (*blob.Bucket, error) {
	if fi, err := os.Stat(path); err != nil || !fi.IsDir() {
		return nil, fmt.Errorf("volume path %s: not a directory", path)
	}
	return fileblob.OpenBucket(path, &fileblob.Options{NoTempDir: true})
}

// Azure is a container of Azure Blob Storage (or of Azurite).
type Azure struct {
	// Endpoint is the blob service's URL; empty: https://<account>.blob.core.windows.net.
	Endpoint    string
	AccountName string
	Container   string
	// Prefix is prepended to every key.
	Prefix string
	// AccountKey authenticates (shared key); it never appears in an error
	// or a log line of this package.
	AccountKey string
}

// Validate names the first missing or wrong field.
func (a Azure) Validate() error {
	switch {
	case a.AccountName == "":
		return errors.New("azure.accountName: required")
	case a.Container == "":
		return errors.New("azure.container: required")
	case a.AccountKey == "":
		return errors.New("azure credentials: an account key is required")
	case a.Endpoint != "" && !strings.HasPrefix(a.Endpoint, "https://") && !strings.HasPrefix(a.Endpoint, "http://"):
		return fmt.Errorf("azure.endpoint: %q is not an http(s) URL", a.Endpoint)
	}
	return nil
}

// GCS is a bucket of Google Cloud Storage (or of an emulator).
type GCS struct {
	// Endpoint is the JSON API's URL; empty: Google's.
	Endpoint string
	Bucket   string
	// Prefix is prepended to every key.
	Prefix string
	// ServiceAccountKey is a service account's JSON key; it never appears
	// in an error or a log line of this package. Empty only with an
	// endpoint (an emulator, no authentication).
	ServiceAccountKey string
}

// Validate names the first missing or wrong field.
func (g GCS) Validate() error {
	switch {
	case g.Bucket == "":
		return errors.New("gcs.bucket: required")
	case g.Endpoint != "" && !strings.HasPrefix(g.Endpoint, "https://") && !strings.HasPrefix(g.Endpoint, "http://"):
		return fmt.Errorf("gcs.endpoint: %q is not an http(s) URL", g.Endpoint)
	case g.ServiceAccountKey == "" && g.Endpoint == "":
		return errors.New("gcs credentials: a service account key is required")
	case g.ServiceAccountKey != "" && !json.Valid([]byte(g.ServiceAccountKey)):
		return errors.New("gcs credentials: the service account key is not JSON")
	}
	return nil
}
