package release

import (
	"context"
	"fmt"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/cli-utils/pkg/kstatus/status"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/chartpilot/chartpilot/internal/api/v1alpha1"
	"github.com/chartpilot/chartpilot/internal/helm"
)

// unhealthyPrefix marks a revision condemned because its workloads did not
// become ready in time; its inputs are not retried until they change or a
// new reconcile is requested.
const unhealthyPrefix = "chartpilot: unhealthy: "

// healthPoll is the first wait before the health gate looks at a release's
// workloads again on its own, doubling to healthPollMax while they settle;
// status changes of its objects wake the gate sooner.
const (
	healthPoll    = 2 * time.Second
	healthPollMax = 2 * time.Minute
)

// owedMax is how long a settling release's status may wait in memory for
// the next look (see owe).
const owedMax = 10 * time.Second

// queuedPoll is how often an upgrade waiting for a slot looks again on its
// own; a freed slot wakes it sooner.
const queuedPoll = 30 * time.Second

// checkHealthStep is the CheckHealth action: the health gate of a fresh
// revision.
type checkHealthStep struct{}

var _ = registerStep(actCheckHealth, checkHealthStep{})

func (s checkHealthStep) full(ctx context.Context, r *Reconciler, f *fullPass) (ctrl.Result, bool, error) {
	res, healthy, err := s.run(ctx, r, f.p, f.d, f.o, f.history)
	if err != nil || !healthy {
		if f.c.gates.driftDue {
			// A change of the release's objects seen while the revision
			// settles (an object deleted) is checked once it is healthy,
			// not forgotten.
			r.mem.with(f.p.key, func(m *memo) { m.driftDue = true })
		}
		return res, false, err
	}
	// Healthy: the gate is passed, and the pass chooses again.
	f.c.gates.healthy = true
	return res, true, nil
}

// run is the health gate of an in-sync release: every object of the
// manifest must be Current by kstatus. While they settle the resource is
// Reconciling (so not Ready) and looked at again shortly; an upgrade whose
// workloads are not ready within healthTimeout is condemned, so that the next
// pass rolls it back. healthy is true when the pass may go on.
func (checkHealthStep) run(ctx context.Context, r *Reconciler, p *pass, d *desired, o Observation, history []*helm.Release) (res ctrl.Result, healthy bool, err error) {
	rel := o.Latest
	pending, err := healthGate{r}.notReady(ctx, d.identity, p.key.Namespace, rel.Manifest)
	if r.stallOutOfScope(p, err) {
		return ctrl.Result{}, false, nil
	}
	if err != nil {
		return ctrl.Result{}, false, err
	}
	if len(pending) == 0 {
		healthGate{r}.seenHealthy(p, rel.Revision)
		return ctrl.Result{}, true, nil
	}
	r.mem.with(p.key, func(m *memo) { m.awaiting = true })
	if len(history) > 1 {
		// An upgrade still settling (e.g. found so after a restart) counts
		// against maxConcurrentUpgrades until it is healthy.
		r.slots.hold(p.key)
	}
	if r.now().Sub(rel.LastDeployed) < r.Watch.HealthTimeout {
		progressing(p, pending)
		p.settling = true
		reporter{r}.setReleaseInfo(p, rel)
		return ctrl.Result{RequeueAfter: r.mem.healthLookAfter(p.key, rel.Revision)}, false, nil
	}
	why := fmt.Sprintf("revision %d did not become ready within %s: %s", rel.Revision, r.Watch.HealthTimeout, strings.Join(pending, "; "))
	res, err = healthGate{r}.unhealthy(p, d, rel, lastGoodBefore(history, rel.Revision), why)
	return res, false, err
}

// cached passes the health gate from the caches: once the workloads are
// ready the pass chooses again (drift, or nothing).
func (s checkHealthStep) cached(ctx context.Context, r *Reconciler, p *pass, d *desired, v *cacheView) (ctrl.Result, bool, bool) {
	res, healthy, done := s.fromCaches(ctx, r, p, d, v)
	if healthy {
		v.c.gates.healthy = true
	}
	return res, healthy, done
}

// fromCaches is the health gate of a revision whose workloads
// settle within healthTimeout: healthy when they are all ready, or the
// pass ends settling (done). A timeout, or anything it cannot read, is
// left to the full pass (neither healthy nor done).
func (checkHealthStep) fromCaches(ctx context.Context, r *Reconciler, p *pass, d *desired, v *cacheView) (res ctrl.Result, healthy, done bool) {
	if !r.cachedBody(ctx, p, d, v) {
		return ctrl.Result{}, false, false
	}
	rel := v.body
	if r.now().Sub(rel.LastDeployed) >= r.Watch.HealthTimeout {
		return ctrl.Result{}, false, false
	}
	pending, err := healthGate{r}.notReady(ctx, d.identity, p.key.Namespace, rel.Manifest)
	if err != nil {
		return ctrl.Result{}, false, false
	}
	if len(pending) == 0 {
		healthGate{r}.seenHealthy(p, rel.Revision)
		return ctrl.Result{}, true, false
	}
	r.mem.with(p.key, func(m *memo) {
		m.awaiting = true
		// A change of the release's objects seen while it settles is
		// looked at once it is healthy, not forgotten.
		m.driftDue = m.driftDue || v.c.gates.driftDue
	})
	if rel.Revision > 1 {
		r.slots.hold(p.key) // an upgrade settling holds its slot until healthy
	}
	progressing(p, pending)
	p.settling = true
	reporter{r}.setReleaseInfo(p, rel)
	return ctrl.Result{RequeueAfter: r.mem.healthLookAfter(p.key, rel.Revision)}, false, true
}

// seenHealthy records that revision's workloads were seen ready: the
// gate is passed, its back-offs are reset and its upgrade slot is freed.
func (r healthGate) seenHealthy(p *pass, revision int) {
	r.mem.with(p.key, func(m *memo) { m.healthyRev, m.awaiting, m.healthLooks = revision, false, 0 })
	r.mem.retried(p.key, "InstallUnhealthy")
	r.slots.end(p.key)
}

// unhealthy ends a health gate that timed out: a first install stays and
// says why (there is nothing to go back to); an upgrade is condemned, so
// that the next pass rolls it back.
func (r healthGate) unhealthy(p *pass, d *desired, rel, previous *helm.Release, why string) (ctrl.Result, error) {
	if previous == nil {
		r.slots.end(p.key)
		setCondition(p.status, p.obj, v1alpha1.ConditionReleased, metav1.ConditionFalse, "InstallUnhealthy", why)
		setCondition(p.status, p.obj, v1alpha1.ConditionReconciling, metav1.ConditionTrue, "InstallUnhealthy", why)
		// Its workloads' status changes wake it; on its own it looks again
		// after 15 s, doubling to 15 min.
		return ctrl.Result{RequeueAfter: r.mem.retryAfter(p.key, "InstallUnhealthy")}, nil
	}
	r.mem.with(p.key, func(m *memo) { m.awaiting = false })
	if err := r.Helm.As(d.identity).MarkFailed(p.key.Namespace, p.key.Name, rel.Revision, unhealthyPrefix+why); err != nil {
		return ctrl.Result{}, fmt.Errorf("condemning unhealthy revision: %w", err)
	}
	r.slots.end(p.key)
	reporter{r.Reconciler}.failed(p, d, "Upgrade", "UpgradeFailed", fmt.Errorf("%s", why), rel)
	return ctrl.Result{RequeueAfter: 100 * time.Millisecond}, nil
}

// notReady lists the objects of manifest that kstatus does not call Current.
func (r healthGate) notReady(ctx context.Context, identity, namespace, manifest string) ([]string, error) {
	var out []string
	err := r.eachLiveObject(ctx, identity, namespace, manifest, func(want, live *unstructured.Unstructured, _ string, differs bool) {
		if live == nil {
			out = append(out, want.GetKind()+"/"+want.GetName()+" is missing")
			return
		}
		if differs {
			// The cache has not yet seen the revision's change of it (or
			// someone changed it since: a drift check sets it back).
			out = append(out, want.GetKind()+"/"+want.GetName())
			return
		}
		res, err := status.Compute(live)
		if err != nil {
			return // a kind kstatus cannot read is not a workload to wait for
		}
		switch res.Status {
		case status.CurrentStatus:
		case status.InProgressStatus:
			// Named without kstatus's message, which changes with every
			// replica count: the condition (and the status write) changes
			// only when the set of objects waited for does.
			out = append(out, want.GetKind()+"/"+want.GetName())
		default:
			out = append(out, fmt.Sprintf("%s/%s is %s: %s", want.GetKind(), want.GetName(), res.Status, res.Message))
		}
	})
	return out, err
}

// queued reports an upgrade waiting for a free slot.
func (r healthGate) queued(p *pass) ctrl.Result {
	setCondition(p.status, p.obj, v1alpha1.ConditionReconciling, metav1.ConditionTrue, "UpgradeQueued",
		fmt.Sprintf("%d releases of this kind are upgrading (maxConcurrentUpgrades); this one waits its turn", r.Watch.MaxConcurrentUpgrades))
	r.setWaiting(p.key, reasonQueued)
	// A freed slot wakes the longest-queued resources; the poll is a safety net.
	return ctrl.Result{RequeueAfter: queuedPoll}
}

// unhealthyFailure reports whether the newest failed revision of digest was
// condemned as unhealthy under the same reconcile-requested-at token: such
// inputs are not retried until they change or a new reconcile is requested.
func unhealthyFailure(history []*helm.Release, digest, requested string) (*helm.Release, bool) {
	for i := len(history) - 1; i >= 0; i-- {
		h := history[i]
		if h.Status == helm.StatusFailed && h.Labels[v1alpha1.LabelDigest] == digest {
			if strings.HasPrefix(h.Description, unhealthyPrefix) && h.Labels[v1alpha1.LabelRequestedAt] == requested {
				return h, true
			}
			return nil, false
		}
	}
	return nil, false
}

// workloadsToFollow: a workload's availability changed, or the release is
// shown with workloads unavailable: the pass looks at them.
func (r healthGate) workloadsToFollow(p *pass) bool {
	c := apimeta.FindStatusCondition(p.status.Conditions, v1alpha1.ConditionWorkloadsAvailable)
	return r.mem.get(p.key).workloadsDue || (c != nil && c.Status == metav1.ConditionFalse)
}

// followWorkloads keeps Ready true to the workloads of a release that was
// seen healthy: from the object cache (no request), a workload that is no
// longer available (kstatus not Current, or missing) sets
// WorkloadsAvailable=False naming it, which makes Ready False; when all are
// available again it turns True. No Helm action, no rollback: only a fresh
// upgrade is judged by the health gate.
func (r healthGate) followWorkloads(ctx context.Context, p *pass, d *desired, rel *helm.Release) {
	if rel == nil || !r.workloadsToFollow(p) {
		return
	}
	r.mem.with(p.key, func(m *memo) {
		m.workloadsDue = false
		m.statusSettled = false // the kind's status (ready replicas) follows
	})
	var names []string
	err := r.eachLiveObject(ctx, d.identity, p.key.Namespace, rel.Manifest, func(want, live *unstructured.Unstructured, _ string, _ bool) {
		if live == nil {
			names = append(names, want.GetKind()+"/"+want.GetName()+" is missing")
			return
		}
		if res, err := status.Compute(live); err == nil && res.Status != status.CurrentStatus {
			names = append(names, fmt.Sprintf("%s/%s is %s: %s", want.GetKind(), want.GetName(), res.Status, res.Message))
		}
	})
	if err != nil {
		p.log.V(1).Info("Workloads not looked at", "error", err.Error())
		return
	}
	prev := apimeta.FindStatusCondition(p.status.Conditions, v1alpha1.ConditionWorkloadsAvailable)
	switch {
	case len(names) > 0:
		msg := "not available: " + strings.Join(names, "; ")
		if len(names) > 10 {
			msg = fmt.Sprintf("not available: %s and %d more", strings.Join(names[:10], "; "), len(names)-10)
		}
		if prev == nil || prev.Status != metav1.ConditionFalse {
			r.event(p, corev1.EventTypeWarning, "WorkloadsUnavailable", msg)
		}
		setCondition(p.status, p.obj, v1alpha1.ConditionWorkloadsAvailable, metav1.ConditionFalse, "WorkloadsUnavailable", msg)
		r.setUnavailable(p.key, true)
		r.mem.with(p.key, func(m *memo) { m.unavailable = true })
	case prev != nil && prev.Status == metav1.ConditionFalse:
		msg := "every workload of the release is available again"
		r.event(p, corev1.EventTypeNormal, "WorkloadsAvailable", msg)
		setCondition(p.status, p.obj, v1alpha1.ConditionWorkloadsAvailable, metav1.ConditionTrue, "WorkloadsAvailable", msg)
		r.setUnavailable(p.key, false)
	}
	if len(names) == 0 {
		r.mem.with(p.key, func(m *memo) { m.unavailable = false })
	}
}

// setUnavailable records whether key's workloads are unavailable, for the
// chartpilot_workloads_unavailable gauge.
func (r healthGate) setUnavailable(key types.NamespacedName, on bool) {
	r.unavailableMu.Lock()
	defer r.unavailableMu.Unlock()
	if on == r.unavailable[key] {
		return
	}
	if r.unavailable == nil {
		r.unavailable = map[types.NamespacedName]bool{}
	}
	if on {
		r.unavailable[key] = true
	} else {
		delete(r.unavailable, key)
	}
	workloadsUnavailable.WithLabelValues(r.Watch.GVK.Kind).Set(float64(len(r.unavailable)))
}

// availabilityChanged reports whether an object went from available
// (kstatus Current) to not, or back.
func availabilityChanged(o, n client.Object) bool {
	current := func(obj client.Object) bool {
		s := kstatusOf(obj)
		return s == "" || s == status.CurrentStatus
	}
	return current(o) != current(n)
}

// kstatusChanged reports whether kstatus reads o and n differently.
func kstatusChanged(o, n client.Object) bool { return kstatusOf(o) != kstatusOf(n) }

// kstatusOf is kstatus's reading of obj ("" when it has none: not
// unstructured, or a kind kstatus cannot read).
func kstatusOf(obj client.Object) status.Status {
	u, ok := obj.(*unstructured.Unstructured)
	if !ok {
		return ""
	}
	u, err := expanded(u)
	if err != nil {
		return ""
	}
	res, err := status.Compute(u)
	if err != nil {
		return ""
	}
	return res.Status
}
