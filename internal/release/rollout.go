package release

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/chartpilot/chartpilot/internal/api/v1alpha1"
	"github.com/chartpilot/chartpilot/internal/policy"
)

// Reasons a rollout gate holds a chart version upgrade (condition
// UpgradeBlocked, and label "reason" of chartpilot_rollout_waiting; queued
// upgrades are Reconciling instead: they are about to run).
const (
	reasonWindow          = "WaitingForMaintenanceWindow"
	reasonInvalidWindow   = "InvalidMaintenanceWindow"
	reasonCanaries        = "WaitingForCanaries"
	reasonHalted          = "RolloutHalted"
	reasonQueued          = "UpgradeQueued"
	canaryPoll            = time.Minute
	maxWindowWait         = 5 * time.Minute
	invalidWindowRecheck  = 5 * time.Minute
	rolloutResultDeployed = "deployed"
	rolloutResultRollback = "rolled_back"
)

// rolloutHold says why a chart version upgrade must wait, and when to look again.
type rolloutHold struct {
	reason, msg string
	after       time.Duration
}

// rolloutHold decides whether a chart version upgrade may start now:
// inside the maintenance window (of the resource, else of its namespace)
// and, for a resource that is not a canary, after every canary taking
// part in this version's rollout has been Ready on it for canarySoak.
// It returns what holds the upgrade, or nil. It reads caches only.
func (r chartVersions) rolloutHold(ctx context.Context, p *pass, d *desired) *rolloutHold {
	if h := r.windowHold(ctx, p, d); h != nil {
		return h
	}
	if p.obj.GetLabels()[v1alpha1.LabelCanary] == "true" {
		return nil
	}
	return r.canaryHold(ctx, p, d)
}

// rolloutPeers are the namespaces whose canaries count for a resource in
// namespace: its tenant's (a hook's Peers), else the namespace alone.
// Another tenant's canaries never hold or halt its rollout.
func (r chartVersions) rolloutPeers(ctx context.Context, namespace string) ([]string, error) {
	for _, h := range r.Hooks {
		if h.Peers == nil {
			continue
		}
		ns, err := h.Peers(ctx, namespace)
		if err != nil {
			return nil, err
		}
		if ns != nil {
			return ns, nil
		}
	}
	return []string{namespace}, nil
}

// canariesOf lists the canaries of this kind in the peer namespaces (cache).
func (r chartVersions) canariesOf(ctx context.Context, namespace string) ([]unstructured.Unstructured, error) {
	peers, err := r.rolloutPeers(ctx, namespace)
	if err != nil {
		return nil, err
	}
	var out []unstructured.Unstructured
	for _, ns := range peers {
		list := &unstructured.UnstructuredList{}
		list.SetGroupVersionKind(r.Watch.GVK.GroupVersion().WithKind(r.Watch.GVK.Kind + "List"))
		if err := r.Client.List(ctx, list, client.InNamespace(ns), client.MatchingLabels{v1alpha1.LabelCanary: "true"}); err != nil {
			return nil, err
		}
		out = append(out, list.Items...)
	}
	return out, nil
}

func (r chartVersions) windowHold(ctx context.Context, p *pass, d *desired) *rolloutHold {
	spec, where := p.obj.GetAnnotations()[v1alpha1.AnnotationMaintenanceWindow], "annotation "+v1alpha1.AnnotationMaintenanceWindow
	if spec == "" {
		ns := &metav1.PartialObjectMetadata{}
		ns.SetGroupVersionKind(corev1.SchemeGroupVersion.WithKind("Namespace"))
		if err := r.Client.Get(ctx, types.NamespacedName{Name: p.key.Namespace}, ns); err == nil {
			spec, where = ns.GetAnnotations()[v1alpha1.AnnotationMaintenanceWindow], "annotation "+v1alpha1.AnnotationMaintenanceWindow+" of namespace "+p.key.Namespace
		}
	}
	if spec == "" {
		return nil
	}
	ws, err := policy.ParseWindows(spec)
	if err != nil {
		return &rolloutHold{reasonInvalidWindow, fmt.Sprintf("%s: %v; the upgrade to chart %s %s waits until it is fixed", where, err, d.chart.Name, d.chart.Version), invalidWindowRecheck}
	}
	open, next := policy.InWindow(ws, r.now())
	if open {
		return nil
	}
	at := r.now().Add(next).UTC().Format(time.RFC3339)
	return &rolloutHold{reasonWindow, fmt.Sprintf("the upgrade to chart %s %s waits for the maintenance window (%s: %q), next at %s", d.chart.Name, d.chart.Version, where, spec, at), min(next, maxWindowWait)}
}

// canaryHold holds a non-canary while the canaries of this version's rollout
// (in its namespace, or its tenant's) are not yet Ready on it for
// canarySoak, and halts it when one of them failed on it.
func (r chartVersions) canaryHold(ctx context.Context, p *pass, d *desired) *rolloutHold {
	target := d.chart.Version
	canaries, err := r.canariesOf(ctx, p.key.Namespace)
	if err != nil {
		return &rolloutHold{reasonCanaries, "listing canaries: " + oneLine(err.Error()), canaryPoll}
	}
	versions, _ := r.Source.Versions()
	var pending, failed []string
	total := 0
	wait := canaryPoll
	for i := range canaries {
		c := &canaries[i]
		state, left := r.canaryState(c, versions, target)
		name := c.GetNamespace() + "/" + c.GetName()
		switch state {
		case canaryNotInRollout:
			continue
		case canaryFailed:
			failed = append(failed, name)
		case canaryPending:
			pending = append(pending, name)
			if left > 0 {
				wait = min(wait, left+time.Second)
			}
		}
		total++
	}
	key := []string{r.Watch.GVK.Kind, target}
	// One rollout at a time per kind: a newer version ends the halt of an older one.
	rolloutHalted.DeletePartialMatch(map[string]string{"kind": r.Watch.GVK.Kind})
	if len(failed) > 0 {
		rolloutHalted.WithLabelValues(key...).Set(1)
		sort.Strings(failed)
		return &rolloutHold{reasonHalted, fmt.Sprintf("the rollout of chart %s %s is halted: canary %s failed on it and was rolled back; fix the chart or the canary, then set %s on the canary to try again", d.chart.Name, target, strings.Join(failed, ", "), v1alpha1.AnnotationReconcileRequestedAt), time.Minute}
	}
	rolloutHalted.WithLabelValues(key...).Set(0)
	if len(pending) > 0 {
		sort.Strings(pending)
		return &rolloutHold{reasonCanaries, fmt.Sprintf("the upgrade to chart %s %s waits for %d of %d canaries to be Ready on it for %s: %s", d.chart.Name, target, len(pending), total, r.Watch.CanarySoak, strings.Join(pending, ", ")), wait}
	}
	return nil
}

// States of a canary in the rollout of one chart version.
const (
	canaryNotInRollout = iota // not a canary of this watch, being deleted, or its policy leads elsewhere
	canaryFailed              // rolled back from the version
	canaryPending             // not yet Ready on the version, or not yet soaked
	canarySoaked              // Ready on the version for canarySoak
)

// canaryState places canary c in the rollout of chart version target;
// left is the soak time still to go for a pending canary that is Ready.
func (r chartVersions) canaryState(c *unstructured.Unstructured, versions []string, target string) (int, time.Duration) {
	if r.Watch.Selector != nil && !r.Watch.Selector.Matches(labels.Set(c.GetLabels())) || c.GetDeletionTimestamp() != nil {
		return canaryNotInRollout, 0
	}
	st := readStatus(c)
	deployed := ""
	if st.Chart != nil {
		deployed = st.Chart.DeployedVersion
	}
	// A canary takes part when its own policy leads it to this version.
	pol, _, err := r.policyFor(c, deployedState{chartVersion: deployed})
	if err != nil {
		return canaryNotInRollout, 0
	}
	if ch, err := policy.Choose(versions, pol); err != nil || ch.Version != target {
		return canaryNotInRollout, 0
	}
	ready := apimeta.FindStatusCondition(st.Conditions, v1alpha1.ConditionReady)
	switch {
	case st.Chart != nil && st.Chart.FailedVersion == target:
		return canaryFailed, 0
	case deployed != target || ready == nil || ready.Status != metav1.ConditionTrue || st.Release == nil || st.Release.LastDeployed == nil:
		return canaryPending, 0
	}
	if left := st.Release.LastDeployed.Add(r.Watch.CanarySoak).Sub(r.now()); left > 0 {
		return canaryPending, left
	}
	return canarySoaked, 0
}

// waitRollout holds a chart version upgrade: UpgradeBlocked=True says why
// (with a Warning event for a halt or a bad window, once), nothing is in
// progress (Reconciling=False), and the release keeps serving: Ready stays
// True unless the window annotation is invalid. The resource counts as waiting.
func (r chartVersions) waitRollout(p *pass, h rolloutHold) ctrl.Result {
	prev := apimeta.FindStatusCondition(p.orig.Conditions, v1alpha1.ConditionUpgradeBlocked)
	setCondition(p.status, p.obj, v1alpha1.ConditionUpgradeBlocked, metav1.ConditionTrue, h.reason, h.msg)
	setCondition(p.status, p.obj, v1alpha1.ConditionReconciling, metav1.ConditionFalse, h.reason, "nothing in progress: "+h.msg)
	if h.reason == reasonHalted || h.reason == reasonInvalidWindow {
		if prev == nil || prev.Reason != h.reason || prev.Message != h.msg {
			r.event(p, corev1.EventTypeWarning, h.reason, h.msg)
		}
	}
	r.setWaiting(p.key, h.reason)
	return ctrl.Result{RequeueAfter: h.after}
}
