package release

import (
	"context"

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
	return runCached(ctx, r, p, d, v, func(v *cacheView) action { return nextAction(v.o, v.c.gates) })
}

// runCached carries out, from the caches, the actions choose picks for
// v, as long as each has a cached variant and passes its gate; the first
// without one ends the cache path (done false: the full pass takes it).
func runCached(ctx context.Context, r *Reconciler, p *pass, d *desired, v *cacheView, choose func(*cacheView) action) (ctrl.Result, bool) {
	for i := 0; i < maxChoices; i++ {
		cs, ok := cachedStepFor(choose(v))
		if !ok {
			return ctrl.Result{}, false
		}
		res, next, done := cs.cached(ctx, r, p, d, v)
		if !next {
			return res, done
		}
	}
	return ctrl.Result{}, false
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
			c.rollout = chartVersions{r}.rolloutHold(ctx, p, d)
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
	if r.namesRemovedAPIs(rel.Manifest) {
		return false // the full pass rewrites them (RewriteAPIs) or says why not
	}
	reporter{r}.deprecatedAPIs(p, rel)
	r.watchObjects(ctx, p, rel)
	v.body = rel
	return true
}
