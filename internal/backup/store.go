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
	case strings.ContainsAny(s.Bucket, "/?#@") || len(s.Bucket) > 255:
		return errors.New("s3.bucket: a bucket's name, without /, ?, # or @ (at most 255 characters)")
	case len(s.Region) > 64 || strings.ContainsAny(s.Region, "/?#@:"):
		return errors.New("s3.region: a region's name, such as us-east-1")
	}
	if s.Endpoint != "" {
		if _, err := ParseEndpoint(s.Endpoint); err != nil {
			return fmt.Errorf("s3.endpoint: %w", err)
		}
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
	case !azureName(a.AccountName, 3, 63):
		return errors.New("azure.accountName: lower-case letters and digits only, 3 to 63 characters")
	case strings.ContainsAny(a.Container, "/?#@") || len(a.Container) > 63:
		return errors.New("azure.container: a container's name, without /, ?, # or @ (at most 63 characters)")
	}
	if a.Endpoint != "" {
		if _, err := ParseEndpoint(a.Endpoint); err != nil {
			return fmt.Errorf("azure.endpoint: %w", err)
		}
	}
	return nil
}

// azureName: lower-case letters and digits, min to max long (a storage
// account's name, which goes into the default endpoint's host).
func azureName(s string, min, max int) bool {
	if len(s) < min || len(s) > max {
		return false
	}
	for _, c := range s {
		if (c < 'a' || c > 'z') && (c < '0' || c > '9') {
			return false
		}
	}
	return true
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
	// AllowedTokenURLs are the endpoints besides Google's token endpoint
	// the key's token_uri may name (an emulator's, allowed by the admin).
	AllowedTokenURLs []string `json:"allowedTokenURLs,omitempty"`
}

// Validate names the first missing or wrong field.
func (g GCS) Validate() error {
	switch {
	case g.Bucket == "":
		return errors.New("gcs.bucket: required")
	case strings.ContainsAny(g.Bucket, "/?#@") || len(g.Bucket) > 222:
		return errors.New("gcs.bucket: a bucket's name, without /, ?, # or @ (at most 222 characters)")
	case g.ServiceAccountKey == "" && g.Endpoint == "":
		return errors.New("gcs credentials: a service account key is required")
	}
	if g.Endpoint != "" {
		if _, err := ParseEndpoint(g.Endpoint); err != nil {
			return fmt.Errorf("gcs.endpoint: %w", err)
		}
	}
	if g.ServiceAccountKey == "" {
		return nil
	}
	key, err := ParseGCSKey(g.ServiceAccountKey)
	if err != nil {
		return err
	}
	// The key's token endpoint receives requests from wherever the store
	// is opened: Google's, or one the admin allowed.
	if key.TokenURL() != GoogleTokenURL && !EndpointAllowed(key.TokenURL(), g.AllowedTokenURLs) {
		return fmt.Errorf("gcs credentials: the key's field token_uri %q is not Google's (%s) nor an endpoint the operator allows: use the key as Google issued it", clip(key.TokenURL()), GoogleTokenURL)
	}
	return nil
}
