package release

import (
	"fmt"
	"strings"

	corev1 "k8s.io/api/core/v1"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/chartpilot/chartpilot/hooks"
)

// hookRefused records a hook's refusal: its condition False, a Warning
// event (once per message), and no action on the release.
func (r *Reconciler) hookRefused(p *pass, h *hooks.Hook, err error) {
	p.blocked = true
	typ := h.ConditionType
	if typ == "" {
		typ = "Hook" + strings.ToUpper(h.Name[:1]) + h.Name[1:]
	}
	reason, msg := "HookFailed", fmt.Sprintf("hook %s: %s", h.Name, oneLine(err.Error()))
	if rej, ok := hooks.AsRejection(err); ok {
		reason, msg = rej.Reason, oneLine(rej.Message)
	}
	prev := apimeta.FindStatusCondition(p.status.Conditions, typ)
	setCondition(p.status, p.obj, typ, metav1.ConditionFalse, reason, msg+": the release is left as it is")
	if prev == nil || prev.Status != metav1.ConditionFalse || prev.Reason != reason || !strings.HasPrefix(prev.Message, msg) {
		r.Recorder.Event(p.obj, corev1.EventTypeWarning, reason, msg)
		p.log.Info("Hook refused the resource", "hook", h.Name, "reason", reason, "message", msg)
	}
}

// hookPassed marks a hook's condition True.
func (r *Reconciler) hookPassed(p *pass, h *hooks.Hook) {
	if h.ConditionType == "" {
		return
	}
	setCondition(p.status, p.obj, h.ConditionType, metav1.ConditionTrue, "Passed", "hook "+h.Name+" admits this resource")
}

// GenericFacts reads policy figures from a passthrough resource's values,
// at the paths charts conventionally use: replicas (or replicaCount),
// storage.size / persistence.size (counted only when persistence is not
// disabled), their storageClass, and resources.limits (else requests).
func GenericFacts(_ *unstructured.Unstructured, vals map[string]any) hooks.Facts {
	f := hooks.Facts{}
	for _, k := range []string{"replicas", "replicaCount"} {
		if n, ok := number(vals[k]); ok {
			f.Replicas = int64(n)
			break
		}
	}
	for _, base := range []string{"storage", "persistence"} {
		m, ok := vals[base].(map[string]any)
		if !ok {
			continue
		}
		if enabled, ok := m["enabled"].(bool); ok && !enabled {
			continue
		}
		if s, ok := m["size"].(string); ok {
			if q, err := resource.ParseQuantity(s); err == nil {
				f.StorageBytes = q.Value()
			}
		}
		if c, ok := m["storageClass"].(string); ok {
			f.StorageClass = c
		}
		f.StorageClassPath = []string{base, "storageClass"}
		break
	}
	if res, ok := vals["resources"].(map[string]any); ok {
		for _, kind := range []string{"requests", "limits"} { // limits win
			m, ok := res[kind].(map[string]any)
			if !ok {
				continue
			}
			if q, ok := quantity(m["cpu"]); ok {
				f.CPUMilli = q.MilliValue()
			}
			if q, ok := quantity(m["memory"]); ok {
				f.MemoryBytes = q.Value()
			}
		}
	}
	return f
}

func quantity(v any) (resource.Quantity, bool) {
	switch t := v.(type) {
	case string:
		q, err := resource.ParseQuantity(t)
		return q, err == nil
	default:
		if n, ok := number(v); ok {
			return *resource.NewMilliQuantity(int64(n*1000), resource.DecimalSI), true
		}
	}
	return resource.Quantity{}, false
}
