// Package blobstore opens the object stores of backups (S3 and
// S3-compatible servers, Azure Blob Storage, Google Cloud Storage) with
// their vendors' clients, and answers the manager's requests to them as
// the store helper (`chartpilot store`, Serve). The clients are most of the
// binary's size, so the manager (`chartpilot-manager`) is built without
// this package and runs the helper, a short-lived process, for the few
// times it touches a store itself (checking a store, reading a backup's
// manifest).
package blobstore

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net/http"
	"strings"

	gcpcredentials "cloud.google.com/go/auth/credentials"
	"cloud.google.com/go/storage"
	"github.com/Azure/azure-sdk-for-go/sdk/azcore"
	"github.com/Azure/azure-sdk-for-go/sdk/storage/azblob/container"
	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"gocloud.dev/blob"
	"gocloud.dev/blob/azureblob"
	"gocloud.dev/blob/gcsblob"
	"gocloud.dev/blob/s3blob"
	"google.golang.org/api/option"
	htransport "google.golang.org/api/transport/http"

	"github.com/chartpilot/chartpilot/internal/backup"
)

// OpenS3 opens the bucket; nothing is read or written yet.
func OpenS3(ctx context.Context, s backup.S3) (*blob.Bucket, error) {
	if err := s.Validate(); err != nil {
		return nil, err
	}
	region := s.Region
	if region == "" {
		region = "us-east-1"
	}
	httpClient := noRedirects()
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

// OpenAzure opens the container; nothing is read or written yet.
func OpenAzure(ctx context.Context, a backup.Azure) (*blob.Bucket, error) {
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
	// Redirects are not followed: the signed request goes to the
	// endpoint named and nowhere else.
	client, err := container.NewClientWithSharedKeyCredential(endpoint+"/"+a.Container, cred,
		&container.ClientOptions{ClientOptions: azcore.ClientOptions{Transport: noRedirects()}})
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

// noRedirects is an HTTP client that does not follow redirects: a store
// or token endpoint that answers with one is not sent elsewhere.
func noRedirects() *http.Client {
	return &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
}

// OpenGCS opens the bucket; nothing is read or written yet.
func OpenGCS(ctx context.Context, g backup.GCS) (*blob.Bucket, error) {
	if err := g.Validate(); err != nil {
		return nil, err
	}
	var opts []option.ClientOption
	if g.Endpoint != "" {
		opts = append(opts, option.WithEndpoint(strings.TrimSuffix(g.Endpoint, "/")+"/storage/v1/"))
	}
	if g.ServiceAccountKey != "" {
		// Only a service account's key (checked by Validate): never
		// DetectDefault, which takes every credential type Google's
		// libraries know, including ones that read local files and call
		// URLs of the key's author.
		creds, err := gcpcredentials.NewCredentialsFromJSON(gcpcredentials.ServiceAccount, []byte(g.ServiceAccountKey),
			&gcpcredentials.DetectOptions{Scopes: []string{storage.ScopeReadWrite}, Client: noRedirects()})
		if err != nil {
			return nil, errors.New("gcs credentials: the service account key cannot be read")
		}
		opts = append(opts, option.WithAuthCredentials(creds))
	} else {
		opts = append(opts, option.WithoutAuthentication())
	}
	// The authorised HTTP client, made to follow no redirect: a request
	// and its token go to the endpoint named and nowhere else.
	hc, _, err := htransport.NewClient(ctx, append(opts, option.WithScopes(storage.ScopeReadWrite))...)
	if err != nil {
		return nil, fmt.Errorf("gcs bucket %s: %w", g.Bucket, err)
	}
	hc.CheckRedirect = func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
	copts := []option.ClientOption{option.WithHTTPClient(hc)}
	if g.Endpoint != "" {
		copts = append(copts, option.WithEndpoint(strings.TrimSuffix(g.Endpoint, "/")+"/storage/v1/"))
	}
	client, err := storage.NewClient(ctx, copts...)
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
