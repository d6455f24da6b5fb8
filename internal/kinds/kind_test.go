package kinds

import (
	"errors"
	"slices"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/chartpilot/chartpilot/internal/hooks"
)

func TestGenericFacts(t *testing.T) {
	for _, tc := range []struct {
		name string
		vals map[string]any
		want hooks.Facts
	}{
		{"empty", map[string]any{}, hooks.Facts{}},
		{"replicas and storage", map[string]any{"replicas": int64(3), "storage": map[string]any{"size": "2Gi", "storageClass": "fast"}},
			hooks.Facts{Replicas: 3, StorageBytes: 2 << 30, StorageClass: "fast", StorageClassPath: []string{"storage", "storageClass"}}},
		{"replicaCount, disabled persistence not counted", map[string]any{"replicaCount": 2.0, "persistence": map[string]any{"enabled": false, "size": "8Gi"}},
			hooks.Facts{Replicas: 2}},
		{"limits win over requests", map[string]any{"resources": map[string]any{
			"requests": map[string]any{"cpu": "100m", "memory": "64Mi"},
			"limits":   map[string]any{"cpu": 2, "memory": "1Gi"},
		}}, hooks.Facts{CPUMilli: 2000, MemoryBytes: 1 << 30}},
		{"scheduling", map[string]any{"priorityClassName": "high", "tolerations": []any{map[string]any{"key": "gpu", "operator": "Exists"}, map[string]any{"operator": "Exists"}},
			"nodeSelector": map[string]any{"pool": "db"}, "affinity": map[string]any{}},
			hooks.Facts{PriorityClassName: "high", TolerationKeys: []string{"gpu", ""}, NodePlacement: []string{"nodeSelector"}}},
	} {
		got := GenericFacts(nil, tc.vals)
		if got.Replicas != tc.want.Replicas || got.StorageBytes != tc.want.StorageBytes || got.StorageClass != tc.want.StorageClass ||
			len(got.StorageClassPath) != len(tc.want.StorageClassPath) || got.CPUMilli != tc.want.CPUMilli || got.MemoryBytes != tc.want.MemoryBytes ||
			got.PriorityClassName != tc.want.PriorityClassName || !slices.Equal(got.TolerationKeys, tc.want.TolerationKeys) || !slices.Equal(got.NodePlacement, tc.want.NodePlacement) {
			t.Errorf("%s: GenericFacts = %+v, want %+v", tc.name, got, tc.want)
		}
	}
}

func TestObject(t *testing.T) {
	obj := &unstructured.Unstructured{Object: map[string]any{"spec": map[string]any{"replicas": int64(4)}}}
	hobj, vals, err := Kind{}.Object(obj, "webapp", "1.2.3")
	if err != nil || hobj.Facts.Replicas != 4 || hobj.ChartName != "webapp" || hobj.ChartVersion != "1.2.3" || hobj.Resource != obj || vals["replicas"] != int64(4) {
		t.Fatalf("passthrough Object = %+v, %v, %v", hobj, vals, err)
	}
	typed := Kind{
		Values: func(*unstructured.Unstructured) (map[string]any, error) { return map[string]any{"x": 1}, nil },
		Facts: func(_ *unstructured.Unstructured, v map[string]any) hooks.Facts {
			return hooks.Facts{Replicas: int64(len(v)) + 10}
		},
	}
	if !typed.Typed() || (Kind{}).Typed() {
		t.Error("Typed() should tell a kind with a translator from a passthrough kind")
	}
	if hobj, _, _ := typed.Object(obj, "", ""); hobj.Facts.Replicas != 11 {
		t.Errorf("typed kind's facts not used: %+v", hobj.Facts)
	}
	bad := Kind{Values: func(*unstructured.Unstructured) (map[string]any, error) {
		return nil, errors.New("spec.version: not a number")
	}}
	if _, _, err := bad.Object(obj, "", ""); err == nil {
		t.Error("a translator's error must come back")
	}
}
