package release

import (
	"context"
	"time"

	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ctrl "sigs.k8s.io/controller-runtime"

	"github.com/chartpilot/chartpilot/internal/api/v1alpha1"
	"github.com/chartpilot/chartpilot/internal/helm"
)

// The cache path: a pass that can end on what the informer caches show
// (the release records' labels, the objects, memory) builds its
// observation and gates from them, takes its action from nextAction like
// every other pass, and carries out the few actions that need no fresh
// read: nothing, the health gate while workloads settle, a drift check
// that finds nothing, and the waits for a slot or a rollout gate. Any
// other action, or anything it cannot read, goes to the full pass, which
// observes the release history.

// observeRecords classifies a release from its records' labels alone, as
// observe would from the history, for the states a pass can end in from
// the caches: the newest record deployed by this owner, in sync with
// digest or not. Everything else is for observe: ok is false. statusRev
// is the newest revision the resource's status names (0: none): a cache
// behind it does not yet show this operator's own last action, and a
// release in sync whose status names no revision is left to the full
// pass, which names it.
func observeRecords(records []map[string]string, statusRev int, ownerUID, digest string) (Observation, bool) {
	best, latest := newestRecord(records)
	if latest == nil || best < statusRev || digest == "" || ownerUID == "" ||
		latest[helm.StorageLabelStatus] != string(helm.StatusDeployed) || latest[v1alpha1.LabelOwnerUID] != ownerUID {
		return Observation{}, false
	}
	rel := &helm.Release{Revision: best, Status: helm.StatusDeployed, Labels: latest}
	o := Observation{State: StateOutOfSync, Latest: rel, LastGood: rel}
	if latest[v1alpha1.LabelDigest] == digest {
		if statusRev == 0 {
			return Observation{}, false
		}
		o.State = StateInSync
	}
	return o, true
}

// cacheView is a release as the caches show it, with the body of its
// newest revision once a step has read it (at most once per pass).
type cacheView struct {
	o    Observation
	c    choice
	body *helm.Release
}

// fromCaches ends a pass from the caches when the action nextAction
// chooses for what they show needs nothing else; done is false when the
// full pass is to observe and act.
func (r *Reconciler) fromCaches(ctx context.Context, p *pass, d *desired, driftDue bool) (ctrl.Result, bool) {
	if c := apimeta.FindStatusCondition(p.status.Conditions, v1alpha1.ConditionStalled); c != nil && c.Status == metav1.ConditionTrue {
		// A stall is lifted only by what the release history says, never
		// by record labels (which anyone who may write Secrets can set).
		return ctrl.Result{}, false
	}
	records, ok := r.releaseRecords(ctx, p)
	if !ok {
		return ctrl.Result{}, false
	}
	statusRev := 0
	if p.status.Release != nil {
		statusRev = p.status.Release.Revision
	}
	o, ok := observeRecords(records, statusRev, string(p.obj.GetUID()), d.digest)
	if !ok {
		return ctrl.Result{}, false
	}
	v := &cacheView{o: o, c: r.cachedGates(ctx, p, d, o, driftDue)}
	for {
		switch a := nextAction(v.o, v.c.gates); a {
		case actNone:
			if v.body == nil && r.workloadsToFollow(p) && !r.cachedBody(ctx, p, d, v) {
				return ctrl.Result{}, false
			}
			if v.body == nil {
				rendersSkipped.WithLabelValues(r.Watch.GVK.Kind).Inc()
			}
			r.followWorkloads(ctx, p, d, v.body)
			r.markInSync(p, d, v.body)
			return ctrl.Result{RequeueAfter: r.Watch.ReconcilePeriod}, true
		case actCheckHealth:
			res, healthy, done := r.healthFromCaches(ctx, p, d, v)
			if !healthy {
				return res, done
			}
			v.c.gates.healthy = true
		case actCorrectDrift:
			res, clean, done := r.driftFromCaches(ctx, p, d, v)
			if !clean {
				return res, done
			}
			v.c.gates.driftDue = false
		case actQueue:
			// Every slot is taken: the upgrade waits its turn without
			// reading anything (a freed slot wakes it).
			return r.queued(p), true
		case actUpgrade:
			// The slot is taken before the full pass reads the resource
			// and the history: passes that lose the race for the last
			// slot queue here, having read nothing.
			newly, ok := r.slots.reserve(p.key)
			if !ok {
				return r.queued(p), true
			}
			p.reserved = newly
			return ctrl.Result{}, false
		case actHoldRollout:
			return r.waitRollout(p, *v.c.rollout), true
		default:
			return ctrl.Result{}, false
		}
	}
}

// cachedGates are the gates the caches and memory answer. Back-off and
// condemned inputs are read from the history, so the cache path leaves
// them unset: the only actions it would choose instead of theirs are
// waits (Queue, HoldRollout), and the full pass that follows a wait finds
// them. A rollout gate is read only for a version change that one held
// before.
func (r *Reconciler) cachedGates(ctx context.Context, p *pass, d *desired, o Observation, driftDue bool) choice {
	m := r.mem.get(p.key)
	c := choice{gates: gates{driftDue: driftDue}}
	switch o.State {
	case StateInSync:
		c.gates.healthy = m.healthyRev == o.Latest.Revision
	case StateOutOfSync:
		c.gates.slotFree = r.slots.free(p.key)
		if d.isVersionChange() && m.waiting != "" && m.waiting != reasonQueued {
			c.rollout = r.rolloutHold(ctx, p, d)
			c.gates.rolloutHold = c.rollout != nil
		}
	}
	return c
}

// cachedBody reads the newest revision's body once, for a step that needs
// its manifest; false when it cannot (the full pass then reads it).
func (r *Reconciler) cachedBody(ctx context.Context, p *pass, d *desired, v *cacheView) bool {
	if v.body != nil {
		return true
	}
	rel, err := r.Helm.As(d.identity).Revision(p.key.Namespace, p.key.Name, v.o.Latest.Revision)
	if err != nil || rel.Status != helm.StatusDeployed {
		return false
	}
	if r.checkScope(p.key.Namespace, rel.Manifest) != nil {
		return false
	}
	r.watchObjects(ctx, p, rel)
	v.body = rel
	return true
}

// healthFromCaches is the health gate of a revision whose workloads
// settle within healthTimeout: healthy when they are all ready, or the
// pass ends settling (done). A timeout, or anything it cannot read, is
// left to the full pass (neither healthy nor done).
func (r *Reconciler) healthFromCaches(ctx context.Context, p *pass, d *desired, v *cacheView) (res ctrl.Result, healthy, done bool) {
	if !r.cachedBody(ctx, p, d, v) {
		return ctrl.Result{}, false, false
	}
	rel := v.body
	if r.now().Sub(rel.LastDeployed) >= r.Watch.HealthTimeout {
		return ctrl.Result{}, false, false
	}
	pending, err := r.notReady(ctx, d.identity, p.key.Namespace, rel.Manifest)
	if err != nil {
		return ctrl.Result{}, false, false
	}
	if len(pending) == 0 {
		r.seenHealthy(p, rel.Revision)
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
	r.setReleaseInfo(p, rel)
	return ctrl.Result{RequeueAfter: r.mem.healthLookAfter(p.key, rel.Revision)}, false, true
}

// driftFromCaches compares the release's objects with the caches: clean
// when nothing changed. A difference is looked at again in a second
// (done), because the cache may show one object of a release's own change
// before another; one that stays, or anything it cannot read, goes to the
// full pass, which corrects it (neither clean nor done).
func (r *Reconciler) driftFromCaches(ctx context.Context, p *pass, d *desired, v *cacheView) (res ctrl.Result, clean, done bool) {
	if !r.cachedBody(ctx, p, d, v) {
		return ctrl.Result{}, false, false
	}
	drifted, err := r.findDrift(ctx, d.identity, p.key.Namespace, v.body.Manifest)
	if err != nil {
		return ctrl.Result{}, false, false
	}
	if len(drifted) > 0 {
		again := false
		r.mem.with(p.key, func(m *memo) {
			again = !m.driftRecheck
			m.driftRecheck, m.driftDue = again, again || m.driftDue
		})
		if again {
			return ctrl.Result{RequeueAfter: time.Second}, false, true
		}
		return ctrl.Result{}, false, false
	}
	r.mem.with(p.key, func(m *memo) { m.driftRecheck = false })
	driftChecks.WithLabelValues(r.Watch.GVK.Kind, "none").Inc()
	if c := apimeta.FindStatusCondition(p.status.Conditions, v1alpha1.ConditionDrifted); c != nil && c.Status == metav1.ConditionTrue {
		setCondition(p.status, p.obj, v1alpha1.ConditionDrifted, metav1.ConditionFalse, "NoDrift", "every object matches the release")
	}
	return ctrl.Result{}, true, false
}
