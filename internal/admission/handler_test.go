package admission

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	admissionv1 "k8s.io/api/admission/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"
)

func request(t *testing.T, oldAnn, newAnn map[string]string) admission.Request {
	t.Helper()
	raw := func(ann map[string]string) []byte {
		b, err := json.Marshal(map[string]any{
			"apiVersion": "chartpilot.dev/v1alpha1", "kind": "Redis",
			"metadata": map[string]any{"name": "r", "namespace": "ns", "annotations": ann},
			"spec":     map[string]any{"replicas": 1},
		})
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	req := admission.Request{AdmissionRequest: admissionv1.AdmissionRequest{
		Kind:   metav1.GroupVersionKind{Group: "chartpilot.dev", Version: "v1alpha1", Kind: "Redis"},
		Object: runtime.RawExtension{Raw: raw(newAnn)},
	}}
	if oldAnn != nil {
		req.OldObject = runtime.RawExtension{Raw: raw(oldAnn)}
	}
	return req
}

func TestHandlerChecksPolicyAnnotations(t *testing.T) {
	h := &Handler{Kinds: map[schema.GroupVersionKind]Kind{{Group: "chartpilot.dev", Version: "v1alpha1", Kind: "Redis"}: {}}}
	ctx := context.Background()
	for _, tc := range []struct {
		name     string
		old, new map[string]string
		denied   string
	}{
		{name: "valid on create", new: map[string]string{"chartpilot.dev/chart-version": "~1.4", "chartpilot.dev/maintenance-window": "Sat 02:00-04:00 UTC", "chartpilot.dev/allow-major-upgrade": "2"}},
		{name: "bad constraint", new: map[string]string{"chartpilot.dev/chart-version": "one"}, denied: "annotation chartpilot.dev/chart-version"},
		{name: "bad window", new: map[string]string{"chartpilot.dev/maintenance-window": "weekends"}, denied: "annotation chartpilot.dev/maintenance-window"},
		{name: "bad major", old: map[string]string{}, new: map[string]string{"chartpilot.dev/allow-major-upgrade": "two"}, denied: "annotation chartpilot.dev/allow-major-upgrade"},
		// An invalid annotation that is not changed does not block other
		// metadata updates (the operator's finalizer patch).
		{name: "unchanged invalid", old: map[string]string{"chartpilot.dev/chart-version": "one"}, new: map[string]string{"chartpilot.dev/chart-version": "one", "x": "y"}},
	} {
		resp := h.Handle(ctx, request(t, tc.old, tc.new))
		switch {
		case tc.denied == "" && !resp.Allowed:
			t.Errorf("%s: denied: %s", tc.name, resp.Result.Message)
		case tc.denied != "" && (resp.Allowed || !strings.Contains(resp.Result.Message, tc.denied)):
			t.Errorf("%s: allowed=%v message %q, want a denial naming %q", tc.name, resp.Allowed, resp.Result.Message, tc.denied)
		}
	}
}

// A created or spec-changed resource over the size limit is refused, naming
// the sizes and the flag; a metadata change of one is not (its finalizer
// must always come off).
func TestHandlerBoundsObjectSize(t *testing.T) {
	h := &Handler{Kinds: map[schema.GroupVersionKind]Kind{{Group: "chartpilot.dev", Version: "v1alpha1", Kind: "Redis"}: {}}, MaxObjectSize: 4 << 10}
	obj := func(spec string, ann map[string]string) []byte {
		b, _ := json.Marshal(map[string]any{"apiVersion": "chartpilot.dev/v1alpha1", "kind": "Redis",
			"metadata": map[string]any{"name": "r", "namespace": "ns", "annotations": ann}, "spec": map[string]any{"config": spec}})
		return b
	}
	big := strings.Repeat("x", 8<<10)
	req := func(old, new []byte) admission.Request {
		return admission.Request{AdmissionRequest: admissionv1.AdmissionRequest{
			Kind:   metav1.GroupVersionKind{Group: "chartpilot.dev", Version: "v1alpha1", Kind: "Redis"},
			Object: runtime.RawExtension{Raw: new}, OldObject: runtime.RawExtension{Raw: old},
		}}
	}
	ctx := context.Background()
	if resp := h.Handle(ctx, req(nil, obj(big, nil))); resp.Allowed || !strings.Contains(resp.Result.Message, "at most 4 KiB") || !strings.Contains(resp.Result.Message, "--max-resource-size") {
		t.Errorf("an 8 KiB create under a 4 KiB limit: allowed=%v %q", resp.Allowed, resp.Result.Message)
	}
	if resp := h.Handle(ctx, req(obj("small", nil), obj(big, nil))); resp.Allowed {
		t.Error("a spec grown over the limit was allowed")
	}
	if resp := h.Handle(ctx, req(obj(big, nil), obj(big, map[string]string{"a": "b"}))); !resp.Allowed {
		t.Errorf("a metadata change of an oversized resource was refused: %q", resp.Result.Message)
	}
	if resp := h.Handle(ctx, req(nil, obj("small", nil))); !resp.Allowed {
		t.Errorf("a small create was refused: %q", resp.Result.Message)
	}
}
