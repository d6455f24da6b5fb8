package release

import (
	"fmt"
	"strings"

	corev1 "k8s.io/api/core/v1"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

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
