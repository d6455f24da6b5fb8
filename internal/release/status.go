package release

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/record"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/chartpilot/chartpilot/internal/api/v1alpha1"
	"github.com/chartpilot/chartpilot/internal/helm"
	"github.com/chartpilot/chartpilot/internal/hooks"
	"github.com/chartpilot/chartpilot/internal/redact"
	"github.com/chartpilot/chartpilot/internal/values"
)

// historyLimit bounds status.history.
const historyLimit = 10

// sharedStatusFields are the status fields this reconciler owns for every
// kind; a typed kind's own fields live beside them.
var sharedStatusFields = []string{"observedGeneration", "conditions", "release", "chart", "history", "lastFailure", "valuesLayers", "deprecatedAPIs"}

// readStatus decodes the resource's status.
// A status someone else wrote in another shape is replaced, not fatal.
func readStatus(obj *unstructured.Unstructured) *v1alpha1.ReleaseStatus {
	return v1alpha1.ReadReleaseStatus(obj)
}

// statusChanged reports whether the pass changed the status.
func statusChanged(p *pass) bool {
	if !apiEqual(p.orig, p.status) {
		return true
	}
	current, _ := p.obj.Object["status"].(map[string]any)
	for k, v := range p.extras {
		if !equality.Semantic.DeepEqual(current[k], v) {
			return true
		}
	}
	return false
}

// mergedStatus is base's status with the shared fields replaced by raw and
// the kind's fields by p.extras.
func mergedStatus(base *unstructured.Unstructured, raw, extras map[string]any) map[string]any {
	merged := map[string]any{}
	if cur, ok := base.Object["status"].(map[string]any); ok {
		for k, v := range cur {
			merged[k] = v
		}
	}
	for _, k := range sharedStatusFields {
		delete(merged, k)
	}
	for k, v := range raw {
		merged[k] = v
	}
	for k, v := range extras {
		if v == nil {
			delete(merged, k)
		} else {
			merged[k] = v
		}
	}
	keepForeignConditions(merged, base)
	return merged
}

// conditionsOwnedElsewhere are the condition types other controllers of
// the same resources write (automatic growth, anomalies). A write of this
// reconciler carries them as base (the object it patches) has them, never
// as the status it started from (an owed one, or one read before them) had
// them.
var conditionsOwnedElsewhere = map[string]bool{v1alpha1.ConditionStorageAutoExpand: true, v1alpha1.ConditionAnomalous: true}

func keepForeignConditions(merged map[string]any, base *unstructured.Unstructured) {
	foreign := func(c any) bool {
		m, _ := c.(map[string]any)
		t, _ := m["type"].(string)
		return conditionsOwnedElsewhere[t]
	}
	var out []any
	own, _ := merged["conditions"].([]any)
	for _, c := range own {
		if !foreign(c) {
			out = append(out, c)
		}
	}
	theirs, _, _ := unstructured.NestedSlice(base.Object, "status", "conditions")
	for _, c := range theirs {
		if foreign(c) {
			out = append(out, c)
		}
	}
	if out != nil || own != nil {
		merged["conditions"] = out
	}
}

// writeStatus patches the status subresource when, and only when, it
// changed, with optimistic locking: a status computed from a stale read is
// refused by the API server instead of undoing a newer write. This
// reconciler writes every field of the status but the conditions other
// controllers own (conditionsOwnedElsewhere, always taken from the object
// patched), so on a conflict it applies its status once more on top of a
// fresh read.
func (r reporter) writeStatus(ctx context.Context, p *pass) error {
	redactStatus(p.status)
	if !statusChanged(p) {
		r.paid(p)
		return nil
	}
	raw, err := runtime.DefaultUnstructuredConverter.ToUnstructured(p.status)
	if err != nil {
		return err
	}
	base := p.obj
	for attempt := 0; ; attempt++ {
		withStatus := base.DeepCopy()
		withStatus.Object["status"] = mergedStatus(base, raw, p.extras)
		err := r.Client.Status().Patch(ctx, withStatus, client.MergeFromWithOptions(base, client.MergeFromWithOptimisticLock{}))
		switch {
		case err == nil:
			r.mem.wrote(p.key, withStatus.GetResourceVersion())
			r.paid(p)
			return nil
		case apierrors.IsNotFound(err):
			r.paid(p)
			return nil
		case apierrors.IsConflict(err) && attempt == 0 && r.APIReader != nil:
			fresh := &unstructured.Unstructured{}
			fresh.SetGroupVersionKind(r.Watch.GVK)
			if err := r.APIReader.Get(ctx, p.key, fresh); err != nil {
				return fmt.Errorf("writing status: %w", err)
			}
			base = fresh
		default:
			return fmt.Errorf("writing status: %w", err)
		}
	}
}

// paid drops an owed status once the status p started from it is written
// (or needed no write).
func (r reporter) paid(p *pass) {
	r.mem.with(p.key, func(m *memo) { m.owed = nil })
}

// kindStatus runs Kind.Status once the release is deployed from the current
// inputs, unless it said last time that nothing more was to be seen.
func (r reporter) kindStatus(ctx context.Context, p *pass, res ctrl.Result) (ctrl.Result, error) {
	if r.Kind.Status == nil {
		return res, nil
	}
	c := apimeta.FindStatusCondition(p.status.Conditions, v1alpha1.ConditionReleased)
	if c == nil || c.Status != metav1.ConditionTrue {
		r.mem.with(p.key, func(m *memo) { m.statusSettled = false })
		return res, nil
	}
	if r.mem.get(p.key).statusSettled {
		return res, nil
	}
	reader := r.APIReader
	if reader == nil {
		reader = r.Client
	}
	extras, again, err := r.Kind.Status(ctx, reader, p.obj)
	if err != nil {
		return res, fmt.Errorf("reporting %s status: %w", r.Watch.GVK.Kind, err)
	}
	p.extras = extras
	if r.Kind.Conditions != nil {
		for typ, c := range r.Kind.Conditions(extras) {
			if c == nil {
				apimeta.RemoveStatusCondition(&p.status.Conditions, typ)
				continue
			}
			setCondition(p.status, p.obj, typ, c.Status, c.Reason, c.Message)
		}
	}
	r.mem.with(p.key, func(m *memo) { m.statusSettled = again == 0 })
	if again > 0 && (res.RequeueAfter == 0 || again < res.RequeueAfter) {
		res.RequeueAfter = again
	}
	return res, nil
}

// setCondition sets a condition; LastTransitionTime moves only on a flip
// (apimeta.SetStatusCondition keeps it otherwise).
func setCondition(st *v1alpha1.ReleaseStatus, obj *unstructured.Unstructured, typ string, status metav1.ConditionStatus, reason, msg string) {
	apimeta.SetStatusCondition(&st.Conditions, metav1.Condition{
		Type:               typ,
		Status:             status,
		Reason:             reason,
		Message:            msg,
		ObservedGeneration: obj.GetGeneration(),
	})
}

// summarise derives Ready from the other conditions and moves
// observedGeneration. It runs once per pass, just before the status write.
func summarise(st *v1alpha1.ReleaseStatus, obj *unstructured.Unstructured) {
	st.ObservedGeneration = obj.GetGeneration()
	c := readyFrom(st)
	setCondition(st, obj, v1alpha1.ConditionReady, c.Status, c.Reason, c.Message)
}

// readyFrom is the Ready condition the other conditions call for, the first
// that applies of: stalled, paused, not released, blocked from what the spec
// asks, refused by a hook, drifted, reconciling; else the release's own.
func readyFrom(st *v1alpha1.ReleaseStatus) metav1.Condition {
	get := func(t string) *metav1.Condition { return apimeta.FindStatusCondition(st.Conditions, t) }
	is := func(c *metav1.Condition, s metav1.ConditionStatus) bool { return c != nil && c.Status == s }
	notReady := func(c *metav1.Condition) metav1.Condition {
		return metav1.Condition{Status: metav1.ConditionFalse, Reason: c.Reason, Message: c.Message}
	}
	stalled, released, reconciling, drifted := get(v1alpha1.ConditionStalled), get(v1alpha1.ConditionReleased), get(v1alpha1.ConditionReconciling), get(v1alpha1.ConditionDrifted)
	workloads := get(v1alpha1.ConditionWorkloadsAvailable)
	switch {
	case is(stalled, metav1.ConditionTrue):
		return notReady(stalled)
	case reconciling != nil && reconciling.Reason == "Paused":
		return metav1.Condition{Status: metav1.ConditionUnknown, Reason: "Paused", Message: reconciling.Message}
	case released == nil:
		return metav1.Condition{Status: metav1.ConditionFalse, Reason: "Progressing", Message: "the release is not deployed yet"}
	case !is(released, metav1.ConditionTrue):
		return notReady(released)
	case blockedSummary(st) != nil:
		return notReady(blockedSummary(st))
	case blockingHookCondition(st) != nil:
		return notReady(blockingHookCondition(st))
	case is(drifted, metav1.ConditionTrue):
		return notReady(drifted)
	case is(workloads, metav1.ConditionFalse) && !is(reconciling, metav1.ConditionTrue):
		return notReady(workloads)
	case is(reconciling, metav1.ConditionTrue):
		return notReady(reconciling)
	}
	return metav1.Condition{Status: metav1.ConditionTrue, Reason: released.Reason, Message: released.Message}
}

// blockingHookCondition returns a hook's False condition, if any: a hook that
// refuses a resource makes it not Ready.
func blockingHookCondition(st *v1alpha1.ReleaseStatus) *metav1.Condition {
	for i := range st.Conditions {
		c := &st.Conditions[i]
		switch c.Type {
		case v1alpha1.ConditionReady, v1alpha1.ConditionReleased, v1alpha1.ConditionReconciling, v1alpha1.ConditionStalled, v1alpha1.ConditionDrifted,
			v1alpha1.ConditionUpgradeBlocked, v1alpha1.ConditionSourceAvailable, v1alpha1.ConditionWorkloadsAvailable,
			v1alpha1.ConditionMonitoringReady, v1alpha1.ConditionLastBackupSucceeded, v1alpha1.ConditionStorageResizing,
			v1alpha1.ConditionStorageAutoExpand, v1alpha1.ConditionDeprecatedAPIs, v1alpha1.ConditionAnomalous:
			continue // reported, never blocking
		}
		if c.Status == metav1.ConditionFalse {
			return c
		}
	}
	return nil
}

// hookRefused records a hook's refusal: its condition False, a Warning
// event (once per message), and no action on the release.
func (r reporter) hookRefused(p *pass, h *hooks.Hook, err error) {
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
		r.event(p, corev1.EventTypeWarning, reason, msg)
		p.log.Info("Hook refused the resource", "hook", h.Name, "reason", reason, "message", msg)
	}
}

// hookPassed marks a hook's condition True.
func (r reporter) hookPassed(p *pass, h *hooks.Hook) {
	if h.ConditionType == "" {
		return
	}
	setCondition(p.status, p.obj, h.ConditionType, metav1.ConditionTrue, "Passed", "hook "+h.Name+" admits this resource")
}

func (r reporter) setReleaseInfo(p *pass, rel *helm.Release) {
	info := &v1alpha1.ReleaseInfo{
		Name:         rel.Name,
		Revision:     rel.Revision,
		ChartName:    rel.ChartName,
		ChartVersion: rel.ChartVersion,
		AppVersion:   rel.AppVersion,
		Status:       string(rel.Status),
		ValuesDigest: r.shown(rel.Labels[v1alpha1.LabelDigest]),
	}
	if !rel.LastDeployed.IsZero() {
		t := metav1.NewTime(rel.LastDeployed.Truncate(time.Second).UTC())
		info.LastDeployed = &t
	}
	p.status.Release = info
	if rel.Status == helm.StatusDeployed && p.status.Chart != nil {
		p.status.Chart.DeployedVersion = rel.ChartVersion
	}
	r.setInfoSeries(p.key, [3]string{rel.ChartName, rel.ChartVersion, string(rel.Status)})
	r.deprecatedAPIs(p, rel)
}

// setInfoSeries makes key's chartpilot_release_info series the one with
// labels want (zero: none), replacing the one this process set before.
// Only a change touches the metric: finding a resource's series among
// all the others (a partial match) cost a twentieth of the operator's CPU
// in an upgrade wave of 500.
func (r reporter) setInfoSeries(key types.NamespacedName, want [3]string) {
	var had [3]string
	r.mem.with(key, func(m *memo) { had, m.infoSeries = m.infoSeries, want })
	if had == want {
		return
	}
	kind := r.Watch.GVK.Kind
	if had != ([3]string{}) {
		releaseInfo.DeleteLabelValues(kind, key.Namespace, key.Name, had[0], had[1], had[2])
	}
	if want != ([3]string{}) {
		releaseInfo.WithLabelValues(kind, key.Namespace, key.Name, want[0], want[1], want[2]).Set(1)
	}
}

func (r reporter) recordHistory(p *pass, digest, action string, rel *helm.Release, ok bool, msg string) {
	e := v1alpha1.HistoryEntry{
		Action:    action,
		Digest:    r.shown(digest),
		Succeeded: ok,
		Time:      metav1.NewTime(r.now().Truncate(time.Second).UTC()),
		Message:   msg,
	}
	if rel != nil {
		e.Revision = rel.Revision
		e.ChartVersion = rel.ChartVersion
	}
	p.status.History = append([]v1alpha1.HistoryEntry{e}, p.status.History...)
	if len(p.status.History) > historyLimit {
		p.status.History = p.status.History[:historyLimit]
	}
}

// apiEqual compares statuses as the API server would store them (times by
// instant, not by location), so an unchanged status is never written.
func apiEqual(a, b *v1alpha1.ReleaseStatus) bool { return equality.Semantic.DeepEqual(a, b) }

// redactStatus keeps rejected values out of every message of the status.
func redactStatus(st *v1alpha1.ReleaseStatus) {
	for i := range st.Conditions {
		st.Conditions[i].Message = redact.Text(st.Conditions[i].Message)
	}
	if st.LastFailure != nil {
		st.LastFailure.Message = redact.Text(st.LastFailure.Message)
	}
	for i := range st.History {
		st.History[i].Message = redact.Text(st.History[i].Message)
	}
}

// redactingRecorder redacts the messages of the events it records.
type redactingRecorder struct{ record.EventRecorder }

func (r redactingRecorder) Event(obj runtime.Object, eventtype, reason, message string) {
	r.EventRecorder.Event(obj, eventtype, reason, redact.Text(message))
}

func (r redactingRecorder) Eventf(obj runtime.Object, eventtype, reason, format string, args ...any) {
	r.EventRecorder.Event(obj, eventtype, reason, redact.Text(fmt.Sprintf(format, args...)))
}

func (r redactingRecorder) AnnotatedEventf(obj runtime.Object, annotations map[string]string, eventtype, reason, format string, args ...any) {
	r.EventRecorder.AnnotatedEventf(obj, annotations, eventtype, reason, "%s", redact.Text(fmt.Sprintf(format, args...)))
}

// layerSummary is what status.valuesLayers shows of layers: the name and
// the sorted top-level keys of each layer that sets any.
func layerSummary(layers []values.Layer) []v1alpha1.ValuesLayer {
	var out []v1alpha1.ValuesLayer
	for _, l := range layers {
		if len(l.Values) == 0 {
			continue
		}
		keys := make([]string, 0, len(l.Values))
		for k := range l.Values {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		out = append(out, v1alpha1.ValuesLayer{Name: l.Name, Keys: keys})
	}
	return out
}
