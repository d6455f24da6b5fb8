// Package agentargs is the agent's command line for a store, written in
// one place: the Jobs' builders (internal/jobspec) write it with Args, and
// the agent (cmd/chartpilot) parses it with Register, by the same names.
// Credentials never go on it: the agent reads them from the environment
// variables named here.
package agentargs

import "flag"

// The environment variables the agent reads a store's credentials and the
// backups' key from.
const (
	EnvS3AccessKeyID        = "CHARTPILOT_S3_ACCESS_KEY_ID"
	EnvS3SecretAccessKey    = "CHARTPILOT_S3_SECRET_ACCESS_KEY"
	EnvAzureAccountKey      = "CHARTPILOT_AZURE_ACCOUNT_KEY"
	EnvGCSServiceAccountKey = "CHARTPILOT_GCS_SERVICE_ACCOUNT_KEY"
	EnvAgeKey               = "CHARTPILOT_AGE_KEY"
)

// Kinds of store.
const (
	S3     = "s3"
	GCS    = "gcs"
	Azure  = "azure"
	Volume = "volume"
)

// Store names a store: its kind and where its objects are.
type Store struct {
	Kind string
	// S3 (and S3-compatible servers).
	S3Endpoint, S3Bucket, S3Prefix, S3Region string
	S3ForcePathStyle                         bool
	// S3CAFile is a PEM file of the CAs the endpoint's certificate is
	// checked against.
	S3CAFile string
	// Azure blob storage.
	AzureEndpoint, AzureAccount, AzureContainer, AzurePrefix string
	// Google Cloud Storage.
	GCSEndpoint, GCSBucket, GCSPrefix string
	// VolumePath is the directory of a volume store.
	VolumePath string
}

// DefaultS3Region is the region when none is given.
const DefaultS3Region = "us-east-1"

// Register makes fs parse the store's flags into s.
func (s *Store) Register(fs *flag.FlagSet) {
	fs.StringVar(&s.Kind, "store", "", "kind of store: s3, gcs, azure or volume (required)")
	fs.StringVar(&s.S3Endpoint, "s3-endpoint", "", "URL of an S3-compatible server (empty: AWS)")
	fs.StringVar(&s.S3Bucket, "s3-bucket", "", "bucket")
	fs.StringVar(&s.S3Prefix, "s3-prefix", "", "key prefix inside the bucket")
	fs.StringVar(&s.S3Region, "s3-region", DefaultS3Region, "region")
	fs.BoolVar(&s.S3ForcePathStyle, "s3-force-path-style", false, "address the bucket in the path, not the host name")
	fs.StringVar(&s.S3CAFile, "s3-ca-file", "", "PEM file of the CAs the endpoint's certificate is checked against")
	fs.StringVar(&s.AzureEndpoint, "azure-endpoint", "", "URL of the blob service (empty: https://ACCOUNT.blob.core.windows.net)")
	fs.StringVar(&s.AzureAccount, "azure-account", "", "storage account")
	fs.StringVar(&s.AzureContainer, "azure-container", "", "container")
	fs.StringVar(&s.AzurePrefix, "azure-prefix", "", "key prefix inside the container")
	fs.StringVar(&s.GCSEndpoint, "gcs-endpoint", "", "URL of the JSON API (empty: Google's)")
	fs.StringVar(&s.GCSBucket, "gcs-bucket", "", "bucket")
	fs.StringVar(&s.GCSPrefix, "gcs-prefix", "", "key prefix inside the bucket")
	fs.StringVar(&s.VolumePath, "volume-path", "", "directory of the volume store")
}

// Args is s as flags of the agent (each flag, then its value), the
// store's kind first and then its own flags that are set; what Register
// parses back into s.
func (s Store) Args() []string {
	out := []string{"--store", s.Kind}
	add := func(flag, v string) {
		if v != "" {
			out = append(out, flag, v)
		}
	}
	switch s.Kind {
	case Azure:
		out = append(out, "--azure-account", s.AzureAccount, "--azure-container", s.AzureContainer)
		add("--azure-endpoint", s.AzureEndpoint)
		add("--azure-prefix", s.AzurePrefix)
	case GCS:
		out = append(out, "--gcs-bucket", s.GCSBucket)
		add("--gcs-endpoint", s.GCSEndpoint)
		add("--gcs-prefix", s.GCSPrefix)
	case S3:
		out = append(out, "--s3-bucket", s.S3Bucket)
		add("--s3-endpoint", s.S3Endpoint)
		add("--s3-prefix", s.S3Prefix)
		add("--s3-region", s.S3Region)
		if s.S3ForcePathStyle {
			out = append(out, "--s3-force-path-style")
		}
		add("--s3-ca-file", s.S3CAFile)
	case Volume:
		out = append(out, "--volume-path", s.VolumePath)
	}
	return out
}
