package backup

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/chartpilot/chartpilot/internal/api/v1alpha1"
)

func TestArchiveValues(t *testing.T) {
	s3 := &v1alpha1.S3Store{Endpoint: "https://s3.example:9000", Bucket: "backups", Prefix: "team-a", ForcePathStyle: true,
		CredentialsSecretRef: v1alpha1.SecretRef{Name: "s3-creds"}, CASecretRef: &v1alpha1.SecretKeyRef{Name: "s3-ca", Key: "ca.crt"}}
	pg := func(wa *v1alpha1.PostgresWALArchive, mod func(*v1alpha1.PostgresBackup)) *v1alpha1.Postgres {
		p := &v1alpha1.Postgres{ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "orders"}, Spec: v1alpha1.PostgresSpec{Version: "17.2"}}
		p.Spec.Backup = &v1alpha1.PostgresBackup{Store: v1alpha1.StoreRef{Name: "main"}, Schedule: "0 * * * *", WALArchive: wa}
		if mod != nil {
			mod(p.Spec.Backup)
		}
		return p
	}
	asJSON := func(v any) string {
		b, err := json.Marshal(v)
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}

	got, err := archiveValues(pg(&v1alpha1.PostgresWALArchive{ArchiveTimeout: &metav1.Duration{Duration: 90 * time.Second}}, func(b *v1alpha1.PostgresBackup) {
		b.Compression = "none"
		b.Encryption = &v1alpha1.BackupEncryption{KeySecretRef: v1alpha1.LocalSecretKeyRef{Name: "age", Key: "recipient"}}
	}), &resolvedStore{spec: v1alpha1.BackupStoreSpec{S3: s3}})
	if err != nil {
		t.Fatal(err)
	}
	want := `{"walArchive":{"ca":{"key":"ca.crt","secretName":"s3-ca"},"enabled":true,"prefix":"shop/orders/pg17",` +
		`"secretEnv":[{"key":"accessKeyID","name":"CHARTPILOT_S3_ACCESS_KEY_ID","secretName":"s3-creds"},` +
		`{"key":"secretAccessKey","name":"CHARTPILOT_S3_SECRET_ACCESS_KEY","secretName":"s3-creds"},` +
		`{"key":"recipient","name":"CHARTPILOT_AGE_KEY","secretName":"age"}],` +
		`"storeArgs":["--store=s3","--s3-bucket=backups","--s3-endpoint=https://s3.example:9000","--s3-prefix=team-a","--s3-force-path-style",` +
		`"--s3-ca-file=/etc/chartpilot/ca/ca.pem","--compression=none"],"timeout":"90s"}}`
	if g := asJSON(got); g != want {
		t.Errorf("values:\n got %s\nwant %s", g, want)
	}

	// The prefix set, no timeout: the chart's default timeout stays.
	got, err = archiveValues(pg(&v1alpha1.PostgresWALArchive{Prefix: "archive/orders-2"}, nil),
		&resolvedStore{spec: v1alpha1.BackupStoreSpec{Azure: &v1alpha1.AzureStore{AccountName: "acct", Container: "wal", CredentialsSecretRef: v1alpha1.SecretRef{Name: "az"}}}})
	if err != nil {
		t.Fatal(err)
	}
	w := got["walArchive"].(map[string]any)
	if w["prefix"] != "archive/orders-2/pg17" || w["timeout"] != nil || w["ca"] != nil {
		t.Errorf("values: %s", asJSON(got))
	}

	for _, tc := range []struct {
		name string
		pg   *v1alpha1.Postgres
		st   v1alpha1.BackupStoreSpec
		want string
	}{
		{"volume", pg(&v1alpha1.PostgresWALArchive{}, nil), v1alpha1.BackupStoreSpec{Volume: &v1alpha1.VolumeStore{ClaimName: "backups"}},
			"store main is a volume"},
		{"quote in the store's prefix", pg(&v1alpha1.PostgresWALArchive{}, nil),
			v1alpha1.BackupStoreSpec{S3: &v1alpha1.S3Store{Bucket: "backups", Prefix: "a'b", CredentialsSecretRef: v1alpha1.SecretRef{Name: "s3"}}},
			`the store main gives the agent "--s3-prefix=a'b"`},
		{"timeout below a second", pg(&v1alpha1.PostgresWALArchive{ArchiveTimeout: &metav1.Duration{Duration: 500 * time.Millisecond}}, nil),
			v1alpha1.BackupStoreSpec{S3: s3}, "spec.backup.walArchive.archiveTimeout 500ms"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := archiveValues(tc.pg, &resolvedStore{spec: tc.st})
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %v, want one with %q", err, tc.want)
			}
		})
	}
}

// TestArchivePrefixConfinedOnSharedStores: on a ClusterBackupStore, shared
// between namespaces, a prefix naming another namespace's archive is
// refused, naming the field and the fix; the default and prefixes below
// the namespace are kept.
func TestArchivePrefixConfinedOnSharedStores(t *testing.T) {
	shared := &resolvedStore{cluster: true, spec: v1alpha1.BackupStoreSpec{S3: &v1alpha1.S3Store{Bucket: "b", CredentialsSecretRef: v1alpha1.SecretRef{Name: "s3"}}}}
	pg := func(prefix string) *v1alpha1.Postgres {
		return &v1alpha1.Postgres{ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "orders"}, Spec: v1alpha1.PostgresSpec{Version: "17",
			Backup: &v1alpha1.PostgresBackup{Store: v1alpha1.StoreRef{Name: "shared", Kind: "ClusterBackupStore"}, WALArchive: &v1alpha1.PostgresWALArchive{Prefix: prefix}}}}
	}
	for prefix, want := range map[string]string{"": "shop/orders/pg17", "shop/orders-2": "shop/orders-2/pg17", "shop": "shop/pg17"} {
		got, err := archiveValues(pg(prefix), shared)
		if err != nil {
			t.Errorf("prefix %q: %v", prefix, err)
			continue
		}
		if p := got["walArchive"].(map[string]any)["prefix"]; p != want {
			t.Errorf("prefix %q: archives to %v, want %s", prefix, p, want)
		}
	}
	for _, prefix := range []string{"bank/ledger", "shopping/x", "archive"} {
		_, err := archiveValues(pg(prefix), shared)
		if err == nil || !strings.Contains(err.Error(), "spec.backup.walArchive.prefix") || !strings.Contains(err.Error(), `"shop/"`) {
			t.Errorf("prefix %q on a shared store: %v", prefix, err)
		}
	} // Nor out of its namespace by . or .. segments.
	for _, prefix := range []string{"shop/../bank", "shop/./x", "shop/.."} {
		_, err := archiveValues(pg(prefix), shared)
		if err == nil || !strings.Contains(err.Error(), "spec.backup.walArchive.prefix") || !strings.Contains(err.Error(), "segment . or ..") {
			t.Errorf("prefix %q: %v, want it refused", prefix, err)
		}
	}
}

// TestStoreRequestChecksEndpoints: a request to a namespaced store's
// endpoint is refused when the allowed endpoints no longer hold it (the
// store's Ready status says it was allowed when it was checked), naming
// the field; a ClusterBackupStore's endpoint is the admin's.
func TestStoreRequestChecksEndpoints(t *testing.T) {
	spec := v1alpha1.BackupStoreSpec{S3: &v1alpha1.S3Store{Bucket: "b", Endpoint: "http://10.0.0.9:9000", CredentialsSecretRef: v1alpha1.SecretRef{Name: "s3"}}}
	_, msg := storeRequest(context.Background(), nil, spec, "shop", false, []string{"https://s3.example"})
	if !strings.Contains(msg, "spec.s3.endpoint") || !strings.Contains(msg, "https://s3.example") {
		t.Errorf("a namespaced store's endpoint outside the allowed ones: %q", msg)
	}
}

// TestRecoveryPrefixConfinedOnSharedStores: on a ClusterBackupStore a
// recovery reads only archives below its namespace's name, as they are
// written; names only, no . or .. segment.
func TestRecoveryPrefixConfinedOnSharedStores(t *testing.T) {
	shared := &resolvedStore{cluster: true, spec: v1alpha1.BackupStoreSpec{S3: &v1alpha1.S3Store{Bucket: "b", CredentialsSecretRef: v1alpha1.SecretRef{Name: "s3"}}}}
	pg := func(prefix string) *v1alpha1.Postgres {
		return &v1alpha1.Postgres{ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "copy"}, Spec: v1alpha1.PostgresSpec{Version: "15",
			Bootstrap: &v1alpha1.PostgresBootstrap{Recovery: &v1alpha1.PostgresRecovery{Source: "orders", Prefix: prefix}}}}
	}
	for prefix, want := range map[string]string{"": "shop/orders/pg15", "shop/old": "shop/old/pg15"} {
		if got, err := recoveryPrefix(pg(prefix), shared, "shared"); err != nil || got != want {
			t.Errorf("prefix %q: %q, %v; want %s", prefix, got, err, want)
		}
	}
	for _, prefix := range []string{"bank/ledger", "shopping/x", "shop/../bank"} {
		if _, err := recoveryPrefix(pg(prefix), shared, "shared"); err == nil || !strings.Contains(err.Error(), "spec.bootstrap.recovery.prefix") {
			t.Errorf("prefix %q on a shared store: %v, want it refused", prefix, err)
		}
	}
}
