package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/chartpilot/chartpilot/internal/api/v1alpha1"
	backupdata "github.com/chartpilot/chartpilot/internal/backup"
	"github.com/chartpilot/chartpilot/internal/operator"
)

// TestRedisRestoredBeforeInstall: a Backup of a Redis (a passthrough kind)
// restored into a new Redis annotated chartpilot.dev/restore-from. The new
// Redis's install is held while the restore Job, as its identity, writes
// onto the claim its first pod will mount; once the Job completes with the
// Backup's checksum the release is installed and its StatefulSet adopts
// that claim (same UID), and Restored is True. The local cluster's pods
// are simulated, so the test plays the kubelet of the two Jobs' pods (their
// commands run against real redis-server in internal/controller/backup's tests).
func TestRedisRestoredBeforeInstall(t *testing.T) {
	e := setup(t, func(o *operator.Options) { o.BackupImage = "chartpilot:test" })
	ctx := context.Background()
	e.volumeStore("vol")
	e.apply(redisGVR, "Redis", "cache", map[string]any{"persistence": map[string]any{"enabled": true}})
	e.waitFor("Redis cache Ready", 3*time.Minute, func() (bool, string) { return ready(e.get(redisGVR, "cache")) })

	if err := cluster.Cordon(ctx, true); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cluster.Cordon(context.Background(), false) })
	e.apply(backupGVR, "Backup", "rb", map[string]any{"target": map[string]any{"kind": "Redis", "name": "cache"}, "store": map[string]any{"name": "vol"}})
	var backupJob string
	e.waitFor("the Backup's Job", 3*time.Minute, func() (bool, string) {
		backupJob, _, _ = unstructured.NestedString(e.get(backupGVR, "rb").Object, "status", "job")
		return backupJob != "", ""
	})
	sum := strings.Repeat("cd", 32)
	manifest, _ := json.Marshal(backupdata.Manifest{Format: backupdata.Format, Created: time.Now(), Size: 2048, SHA256: sum, PlainSize: 8192, Compression: "zstd"})
	e.endJobPod(backupJob, string(manifest))
	e.waitFor("Backup rb Completed", 3*time.Minute, func() (bool, string) {
		phase, _, _ := unstructured.NestedString(e.get(backupGVR, "rb").Object, "status", "phase")
		return phase == v1alpha1.BackupCompleted, phase
	})

	// The new Redis is held before its install while the restore runs.
	copyOf := &unstructured.Unstructured{Object: map[string]any{"apiVersion": "chartpilot.dev/v1alpha1", "kind": "Redis",
		"metadata": map[string]any{"name": "copy", "namespace": e.ns, "annotations": map[string]any{v1alpha1.AnnotationRestoreFrom: "rb"}},
		"spec":     map[string]any{"persistence": map[string]any{"enabled": true}}}}
	if _, err := e.dyn.Resource(redisGVR).Namespace(e.ns).Create(ctx, copyOf, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	e.waitCondition(redisGVR, "copy", v1alpha1.ConditionReconciling, metav1.ConditionTrue, "InstallBlocked")
	// The pass that creates the restore Job reported before it did
	// (RestorePending); the Job's event brings the next, which says Restoring.
	u := e.waitCondition(redisGVR, "copy", v1alpha1.ConditionRestored, metav1.ConditionFalse, "Restoring")
	if c := condition(u, v1alpha1.ConditionReconciling); c == nil || c.Reason != "InstallBlocked" {
		t.Errorf("Reconciling while the restore runs: %+v", c)
	}
	e.waitEvent("copy", "Restoring", "restores Backup rb")
	data, err := e.cs.CoreV1().PersistentVolumeClaims(e.ns).Get(ctx, "data-copy-0", metav1.GetOptions{})
	if err != nil {
		t.Fatalf("the claim of the first pod: %v", err)
	}
	jobs, err := e.cs.BatchV1().Jobs(e.ns).List(ctx, metav1.ListOptions{LabelSelector: v1alpha1.LabelRestoreInto + "=copy"})
	if err != nil || len(jobs.Items) != 1 {
		t.Fatalf("restore Jobs: %v %v", jobs, err)
	}
	if _, err := e.cs.AppsV1().StatefulSets(e.ns).Get(ctx, "copy", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Fatalf("the StatefulSet exists before the restore completed: %v", err)
	}
	if _, found, _ := unstructured.NestedMap(u.Object, "status", "release"); found {
		t.Fatal("a release was installed before the restore completed")
	}

	e.endJobPod(jobs.Items[0].Name, string(manifest))
	if err := cluster.Cordon(ctx, false); err != nil {
		t.Fatal(err)
	}
	e.waitFor("Redis copy Ready on the restored claim", 3*time.Minute, func() (bool, string) {
		ok, obs := ready(e.get(redisGVR, "copy"))
		return ok, obs
	})
	u = e.waitCondition(redisGVR, "copy", v1alpha1.ConditionRestored, metav1.ConditionTrue, "RestoreCompleted")
	if rev, _, _ := unstructured.NestedInt64(u.Object, "status", "release", "revision"); rev != 1 {
		t.Errorf("revision %d after the restore, want 1", rev)
	}
	after, err := e.cs.CoreV1().PersistentVolumeClaims(e.ns).Get(ctx, "data-copy-0", metav1.GetOptions{})
	if err != nil || after.UID != data.UID {
		t.Errorf("the StatefulSet's claim is not the restored one: %v (UID %s, restored %s)", err, after.GetUID(), data.UID)
	}
	pods, err := e.cs.CoreV1().Pods(e.ns).List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/instance=copy"})
	if err != nil || len(pods.Items) == 0 {
		t.Fatalf("pods of copy: %v", err)
	}
	mounted := false
	for _, v := range pods.Items[0].Spec.Volumes {
		mounted = mounted || (v.PersistentVolumeClaim != nil && v.PersistentVolumeClaim.ClaimName == "data-copy-0")
	}
	if !mounted {
		t.Errorf("pod %s does not mount data-copy-0: %s", pods.Items[0].Name, fmt.Sprint(pods.Items[0].Spec.Volumes))
	}
}
