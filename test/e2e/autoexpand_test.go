package e2e

import (
	"context"
	"fmt"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/chartpilot/chartpilot/internal/api/v1alpha1"
	"github.com/chartpilot/chartpilot/internal/operator"
)

// mi is the unit of the volume statistics the test sets (whole percentages).
const mi = uint64(1 << 20)

// TestStorageAutoExpands: volume use comes from the kubelets' statistics
// (served for the local cluster's nodes and read through the API server's
// node proxy). Above the threshold a Postgres grows one step and no more
// within its window; a Redis (annotation form) grows too; a resource at
// its maximum, and one whose tenant's limit would be passed, stay as they
// are with StorageAutoExpand=False and a warning.
func TestStorageAutoExpands(t *testing.T) {
	e := setup(t, func(o *operator.Options) { o.VolumeStatsInterval = time.Second })
	ctx := context.Background()
	ks, err := cluster.ServeKubeletStats(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(ks.Stop)
	limited := e.newNamespace()
	limited.tenant("limited-"+limited.ns, map[string]any{
		"namespaces": []any{limited.ns},
		"limits":     map[string]any{"maxStorage": "1536Mi"},
	})

	autoExpand := func(max string) map[string]any {
		return map[string]any{"enabled": true, "max": max, "window": "1h"}
	}
	e.apply(postgresGVR, "Postgres", "auto", map[string]any{
		"version": "17", "storage": map[string]any{"size": "1Gi", "autoExpand": autoExpand("3Gi")},
	})
	e.apply(postgresGVR, "Postgres", "capped", map[string]any{
		"version": "17", "storage": map[string]any{"size": "1Gi", "autoExpand": autoExpand("1Gi")},
	})
	limited.apply(postgresGVR, "Postgres", "limited", map[string]any{
		"version": "17", "storage": map[string]any{"size": "1Gi", "autoExpand": autoExpand("4Gi")},
	})
	redis := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "chartpilot.dev/v1alpha1", "kind": "Redis",
		"metadata": map[string]any{"name": "cache", "namespace": e.ns, "annotations": map[string]any{v1alpha1.AnnotationAutoExpand: "max=2Gi,threshold=75"}},
		"spec":     map[string]any{"persistence": map[string]any{"enabled": true, "size": "1Gi"}},
	}}
	if _, err := e.dyn.Resource(redisGVR).Namespace(e.ns).Create(ctx, redis, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	type res struct {
		e    *env
		gvr  schema.GroupVersionResource
		name string
	}
	all := []res{{e, postgresGVR, "auto"}, {e, postgresGVR, "capped"}, {limited, postgresGVR, "limited"}, {e, redisGVR, "cache"}}
	for _, r := range all {
		r.e.waitFor(r.name+" Ready and watching its volume", 3*time.Minute, func() (bool, string) {
			u := r.e.get(r.gvr, r.name)
			ok, obs := ready(u)
			if !ok {
				return false, obs
			}
			// The pod is scheduled once the release is Ready.
			if err := ks.SetVolume(ctx, r.e.ns, r.name+"-0", "data-"+r.name+"-0", 40*mi, 100*mi); err != nil {
				return false, err.Error()
			}
			c := condition(u, v1alpha1.ConditionStorageAutoExpand)
			return c != nil && c.Status == metav1.ConditionTrue && c.Reason == "Watching", fmt.Sprintf("StorageAutoExpand %v", c)
		})
	}
	if used, _, _ := unstructured.NestedInt64(e.get(postgresGVR, "auto").Object, "status", "storage", "usedPercent"); used != 40 {
		t.Errorf("status.storage.usedPercent = %d, want 40", used)
	}

	// 85% used: each grows one step where it may.
	for _, r := range all {
		if err := ks.SetVolume(ctx, r.e.ns, r.name+"-0", "data-"+r.name+"-0", 85*mi, 100*mi); err != nil {
			t.Fatal(err)
		}
	}
	sizeOf := func(r res) string {
		path := []string{"spec", "storage", "size"}
		if r.gvr == redisGVR {
			path = []string{"spec", "persistence", "size"}
		}
		s, _, _ := unstructured.NestedString(r.e.get(r.gvr, r.name).Object, path...)
		return s
	}
	for _, r := range []res{all[0], all[3]} {
		r.e.waitFor(r.name+" grown to 2Gi and resized", 4*time.Minute, func() (bool, string) {
			u := r.e.get(r.gvr, r.name)
			ok, obs := ready(u)
			sizes := r.e.claimSizes("data-" + r.name + "-")
			return ok && sizeOf(r) == "2Gi" && allSized(sizes, 1, "2Gi"), fmt.Sprintf("%s; size %s; claims %v", obs, sizeOf(r), sizes)
		})
		r.e.waitEvent(r.name, "StorageAutoExpanded", "1Gi → 2Gi")
	}
	last, _, _ := unstructured.NestedMap(e.get(postgresGVR, "auto").Object, "status", "storage", "lastExpansion")
	if last["from"] != "1Gi" || last["to"] != "2Gi" || last["usedPercent"] != int64(85) {
		t.Errorf("status.storage.lastExpansion = %v, want 1Gi → 2Gi at 85%%", last)
	}
	e.waitCondition(postgresGVR, "capped", v1alpha1.ConditionStorageAutoExpand, metav1.ConditionFalse, "AtMaximum")
	e.waitEvent("capped", "StorageAutoExpandAtMaximum", "maximum 1Gi")
	limited.waitCondition(postgresGVR, "limited", v1alpha1.ConditionStorageAutoExpand, metav1.ConditionFalse, "LimitReached")
	limited.waitEvent("limited", "StorageAutoExpandLimitReached", "1536Mi")

	// Still above the threshold (the kubelet still says 85% of the old
	// capacity): no second step within the window, and none past a maximum
	// or a limit.
	// Five seconds: five looks at each.
	if ok, s := e.holds(5*time.Second, func() (bool, string) { s := sizeOf(all[0]); return s == "2Gi", s }); !ok {
		t.Errorf("auto grew again within its window: %s", s)
	}
	e.waitCondition(postgresGVR, "auto", v1alpha1.ConditionStorageAutoExpand, metav1.ConditionTrue, "Waiting")
	for _, r := range []res{all[1], all[2]} {
		if s := sizeOf(r); s != "1Gi" {
			t.Errorf("%s grew past its maximum or its tenant's limit: %s", r.name, s)
		}
	}
}
