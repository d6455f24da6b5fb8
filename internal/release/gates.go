package release

import (
	"context"
	"fmt"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ctrl "sigs.k8s.io/controller-runtime"

	"github.com/chartpilot/chartpilot/internal/api/v1alpha1"
	"github.com/chartpilot/chartpilot/internal/helm"
)

// choice is the gates of a pass with what the holds need to say.
type choice struct {
	gates gates
	// failure is the failure that backoff waits out.
	failure *v1alpha1.Failure
	// backoffAction names the action that failed ("Install" or "Upgrade").
	backoffAction string
	// condemned is the revision rolled back as unhealthy, for its message.
	condemned *helm.Release
	// rollout says what holds a chart version change.
	rollout *rolloutHold
	// lock is the holder of a pending revision, looked at again after lockRecheck.
	lock        lockInfo
	lockRecheck time.Duration
	// apiRewrite is the RewriteAPIs the gate unservedAPIs found safe.
	apiRewrite *apiRewrite
}

// gatesFor reads the gates the observed state needs, from memory and
// caches: back-off, condemned inputs, rollout gates, upgrade slots, health.
func (r *Reconciler) gatesFor(ctx context.Context, p *pass, d *desired, o Observation, history []*helm.Release, driftDue bool) choice {
	m := r.mem.get(p.key)
	c := choice{gates: gates{driftDue: driftDue}}
	c.gates.brokenOff = o.Latest != nil && m.brokenOff > 0 && m.brokenOff == o.Latest.Revision
	switch o.State {
	case StateAbsent:
		c.backoffAction = "Install"
		c.gates.backoff, c.failure = reporter{r}.backoff(p, d.digest, nil)
	case StateFailedInstall:
		c.backoffAction = "Install"
		c.gates.backoff, c.failure = reporter{r}.backoff(p, d.digest, []*helm.Release{o.Latest})
	case StateLocked:
		c.gates.lockLive, c.lockRecheck, c.lock = r.lockHolderLive(ctx, o.Latest)
	case StateInterrupted:
		c.gates.slotFree = r.slots.free(p.key)
	case StateOutOfSync:
		c.backoffAction = "Upgrade"
		c.condemned, c.gates.condemned = unhealthyFailure(history, d.digest, p.requested)
		c.gates.backoff, c.failure = reporter{r}.backoff(p, d.digest, history)
		if !c.gates.condemned && c.gates.backoff == 0 && d.isVersionChange() {
			c.rollout = chartVersions{r}.rolloutHold(ctx, p, d)
			c.gates.rolloutHold = c.rollout != nil
		}
		c.gates.slotFree = r.slots.free(p.key)
	case StateInSync:
		c.gates.healthy = o.Latest.Revision > 0 && m.healthyRev == o.Latest.Revision
	}
	if o.State == StateInSync || o.State == StateOutOfSync {
		c.apiRewrite = r.apiRewriteGate(ctx, p, d, o.Latest, history)
		c.gates.unservedAPIs = c.apiRewrite != nil
	}
	return c
}

// hold carries out the actions that wait: back-off, no slot, a rollout
// gate, condemned inputs, a release that is not chartpilot's.
func (r *Reconciler) hold(p *pass, a action, o Observation, c choice) ctrl.Result {
	switch a {
	case actBackOff:
		setCondition(p.status, p.obj, v1alpha1.ConditionReconciling, metav1.ConditionTrue, "BackingOff",
			fmt.Sprintf("%s failed %d time(s) on these inputs; next try in %s unless the spec changes or %s is set", c.backoffAction, c.failure.Count, c.gates.backoff.Round(time.Second), v1alpha1.AnnotationReconcileRequestedAt))
		return ctrl.Result{RequeueAfter: c.gates.backoff}
	case actQueue:
		return healthGate{r}.queued(p)
	case actHoldRollout:
		return chartVersions{r}.waitRollout(p, *c.rollout)
	case actHoldUnhealthy:
		setCondition(p.status, p.obj, v1alpha1.ConditionReconciling, metav1.ConditionTrue, "UpgradeFailed",
			fmt.Sprintf("these inputs were rolled back (revision %d: %s); change the spec or set %s to try again", c.condemned.Revision, strings.TrimPrefix(c.condemned.Description, unhealthyPrefix), v1alpha1.AnnotationReconcileRequestedAt))
		return ctrl.Result{RequeueAfter: r.Watch.ReconcilePeriod}
	case actStallForeign:
		r.stallForeign(p, o)
		return ctrl.Result{}
	case actWaitLock:
		return r.waitForLock(p, o, c)
	}
	return ctrl.Result{}
}

// stallForeign leaves a release that is not this resource's alone.
func (r *Reconciler) stallForeign(p *pass, o Observation) {
	if o.State == StateUnmanaged {
		reporter{r}.stall(p, "ReleaseNotManaged", fmt.Sprintf("a Helm release %q already exists in %s and was not installed by chartpilot: nothing was changed; set annotation %s: \"true\" to take it over, or rename this resource", p.key.Name, p.key.Namespace, v1alpha1.AnnotationAdopt))
		return
	}
	reporter{r}.stall(p, "ReleaseConflict", fmt.Sprintf("the Helm release %q in %s belongs to another object (uid %s, kind %s): nothing was changed; rename this resource or uninstall the other release", p.key.Name, p.key.Namespace, o.Latest.Labels[v1alpha1.LabelOwnerUID], o.Latest.Labels[v1alpha1.LabelOwnerKind]))
}
