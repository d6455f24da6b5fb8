package release_test

import (
	"context"
	"fmt"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/chartpilot/chartpilot/internal/api/v1alpha1"
	"github.com/chartpilot/chartpilot/internal/watches"
)

// The manager's cache holds the watched resources compacted, without
// managed fields, and every read through the manager's client gets them
// whole.
func TestCachedResourcesReadWhole(t *testing.T) {
	e := newEnv(t)
	mgr, _ := startManager(t, cluster.Config, []watches.Watch{webappWatch(t)})
	e.create("whole", map[string]any{"message": "kept"}, nil, nil)
	e.waitCondition("whole", v1alpha1.ConditionReady, metav1.ConditionTrue, "")
	ctx := context.Background()
	key := client.ObjectKey{Namespace: e.ns, Name: "whole"}
	e.waitFor("the manager's client to read whole Ready", func() (bool, string) {
		u := &unstructured.Unstructured{}
		u.SetGroupVersionKind(webappGVK)
		if err := mgr.GetClient().Get(ctx, key, u); err != nil {
			return false, err.Error()
		}
		c := condition(u, v1alpha1.ConditionReady)
		return c != nil && c.Status == metav1.ConditionTrue, fmt.Sprint(u.Object["status"])
	})

	raw := &unstructured.Unstructured{}
	raw.SetGroupVersionKind(webappGVK)
	if err := mgr.GetCache().Get(ctx, key, raw); err != nil {
		t.Fatal(err)
	}
	compacted := false
	for k, v := range raw.Object {
		if s, ok := v.(string); ok && k != "apiVersion" && k != "kind" && strings.Contains(s, `"message":"kept"`) {
			compacted = true
		}
	}
	if !compacted {
		t.Errorf("the cache does not hold the resource's body as JSON: %v", raw.Object)
	}
	if _, ok := raw.Object["spec"]; ok {
		t.Error("the cache holds the spec decoded")
	}
	if len(raw.GetManagedFields()) != 0 {
		t.Error("the cache holds managed fields")
	}

	list := &unstructured.UnstructuredList{}
	list.SetGroupVersionKind(webappGVK.GroupVersion().WithKind("WebappList"))
	if err := mgr.GetClient().List(ctx, list, client.InNamespace(e.ns)); err != nil {
		t.Fatal(err)
	}
	if len(list.Items) != 1 {
		t.Fatalf("listed %d resources, want 1", len(list.Items))
	}
	u := &list.Items[0]
	if msg, _, _ := unstructured.NestedString(u.Object, "spec", "message"); msg != "kept" {
		t.Errorf("listed spec.message = %q, want kept", msg)
	}
	if len(u.Object) != len(raw.Object)+1 { // spec and status for the JSON
		t.Errorf("listed resource's fields: %v", u.Object)
	}
	if c := condition(u, v1alpha1.ConditionReady); c == nil || c.Status != metav1.ConditionTrue {
		t.Errorf("listed status: %v", u.Object["status"])
	}
}
