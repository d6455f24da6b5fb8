// Package backup is the data path of backups: a stream (a database dump)
// compressed, encrypted on the client, checksummed and uploaded to a blob
// store with a manifest beside it; and back, verified before anything is
// restored. Stores are gocloud.dev buckets (S3 and S3-compatible servers,
// Azure Blob Storage, a directory for volumes).
package backup

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"strings"

	gcpcredentials "cloud.google.com/go/auth/credentials"
	"cloud.google.com/go/storage"
	"github.com/Azure/azure-sdk-for-go/sdk/storage/azblob/container"
	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"gocloud.dev/blob"
	"gocloud.dev/blob/azureblob"
	"gocloud.dev/blob/fileblob"
	"gocloud.dev/blob/gcsblob"
	"gocloud.dev/blob/s3blob"
	"google.golang.org/api/option"
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

// OpenS3 opens the bucket; nothing is read or written yet.
func OpenS3(ctx context.Context, s S3) (*blob.Bucket, error) {
	if err := s.Validate(); err != nil {
		return nil, err
	}
	region := s.Region
	if region == "" {
		region = "us-east-1"
	}
	httpClient := &http.Client{}
	if len(s.CABundle) > 0 {
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(s.CABundle) {
			return nil, errors.New("s3 CA bundle: no PEM certificate in it")
		}
		httpClient.Transport = &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}}
	}
	cfg := aws.Config{
		Region:      region,
		Credentials: credentials.NewStaticCredentialsProvider(s.AccessKeyID, s.SecretAccessKey, ""),
		HTTPClient:  httpClient,
		// Checksums only where the operation requires them: S3-compatible
		// servers do not all know the newer ones.
		RequestChecksumCalculation: aws.RequestChecksumCalculationWhenRequired,
		ResponseChecksumValidation: aws.ResponseChecksumValidationWhenRequired,
	}
	client := s3.NewFromConfig(cfg, func(o *s3.Options) {
		if s.Endpoint != "" {
			o.BaseEndpoint = aws.String(s.Endpoint)
		}
		o.UsePathStyle = s.ForcePathStyle
	})
	b, err := s3blob.OpenBucket(ctx, client, s.Bucket, nil)
	if err != nil {
		return nil, fmt.Errorf("s3 bucket %s: %w", s.Bucket, err)
	}
	if s.Prefix != "" {
		b = blob.PrefixedBucket(b, strings.TrimSuffix(s.Prefix, "/")+"/")
	}
	return b, nil
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

// OpenAzure opens the container; nothing is read or written yet.
func OpenAzure(ctx context.Context, a Azure) (*blob.Bucket, error) {
	if err := a.Validate(); err != nil {
		return nil, err
	}
	endpoint := strings.TrimSuffix(a.Endpoint, "/")
	if endpoint == "" {
		endpoint = "https://" + a.AccountName + ".blob.core.windows.net"
	}
	cred, err := container.NewSharedKeyCredential(a.AccountName, a.AccountKey)
	if err != nil {
		return nil, errors.New("azure credentials: the account key is not valid base64")
	}
	client, err := container.NewClientWithSharedKeyCredential(endpoint+"/"+a.Container, cred, nil)
	if err != nil {
		return nil, fmt.Errorf("azure container %s: %w", a.Container, err)
	}
	b, err := azureblob.OpenBucket(ctx, client, nil)
	if err != nil {
		return nil, fmt.Errorf("azure container %s: %w", a.Container, err)
	}
	if a.Prefix != "" {
		b = blob.PrefixedBucket(b, strings.TrimSuffix(a.Prefix, "/")+"/")
	}
	return b, nil
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

// OpenGCS opens the bucket; nothing is read or written yet.
func OpenGCS(ctx context.Context, g GCS) (*blob.Bucket, error) {
	if err := g.Validate(); err != nil {
		return nil, err
	}
	var opts []option.ClientOption
	if g.Endpoint != "" {
		opts = append(opts, option.WithEndpoint(strings.TrimSuffix(g.Endpoint, "/")+"/storage/v1/"))
	}
	if g.ServiceAccountKey != "" {
		creds, err := gcpcredentials.DetectDefault(&gcpcredentials.DetectOptions{
			CredentialsJSON: []byte(g.ServiceAccountKey), Scopes: []string{storage.ScopeReadWrite}})
		if err != nil {
			return nil, errors.New("gcs credentials: the service account key cannot be read")
		}
		opts = append(opts, option.WithAuthCredentials(creds))
	} else {
		opts = append(opts, option.WithoutAuthentication())
	}
	client, err := storage.NewClient(ctx, opts...)
	if err != nil {
		return nil, fmt.Errorf("gcs bucket %s: %w", g.Bucket, err)
	}
	b, err := gcsblob.OpenBucket(ctx, nil, g.Bucket, &gcsblob.Options{Client: client})
	if err != nil {
		return nil, fmt.Errorf("gcs bucket %s: %w", g.Bucket, err)
	}
	if g.Prefix != "" {
		b = blob.PrefixedBucket(b, strings.TrimSuffix(g.Prefix, "/")+"/")
	}
	return b, nil
}
