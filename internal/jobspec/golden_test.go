package jobspec

import (
	"bytes"
	"flag"
	"os"
	"path/filepath"
	"testing"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/yaml"

	"github.com/chartpilot/chartpilot/internal/api/v1alpha1"
	"github.com/chartpilot/chartpilot/internal/watches"
)

var update = flag.Bool("update", false, "write the golden files from what the builders make")

// Inputs of the golden Jobs: a Postgres 15 placed on tainted nodes, with
// an encrypted, compressed, retained backup to an S3 store with a CA, TLS
// to its server; a scheduled Backup of it; a passthrough kind (redis)
// whose backup block names its placement's values.
func goldenInputs() (pg *v1alpha1.Postgres, b *v1alpha1.Backup, st v1alpha1.BackupStoreSpec, u *unstructured.Unstructured, block *watches.Backup) {
	pg = &v1alpha1.Postgres{ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "orders", UID: types.UID("0f0e0d0c-0000-1111-2222-333344445555")}}
	pg.Spec.Version = "15"
	pg.Spec.NodeSelector = map[string]string{"pool": "databases"}
	pg.Spec.Tolerations = []corev1.Toleration{{Key: "databases", Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoSchedule}}
	key := &v1alpha1.BackupEncryption{KeySecretRef: v1alpha1.LocalSecretKeyRef{Name: "orders-age", Key: "identity"}}
	pg.Spec.Backup = &v1alpha1.PostgresBackup{Compression: "zstd", Encryption: key,
		Retention: &v1alpha1.BackupRetention{Count: 7, MaxAge: &metav1.Duration{Duration: 30 * 24 * time.Hour}}}
	pg.Spec.Restore = &v1alpha1.PostgresRestore{FromBackup: "nightly-20261203"}
	pg.Status.Endpoints = &v1alpha1.PostgresEndpoints{ReadWrite: "orders", ReadOnly: "orders-ro", Secret: "orders-auth", Port: 5432, CASecret: "orders-tls"}
	b = &v1alpha1.Backup{ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "nightly-20261203", UID: types.UID("ab12cd34-0000-1111-2222-333344445555"),
		Labels: map[string]string{v1alpha1.LabelScheduledBy: "orders"}}}
	b.Spec.Target = v1alpha1.BackupTarget{Kind: "Postgres", Name: "orders"}
	b.Status.Location, b.Status.SHA256, b.Status.Size = "shop/postgres/orders/scheduled/20261203T020000Z-nightly-20261203-ab12cd34", "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08", 123456789
	st = v1alpha1.BackupStoreSpec{S3: &v1alpha1.S3Store{Bucket: "backups", Endpoint: "https://s3.example.test", Region: "eu-1", ForcePathStyle: true, Prefix: "team-a",
		CredentialsSecretRef: v1alpha1.SecretRef{Name: "s3-creds"}, CASecretRef: &v1alpha1.SecretKeyRef{Name: "s3-ca", Key: "ca.crt"}}}
	u = &unstructured.Unstructured{Object: map[string]any{"apiVersion": "chartpilot.dev/v1alpha1", "kind": "Redis",
		"metadata": map[string]any{"namespace": "shop", "name": "cache", "uid": "77aa88bb-0000-1111-2222-333344445555"},
		"spec":     map[string]any{"nodeSelector": map[string]any{"pool": "cache"}, "tolerations": []any{map[string]any{"key": "cache", "operator": "Exists", "effect": "NoSchedule"}}}}}
	block = &watches.Backup{Image: "redis:7.4", Command: []string{"sh", "-c", "redis-cli --rdb -"},
		Env:               []watches.BackupEnv{{Name: "REDISCLI_AUTH", Secret: "{name}-auth", Key: "password"}},
		NodeSelectorValue: "nodeSelector", TolerationsValue: "tolerations",
		Restore: &watches.BackupRestore{Command: []string{"sh", "-c", "cat > /data/dump.rdb"}, Claim: "data-{name}-0", MountPath: "/data"}}
	return pg, b, st, u, block
}

// threeReady is pg with three pods ready, the primary on the first: a
// base backup is taken from the last.
func threeReady(pg *v1alpha1.Postgres) *v1alpha1.Postgres {
	pg = pg.DeepCopy()
	three := int32(3)
	pg.Spec.Replicas, pg.Status.ReadyReplicas, pg.Status.Primary = &three, 3, "orders-0"
	return pg
}

// TestGoldenJobs: every Job chartpilot creates, as its builder makes it
// from the golden inputs, is what testdata holds (go test -update
// rewrites them; review the diff).
func TestGoldenJobs(t *testing.T) {
	pg, b, st, u, block := goldenInputs()
	images := Images{Agent: "ghcr.io/chartpilot/chartpilot:v0.1.0", Postgres: "postgres"}
	spec := func(p []string) (any, bool) {
		v, ok, _ := unstructured.NestedFieldNoCopy(u.Object, append([]string{"spec"}, p...)...)
		return v, ok
	}
	for name, job := range map[string]*batchv1.Job{
		"postgres-backup": PostgresBackup{Backup: b, Target: pg, Store: st, Name: "backup-nightly-20261203-1a2b3c4d", Location: b.Status.Location,
			Scheduled: true, Images: images, Deadline: 6 * time.Hour}.Job(),
		"postgres-restore": PostgresRestore{Target: pg, Store: st, Name: "restore-orders-5e6f7a8b", Location: b.Status.Location, SHA256: b.Status.SHA256,
			Size: b.Status.Size, Key: pg.Spec.Backup.Encryption, Images: images, Deadline: 6 * time.Hour}.Job(),
		"postgres-drill": Drill{Backup: b, Target: pg, Store: st, Name: "verify-orders-202612030400", Images: images, Deadline: 6 * time.Hour}.Job(),
		"postgres-major-upgrade": MajorUpgrade{Target: pg, To: "17", Name: "orders-major-17", Claim: "data-pg17-orders-0", MarkMoved: true,
			Images: images, Deadline: 6 * time.Hour}.Job(),
		"postgres-base-backup": PostgresBaseBackup{Backup: b, Target: threeReady(pg), Store: st, Prefix: "shop/orders/pg15", Name: "backup-base-1a2b3c4d",
			Location: "shop/orders/pg15/base/20261203T020000Z-base-ab12cd34", Images: images, Deadline: 6 * time.Hour}.Job(),
		"postgres-wal-prune": WALPrune{Target: pg, Store: st, Prefix: "shop/orders/pg15", Name: "orders-prune-202612030100", Window: "7d",
			AgentImage: images.Agent, Deadline: time.Hour}.Job(),
		"passthrough-backup": PassthroughBackup{Backup: b, Target: u, Block: block, Store: st, Name: "backup-nightly-20261203-1a2b3c4d",
			Location: "shop/redis/cache/x", AgentImage: images.Agent, Deadline: time.Hour}.Job(),
		"passthrough-restore": PassthroughRestore{Target: u, Block: block, Backup: b, Store: st, Name: "restore-cache-9c0d1e2f", Claim: "data-cache-0",
			AgentImage: images.Agent, Deadline: time.Hour, Values: spec}.Job(),
	} {
		got, err := yaml.Marshal(job)
		if err != nil {
			t.Fatal(err)
		}
		path := filepath.Join("testdata", name+".yaml")
		if *update {
			if err := os.WriteFile(path, got, 0o644); err != nil {
				t.Fatal(err)
			}
			continue
		}
		want, err := os.ReadFile(path)
		if err != nil {
			t.Fatalf("%v (go test -update writes it)", err)
		}
		if !bytes.Equal(got, want) {
			t.Errorf("the %s Job differs from %s (go test -update rewrites it; review the diff):\n%s", name, path, got)
		}
	}
}
