package backup_test

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/chartpilot/chartpilot/internal/api/v1alpha1"
	"github.com/chartpilot/chartpilot/internal/controller/backup"
	"github.com/chartpilot/chartpilot/internal/hooks"
)

// TestRecoveryHookValues: spec.bootstrap.recovery becomes the chart's
// bootstrap.recovery values, reading the source's archive (NAMESPACE/
// SOURCE/pgMAJOR, or the prefix given) in the namespace's store, the
// credentials and the key as Secret references. Refused, naming the field
// and the fix: no failover; the archive this Postgres would itself
// archive to; a shared store's archive of another namespace. A store not
// yet checked makes the release wait. Once the recovery completed, a
// store gone no longer holds the release: the layer is dropped.
func TestRecoveryHookValues(t *testing.T) {
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
	h := backup.Hook(c, nil, nil, &backup.Archive{Client: c, Reader: c})
	pg := func(mod func(*v1alpha1.Postgres)) hooks.Object {
		p := &v1alpha1.Postgres{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "copy"}, Spec: v1alpha1.PostgresSpec{Version: "15", Storage: v1alpha1.PostgresStorage{Size: "1Gi"},
			Failover: &v1alpha1.PostgresFailover{Enabled: ptr.To(true)},
			Bootstrap: &v1alpha1.PostgresBootstrap{Recovery: &v1alpha1.PostgresRecovery{Source: "orders", Store: &v1alpha1.StoreRef{Name: "s3"},
				Encryption: &v1alpha1.BackupEncryption{KeySecretRef: v1alpha1.LocalSecretKeyRef{Name: "wal-key", Key: "age"}},
				TargetTime: "2026-12-07T08:00:00.5Z"}}}}
		if mod != nil {
			mod(p)
		}
		return hooks.Object{Resource: toUnstructured(t, p)}
	}
	if _, err := h.Values.Values(ctx, pg(nil)); err == nil || !strings.Contains(err.Error(), "spec.bootstrap.recovery.store") || !strings.Contains(err.Error(), "not been checked") {
		t.Fatalf("a store not yet checked: %v, want a wait naming spec.bootstrap.recovery.store", err)
	}
	store.Status.Conditions = []metav1.Condition{{Type: v1alpha1.ConditionReady, Status: metav1.ConditionTrue, Reason: "Checked", Message: "ok",
		ObservedGeneration: store.Generation, LastTransitionTime: metav1.Now()}}
	if err := c.Status().Update(ctx, store); err != nil {
		t.Fatal(err)
	}
	vals, err := h.Values.Values(ctx, pg(nil))
	if err != nil {
		t.Fatalf("the recovery's values: %v", err)
	}
	b, _ := json.Marshal(vals["bootstrap"])
	want := `{"recovery":{"enabled":true,"prefix":"` + ns + `/orders/pg15",` +
		`"secretEnv":[{"key":"accessKeyID","name":"CHARTPILOT_S3_ACCESS_KEY_ID","secretName":"s3-keys"},` +
		`{"key":"secretAccessKey","name":"CHARTPILOT_S3_SECRET_ACCESS_KEY","secretName":"s3-keys"},` +
		`{"key":"age","name":"CHARTPILOT_AGE_KEY","secretName":"wal-key"}],` +
		`"storeArgs":["--store=s3","--s3-bucket=wal-bucket","--s3-endpoint=http://127.0.0.1:9","--s3-force-path-style"],` +
		`"targetLSN":"","targetTime":"2026-12-07T08:00:00.5Z","targetXID":""}}`
	if string(b) != want {
		t.Errorf("bootstrap values:\n got %s\nwant %s", b, want)
	}

	for _, tc := range []struct {
		name string
		mod  func(*v1alpha1.Postgres)
		want []string
	}{
		{"no failover", func(p *v1alpha1.Postgres) { p.Spec.Failover = nil }, []string{"spec.failover.enabled: true"}},
		{"its own archive", func(p *v1alpha1.Postgres) {
			p.Name = "orders"
			p.Spec.Backup = &v1alpha1.PostgresBackup{Store: v1alpha1.StoreRef{Name: "s3"}, WALArchive: &v1alpha1.PostgresWALArchive{}}
		}, []string{"is the one this Postgres would archive to", "spec.backup.walArchive.prefix"}},
		{"no store", func(p *v1alpha1.Postgres) { p.Spec.Bootstrap.Recovery.Store = nil }, []string{"spec.bootstrap.recovery.store: name the store"}},
		{"a dot segment", func(p *v1alpha1.Postgres) { p.Spec.Bootstrap.Recovery.Prefix = "team/../other" }, []string{"spec.bootstrap.recovery.prefix", "segment . or .."}},
	} {
		if _, err := h.Values.Values(ctx, pg(tc.mod)); err == nil || !containsAll(err.Error(), tc.want) {
			t.Errorf("%s: %v, want an error naming %q", tc.name, err, tc.want)
		}
	}

	// Completed, and then archiving to the archive it was made from.
	ownAfter := pg(func(p *v1alpha1.Postgres) {
		p.Status.Recovery = &v1alpha1.PostgresRecoveryStatus{Phase: v1alpha1.RecoveryCompleted}
		p.Spec.Backup = &v1alpha1.PostgresBackup{Store: v1alpha1.StoreRef{Name: "s3"}, WALArchive: &v1alpha1.PostgresWALArchive{Prefix: ns + "/orders"}}
	})
	if _, err := h.Values.Values(ctx, ownAfter); err == nil || !strings.Contains(err.Error(), "is the one this Postgres would archive to") {
		t.Errorf("a completed recovery, then walArchive.prefix of its source: %v, want it refused", err)
	}
	// Completed, then the store gone: no layer, no error.
	if err := c.Delete(ctx, store); err != nil {
		t.Fatal(err)
	}
	done := pg(func(p *v1alpha1.Postgres) {
		p.Status.Recovery = &v1alpha1.PostgresRecoveryStatus{Phase: v1alpha1.RecoveryCompleted}
	})
	if vals, err := h.Values.Values(ctx, done); err != nil || vals["bootstrap"] != nil {
		t.Errorf("a completed recovery, its store gone: values %v, %v; want none and no error", vals, err)
	}
	if _, err := h.Values.Values(ctx, pg(nil)); err == nil {
		t.Error("a recovery not yet completed, its store gone: no error")
	}
}

func containsAll(s string, subs []string) bool {
	for _, sub := range subs {
		if !strings.Contains(s, sub) {
			return false
		}
	}
	return true
}

// TestRecoveryRefusedByTheAPIServer: the API server refuses more than one
// target, a time that is not RFC 3339, spec.restore beside the recovery,
// and spec.bootstrap added to (or removed from) an existing Postgres.
func TestRecoveryRefusedByTheAPIServer(t *testing.T) {
	cluster.Skip(t)
	ctx := context.Background()
	c, err := client.New(cluster.Config, client.Options{Scheme: testScheme()})
	if err != nil {
		t.Fatal(err)
	}
	ns := cluster.Namespace(t)
	pg := func(name string, rec *v1alpha1.PostgresRecovery, mod func(*v1alpha1.Postgres)) *v1alpha1.Postgres {
		p := &v1alpha1.Postgres{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}, Spec: v1alpha1.PostgresSpec{Version: "15", Storage: v1alpha1.PostgresStorage{Size: "1Gi"}}}
		if rec != nil {
			p.Spec.Bootstrap = &v1alpha1.PostgresBootstrap{Recovery: rec}
		}
		if mod != nil {
			mod(p)
		}
		return p
	}
	for _, tc := range []struct {
		name string
		p    *v1alpha1.Postgres
		want string
	}{
		{"two targets", pg("a", &v1alpha1.PostgresRecovery{Source: "orders", TargetTime: "2026-12-07T08:00:00Z", TargetXID: "1234"}, nil), "at most one of targetTime"},
		{"not a time", pg("b", &v1alpha1.PostgresRecovery{Source: "orders", TargetTime: "2026-12-07 08:00"}, nil), "targetTime"},
		{"a comma", pg("c", &v1alpha1.PostgresRecovery{Source: "orders", TargetTime: "2026-12-07T08:00:00,5Z"}, nil), "targetTime"},
		{"with spec.restore", pg("d", &v1alpha1.PostgresRecovery{Source: "orders"}, func(p *v1alpha1.Postgres) {
			p.Spec.Restore = &v1alpha1.PostgresRestore{FromBackup: "nightly"}
		}), "spec.restore and spec.bootstrap.recovery"},
	} {
		if err := c.Create(ctx, tc.p); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want refused naming %q", tc.name, err, tc.want)
		}
	}
	plain := pg("plain", nil, nil)
	if err := c.Create(ctx, plain); err != nil {
		t.Fatal(err)
	}
	plain.Spec.Bootstrap = &v1alpha1.PostgresBootstrap{Recovery: &v1alpha1.PostgresRecovery{Source: "orders"}}
	if err := c.Update(ctx, plain); err == nil || !strings.Contains(err.Error(), "spec.bootstrap is fixed at creation") {
		t.Errorf("spec.bootstrap added later: %v, want it refused", err)
	}
	rec := pg("recovered", &v1alpha1.PostgresRecovery{Source: "orders", TargetTime: "2026-12-07T08:00:00.123456Z"}, nil)
	if err := c.Create(ctx, rec); err != nil {
		t.Fatalf("a recovery to a time with microseconds: %v", err)
	}
	rec.Spec.Bootstrap.Recovery.TargetTime = "2026-12-07T09:00:00Z"
	if err := c.Update(ctx, rec); err == nil || !strings.Contains(err.Error(), "fixed at creation") {
		t.Errorf("the target changed later: %v, want it refused", err)
	}
}
