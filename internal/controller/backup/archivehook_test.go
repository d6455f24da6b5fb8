package backup_test

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/chartpilot/chartpilot/internal/api/v1alpha1"
	"github.com/chartpilot/chartpilot/internal/controller/backup"
	"github.com/chartpilot/chartpilot/internal/hooks"
)

// TestArchiveHookResolvesItsNamespacesStore: the WAL archive's values
// come from the BackupStore of the Postgres's own namespace, read from the
// API server: the chart gets the store's bucket and the credentials'
// Secret of that namespace. A store not yet checked makes the hook wait,
// naming spec.backup.store.
func TestArchiveHookResolvesItsNamespacesStore(t *testing.T) {
	cluster.Skip(t)
	ctx := context.Background()
	c, err := client.New(cluster.Config, client.Options{Scheme: testScheme()})
	if err != nil {
		t.Fatal(err)
	}
	ns := cluster.Namespace(t)
	store := &v1alpha1.BackupStore{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "s3"}, Spec: v1alpha1.BackupStoreSpec{S3: &v1alpha1.S3Store{
		Endpoint: "http://127.0.0.1:9", Bucket: "wal-bucket", ForcePathStyle: true, CredentialsSecretRef: v1alpha1.SecretRef{Name: "s3-keys"}}}}
	if err := c.Create(ctx, store); err != nil {
		t.Fatal(err)
	}
	pg := &v1alpha1.Postgres{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "orders"}, Spec: v1alpha1.PostgresSpec{Version: "17", Storage: v1alpha1.PostgresStorage{Size: "1Gi"},
		Backup: &v1alpha1.PostgresBackup{Store: v1alpha1.StoreRef{Name: "s3"}, WALArchive: &v1alpha1.PostgresWALArchive{}}}}
	h := backup.Hook(c, nil, nil, &backup.Archive{Client: c, Reader: c})
	obj := hooks.Object{Resource: toUnstructured(t, pg)}
	if _, err := h.Values.Values(ctx, obj); err == nil || !strings.Contains(err.Error(), "spec.backup.store") || !strings.Contains(err.Error(), "not been checked") {
		t.Fatalf("a store not yet checked: %v, want a wait naming spec.backup.store", err)
	}
	store.Status.Conditions = []metav1.Condition{{Type: v1alpha1.ConditionReady, Status: metav1.ConditionTrue, Reason: "Checked", Message: "ok",
		ObservedGeneration: store.Generation, LastTransitionTime: metav1.Now()}}
	if err := c.Status().Update(ctx, store); err != nil {
		t.Fatal(err)
	}
	vals, err := h.Values.Values(ctx, obj)
	if err != nil {
		t.Fatalf("the archive's values from a Ready store of the namespace: %v", err)
	}
	wa, _ := vals["walArchive"].(map[string]any)
	if wa == nil {
		t.Fatalf("no walArchive values: %v", vals)
	}
	b, _ := json.Marshal(wa)
	text := string(b)
	if !strings.Contains(text, "wal-bucket") || !strings.Contains(text, "s3-keys") {
		t.Errorf("walArchive values do not name the namespace's store (bucket wal-bucket, Secret s3-keys): %s", text)
	}
}
