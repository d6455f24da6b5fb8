// Package admission is chartpilot's validating admission webhook: a resource
// of a watched kind that its hooks refuse (a tenant limit, say) is rejected
// at create or spec change, with the hook's message naming the limit and the
// value. The same checks run again before every Helm action.
package admission

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"

	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	"github.com/chartpilot/chartpilot/internal/api/v1alpha1"
	"github.com/chartpilot/chartpilot/internal/hooks"
	"github.com/chartpilot/chartpilot/internal/kinds"
	"github.com/chartpilot/chartpilot/internal/policy"
)

// Path is where the webhook is served.
const Path = "/validate-chartpilot"

// Kind is what the handler needs of one watched kind.
type Kind struct {
	Kind  kinds.Kind
	Hooks []*hooks.Hook
	// Chart names the chart and the version a new resource would get.
	Chart func() (name, version string)
}

// DefaultMaxObjectSize bounds a watched resource at admission: its spec
// lands in the release record twice (values and rendered manifest), which
// must fit in a Secret's 1 MiB.
const DefaultMaxObjectSize = 256 << 10

// Handler validates resources of the watched kinds.
type Handler struct {
	Kinds map[schema.GroupVersionKind]Kind
	// MaxObjectSize bounds a created or spec-changed resource, in bytes of
	// JSON (0: DefaultMaxObjectSize).
	MaxObjectSize int
	// StorageClasses reads StorageClasses for the growth checks of typed
	// kinds' volumes (nil: not checked here; the reconciler still refuses).
	StorageClasses client.Reader
}

func (h *Handler) maxObjectSize() int {
	if h.MaxObjectSize > 0 {
		return h.MaxObjectSize
	}
	return DefaultMaxObjectSize
}

var _ admission.Handler = (*Handler)(nil)

// Handle admits or denies one request.
func (h *Handler) Handle(ctx context.Context, req admission.Request) admission.Response {
	gvk := schema.GroupVersionKind{Group: req.Kind.Group, Version: req.Kind.Version, Kind: req.Kind.Kind}
	k, ok := h.Kinds[gvk]
	if !ok {
		return admission.Allowed("")
	}
	obj := &unstructured.Unstructured{}
	if err := json.Unmarshal(req.Object.Raw, &obj.Object); err != nil {
		return admission.Errored(http.StatusBadRequest, fmt.Errorf("decoding %s: %w", gvk.Kind, err))
	}
	if obj.GetDeletionTimestamp() != nil {
		return admission.Allowed("being deleted")
	}
	if policyAnnotationsChanged(req.OldObject.Raw, obj) {
		if err := policy.ValidateAnnotations(obj.GetAnnotations()); err != nil {
			return admission.Denied(err.Error())
		}
	}
	var old *unstructured.Unstructured
	if len(req.OldObject.Raw) > 0 {
		old = &unstructured.Unstructured{}
		if err := json.Unmarshal(req.OldObject.Raw, &old.Object); err != nil {
			old = nil
		} else if equality.Semantic.DeepEqual(old.Object["spec"], obj.Object["spec"]) {
			// Metadata changes (finalizers, annotations such as pause) are
			// never refused: only a new spec is checked.
			return admission.Allowed("spec unchanged")
		}
	}
	if n, max := len(req.Object.Raw), h.maxObjectSize(); n > max {
		return admission.Denied(fmt.Sprintf("%s %s is %d KiB and a resource of a watched kind may be at most %d KiB (its spec is stored twice in a release record, which must fit in a Secret): make spec smaller, or raise the manager's --max-resource-size",
			gvk.Kind, obj.GetName(), (n+1023)/1024, max/1024))
	}
	if old != nil {
		if msg, err := h.checkStorage(ctx, k.Kind, old, obj); err != nil {
			return admission.Errored(http.StatusInternalServerError, err)
		} else if msg != "" {
			return admission.Denied(msg)
		}
	}
	if len(k.Hooks) == 0 {
		return admission.Allowed("")
	}
	var chartName, chartVersion string
	if k.Chart != nil {
		chartName, chartVersion = k.Chart()
	}
	hobj, _, err := k.Kind.Object(obj, chartName, chartVersion)
	if err != nil {
		return admission.Denied(err.Error())
	}
	for _, hk := range k.Hooks {
		if hk.Validator == nil {
			continue
		}
		if err := hk.Validator.Validate(ctx, hobj); err != nil {
			if rej, ok := hooks.AsRejection(err); ok {
				return admission.Denied(fmt.Sprintf("%s (%s)", rej.Message, rej.Reason))
			}
			return admission.Errored(http.StatusInternalServerError, fmt.Errorf("hook %s: %w", hk.Name, err))
		}
	}
	return admission.Allowed("")
}

// policyAnnotationsChanged reports whether a create, or an update that
// changes an annotation the version policy reads: only those are checked,
// so the operator's own metadata patches are never refused.
func policyAnnotationsChanged(oldRaw []byte, obj *unstructured.Unstructured) bool {
	if len(oldRaw) == 0 {
		return true
	}
	old := &unstructured.Unstructured{}
	if err := json.Unmarshal(oldRaw, &old.Object); err != nil {
		return true
	}
	for _, a := range []string{v1alpha1.AnnotationChartVersion, v1alpha1.AnnotationAllowMajorUpgrade, v1alpha1.AnnotationMaintenanceWindow} {
		if old.GetAnnotations()[a] != obj.GetAnnotations()[a] {
			return true
		}
	}
	return false
}
