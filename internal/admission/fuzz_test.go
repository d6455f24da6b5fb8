package admission

import (
	"context"
	"testing"

	admissionv1 "k8s.io/api/admission/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	"github.com/chartpilot/chartpilot/internal/hooks"
	"github.com/chartpilot/chartpilot/internal/kinds/postgres"
)

// FuzzHandle: any admission request is answered (allowed, denied or an
// error answer); the handler never panics.
func FuzzHandle(f *testing.F) {
	f.Add([]byte(`{"apiVersion":"chartpilot.dev/v1alpha1","kind":"Postgres","metadata":{"name":"db","namespace":"ns","annotations":{"chartpilot.dev/chart-version":"~1"}},"spec":{"version":"17","storage":{"size":"1Gi"}}}`), []byte(nil))
	f.Add([]byte(`{"metadata":{"deletionTimestamp":"2026-01-01T00:00:00Z"}}`), []byte(`{}`))
	f.Add([]byte(`not json`), []byte(`[]`))
	refuseAll := &hooks.Hook{Name: "refuse", Validator: hooks.ValidateFunc(func(context.Context, hooks.Object) error { return hooks.Reject("No", "no") })}
	gvk := schema.GroupVersionKind{Group: "chartpilot.dev", Version: "v1alpha1", Kind: "Postgres"}
	h := &Handler{Kinds: map[schema.GroupVersionKind]Kind{gvk: {Kind: postgres.Kind(), Hooks: []*hooks.Hook{refuseAll}}}}
	f.Fuzz(func(t *testing.T, object, old []byte) {
		req := admission.Request{AdmissionRequest: admissionv1.AdmissionRequest{
			Kind:      metav1.GroupVersionKind{Group: gvk.Group, Version: gvk.Version, Kind: gvk.Kind},
			Object:    runtime.RawExtension{Raw: object},
			OldObject: runtime.RawExtension{Raw: old},
		}}
		resp := h.Handle(context.Background(), req)
		if resp.Allowed && resp.Result != nil && resp.Result.Code >= 400 {
			t.Fatalf("allowed with code %d", resp.Result.Code)
		}
	})
}
