package release

import (
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/chartpilot/chartpilot/internal/api/v1alpha1"
)

// A status write carries the conditions other controllers own as the
// object patched has them: an older Anomalous in the status the pass
// started from (an owed one) is not written back, and one the object
// has is not dropped.
func TestStatusKeepsConditionsOwnedElsewhere(t *testing.T) {
	base := &unstructured.Unstructured{Object: map[string]any{"status": map[string]any{"conditions": []any{
		map[string]any{"type": v1alpha1.ConditionReady, "status": "False"},
		map[string]any{"type": v1alpha1.ConditionAnomalous, "status": "True", "reason": "RestartsAboveNormal"},
		map[string]any{"type": v1alpha1.ConditionStorageAutoExpand, "status": "True"},
	}}}}
	raw := map[string]any{"conditions": []any{
		map[string]any{"type": v1alpha1.ConditionReady, "status": "True"},
		map[string]any{"type": v1alpha1.ConditionAnomalous, "status": "False", "reason": "WithinNormal"},
	}}
	got := mergedStatus(base, raw, nil)["conditions"].([]any)
	want := map[string]string{v1alpha1.ConditionReady: "True", v1alpha1.ConditionAnomalous: "True", v1alpha1.ConditionStorageAutoExpand: "True"}
	if len(got) != len(want) {
		t.Fatalf("conditions written: %v", got)
	}
	for _, c := range got {
		m := c.(map[string]any)
		if want[m["type"].(string)] != m["status"] {
			t.Errorf("condition %v written, want status %s", m, want[m["type"].(string)])
		}
	}
}
