package release

import (
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/runtime/schema"
)

func TestHoldsComparesWhatTheStoredObjectSets(t *testing.T) {
	live := map[string]any{
		"metadata":   map[string]any{"name": "x", "uid": "u", "labels": map[string]any{"a": "1", "extra": "2"}},
		"driverName": "csi.example",
		"parameters": map[string]any{"iops": "100"},
		"list":       []any{map[string]any{"n": int64(1), "defaulted": true}},
	}
	for _, tc := range []struct {
		stored map[string]any
		path   string
	}{
		{map[string]any{"metadata": map[string]any{"name": "x", "labels": map[string]any{"a": "1"}}, "driverName": "csi.example", "list": []any{map[string]any{"n": float64(1)}}}, ""},
		{map[string]any{"driverName": "other"}, "driverName"},
		{map[string]any{"parameters": map[string]any{"iops": "200"}}, "parameters.iops"},
		{map[string]any{"list": []any{map[string]any{"n": int64(1)}, map[string]any{"n": int64(2)}}}, "list"},
		{map[string]any{"renamed": "v"}, "renamed"},
	} {
		path, ok := holds(live, tc.stored)
		if ok != (tc.path == "") || path != tc.path {
			t.Errorf("holds(live, %v) = %q, %v; want %q", tc.stored, path, ok, tc.path)
		}
	}
}

func TestRewriteAPIVersionsChangesOnlyTheNamedKinds(t *testing.T) {
	manifest := `---
# Source: c/templates/vac.yaml
apiVersion: storage.k8s.io/v1beta1
kind: VolumeAttributesClass
metadata:
  name: fast
  annotations:
    note: "apiVersion: storage.k8s.io/v1beta1"
driverName: csi.example
---
# Source: c/templates/cm.yaml
apiVersion: v1
kind: ConfigMap
metadata:
  name: cm
data:
  apiVersion: storage.k8s.io/v1beta1
`
	from := schema.GroupVersionKind{Group: "storage.k8s.io", Version: "v1beta1", Kind: "VolumeAttributesClass"}
	to := map[schema.GroupVersionKind]schema.GroupVersionKind{from: from.GroupKind().WithVersion("v1")}
	out, err := rewriteAPIVersions(manifest, to)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out, "apiVersion: storage.k8s.io/v1\nkind: VolumeAttributesClass") {
		t.Errorf("the VolumeAttributesClass is not rewritten:\n%s", out)
	}
	if strings.Count(out, "storage.k8s.io/v1beta1") != 2 || !strings.Contains(out, "# Source: c/templates/vac.yaml") {
		t.Errorf("more than the apiVersion line changed, or the source comments went:\n%s", out)
	}
	if _, err := rewriteAPIVersions(`{"apiVersion": "storage.k8s.io/v1beta1", "kind": "VolumeAttributesClass", "metadata": {"name": "a"}}`, to); err == nil {
		t.Error("a document without a top-level apiVersion line (JSON) must be refused, not guessed at")
	}
}

func TestChangedByComparesAllButServerMetadata(t *testing.T) {
	live := map[string]any{
		"metadata": map[string]any{"name": "p", "resourceVersion": "1", "labels": map[string]any{"a": "1"}},
		"spec":     map[string]any{"selector": map[string]any{"matchExpressions": []any{map[string]any{"key": "k", "operator": "Exists"}}}},
		"status":   map[string]any{"x": int64(1)},
	}
	same := map[string]any{
		"metadata": map[string]any{"name": "p", "resourceVersion": "2", "managedFields": []any{"m"}, "labels": map[string]any{"a": "1"}},
		"spec":     map[string]any{"selector": map[string]any{"matchExpressions": []any{map[string]any{"key": "k", "operator": "Exists"}}}},
		"status":   map[string]any{"x": int64(2)},
	}
	if f := changedBy(live, same); f != "" {
		t.Errorf("resourceVersion, managedFields and status are the server's: got %q", f)
	}
	emptied := map[string]any{"metadata": live["metadata"], "spec": map[string]any{"selector": map[string]any{}}}
	if f := changedBy(live, emptied); f != "spec" {
		t.Errorf("an empty selector where the server held a match-nothing one: got %q, want spec", f)
	}
	relabelled := map[string]any{"metadata": map[string]any{"name": "p", "labels": map[string]any{"a": "2"}}, "spec": live["spec"]}
	if f := changedBy(live, relabelled); f != "metadata.labels" {
		t.Errorf("a label changed: got %q", f)
	}
}
