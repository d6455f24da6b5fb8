package release

import (
	"context"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/workqueue"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/chartpilot/chartpilot/internal/api/v1alpha1"
	"github.com/chartpilot/chartpilot/internal/watches"
)

// deployment is a Deployment of a release owned by Webapp ns/app, of
// generation 2, with the given status.
func deployment(st map[string]any, annotations map[string]string) *unstructured.Unstructured {
	a := map[string]any{v1alpha1.AnnotationOwner: "Webapp.test.chartpilot.dev/ns/app"}
	for k, v := range annotations {
		a[k] = v
	}
	return &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "apps/v1", "kind": "Deployment",
		"metadata": map[string]any{"name": "app", "namespace": "ns", "generation": int64(2), "resourceVersion": "1", "annotations": a},
		"spec":     map[string]any{"replicas": int64(2)},
		"status":   st,
	}}
}

// TestSettlingReleaseWakesOnKstatusChanges: while the health gate waits,
// a status update of one of the release's objects wakes the release only
// when kstatus reads the object differently (the gate's answer can
// change), or its annotations changed; a replica count on the way does not.
func TestSettlingReleaseWakesOnKstatusChanges(t *testing.T) {
	r := &Reconciler{Watch: watches.Watch{GVK: schema.GroupVersionKind{Group: "test.chartpilot.dev", Version: "v1alpha1", Kind: "Webapp"}}}
	key := types.NamespacedName{Namespace: "ns", Name: "app"}
	r.mem.with(key, func(m *memo) { m.awaiting = true })
	progressing := func(ready int64) map[string]any {
		st := map[string]any{"observedGeneration": int64(2), "replicas": int64(2), "updatedReplicas": int64(2), "readyReplicas": ready, "availableReplicas": ready}
		if ready == 2 {
			st["conditions"] = []any{
				map[string]any{"type": "Available", "status": "True", "reason": "MinimumReplicasAvailable"},
				map[string]any{"type": "Progressing", "status": "True", "reason": "NewReplicaSetAvailable"},
			}
		}
		return st
	}
	failed := progressing(1)
	failed["conditions"] = []any{map[string]any{"type": "Progressing", "status": "False", "reason": "ProgressDeadlineExceeded"}}
	for name, c := range map[string]struct {
		old, new *unstructured.Unstructured
		wake     bool
	}{
		"a replica on the way":       {deployment(progressing(0), nil), deployment(progressing(1), nil), false},
		"all ready: Current":         {deployment(progressing(1), nil), deployment(progressing(2), nil), true},
		"past its deadline: Failed":  {deployment(progressing(1), nil), deployment(failed, nil), true},
		"an annotation changed":      {deployment(progressing(1), nil), deployment(progressing(1), map[string]string{"x": "y"}), true},
		"back from Current":          {deployment(progressing(2), nil), deployment(progressing(1), nil), true},
		"no change, once more ready": {deployment(progressing(2), nil), deployment(progressing(2), nil), false},
	} {
		t.Run(name, func(t *testing.T) {
			q := workqueue.NewTypedRateLimitingQueue(workqueue.DefaultTypedControllerRateLimiter[reconcile.Request]())
			defer q.ShutDown()
			c.new.SetResourceVersion("2")
			wiring{r}.dependentHandler().Update(context.Background(), event.TypedUpdateEvent[client.Object]{ObjectOld: c.old, ObjectNew: c.new}, q)
			if got := q.Len() == 1; got != c.wake {
				t.Errorf("woke the release: %v, want %v (old %s, new %s)", got, c.wake, kstatusOf(c.old), kstatusOf(c.new))
			}
		})
	}
}
