package release

import (
	"context"
	"errors"
	"fmt"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ctrl "sigs.k8s.io/controller-runtime"

	"github.com/chartpilot/chartpilot/internal/api/v1alpha1"
	"github.com/chartpilot/chartpilot/internal/apiretry"
	"github.com/chartpilot/chartpilot/internal/helm"
)

// upgradeStep is the Upgrade action.
type upgradeStep struct{}

var _ = registerStep(actUpgrade, upgradeStep{})

// full takes an upgrade slot (or waits for one) and upgrades.
func (s upgradeStep) full(ctx context.Context, r *Reconciler, f *fullPass) (ctrl.Result, bool, error) {
	if !r.slots.begin(f.p.key) {
		return healthGate{r}.queued(f.p), false, nil
	}
	f.p.reserved = false // the upgrade holds the slot now
	r.setWaiting(f.p.key, "")
	res, err := s.run(ctx, r, f.p, f.d, f.o)
	return res, false, err
}

// cached reserves the slot before the full pass reads the resource and
// the history: passes that lose the race for the last slot queue here,
// having read nothing.
func (upgradeStep) cached(_ context.Context, r *Reconciler, p *pass, _ *desired, _ *cacheView) (ctrl.Result, bool, bool) {
	newly, ok := r.slots.reserve(p.key)
	if !ok {
		return healthGate{r}.queued(p), false, true
	}
	p.reserved = newly
	return ctrl.Result{}, false, false
}

// run upgrades (also how an interrupted upgrade is finished). The
// caller holds an upgrade slot.
func (upgradeStep) run(ctx context.Context, r *Reconciler, p *pass, d *desired, o Observation) (ctrl.Result, error) {
	opts := r.actionOptions(p, d, "Upgrade by chartpilot")
	from, prevRevision := "", 0
	if o.Latest != nil {
		from, prevRevision = o.Latest.ChartVersion, o.Latest.Revision
		opts.Force = d.force != "" && o.Latest.Labels[v1alpha1.LabelForceToken] != labelSafe(d.force)
	}
	if res, held := r.preUpgrade(ctx, p, d, from); held {
		return res, nil
	}
	if res, held, err := (storageGrowth{r}).growVolumes(ctx, p, d, o, opts); held || err != nil {
		r.slots.end(p.key)
		return res, err
	}
	setCondition(p.status, p.obj, v1alpha1.ConditionReconciling, metav1.ConditionTrue, "Upgrading", "upgrading to chart "+d.chart.Name+" "+d.chart.Version)
	rel, err := timed(ctx, "upgrade", func() (*helm.Release, error) { return r.Helm.As(d.identity).Upgrade(ctx, d.chart, opts) })
	if err != nil {
		r.slots.end(p.key)
		if errors.Is(err, errStopping) {
			return ctrl.Result{}, err // nothing begun: the next pass acts
		}
		if helm.IsRecordConflict(err) {
			return ctrl.Result{}, fmt.Errorf("upgrade: %w", err) // retried soon, not a failure of these inputs
		}
		if apiretry.Transient(err) {
			return reporter{r}.brokenOff(p, "Upgrade", err, rel), nil
		}
		if rel == nil || rel.Revision <= prevRevision || tooLarge(err) {
			res := reporter{r}.failed(p, d, "Upgrade", "UpgradeFailed", err, nil)
			reporter{r}.stall(p, renderStallReason(err), fmt.Sprintf("Upgrade failed before anything was applied; revision %d keeps running: %s", prevRevision, oneLine(err.Error())))
			return res, nil
		}
		// A failed revision is stored: the next pass rolls back to the last good one.
		res := reporter{r}.failed(p, d, "Upgrade", "UpgradeFailed", err, rel)
		return ctrl.Result{RequeueAfter: min(res.RequeueAfter, time.Second)}, nil
	}
	reporter{r}.succeeded(p, d, "Upgrade", "UpgradeSucceeded", fmt.Sprintf("upgraded to %s %s as revision %d", rel.ChartName, rel.ChartVersion, rel.Revision), rel)
	if from != rel.ChartVersion {
		rolloutUpgrades.WithLabelValues(r.Watch.GVK.Kind, rel.ChartVersion, rolloutResultDeployed).Inc()
	}
	r.afterDeploy(ctx, p, d, rel)
	return r.awaitHealth(p, rel), nil
}

// preUpgrade runs the PreUpgrade hooks; held is true when one holds the
// upgrade (it is looked at again in a minute).
func (r *Reconciler) preUpgrade(ctx context.Context, p *pass, d *desired, from string) (ctrl.Result, bool) {
	for _, h := range r.Hooks {
		if h.PreUpgrade == nil {
			continue
		}
		if err := h.PreUpgrade.PreUpgrade(ctx, d.hobj, from, d.chart.Version); err != nil {
			reporter{r}.hookRefused(p, h, err)
			setCondition(p.status, p.obj, v1alpha1.ConditionReconciling, metav1.ConditionTrue, "UpgradeBlocked", "hook "+h.Name+" holds the upgrade: "+oneLine(err.Error()))
			return ctrl.Result{RequeueAfter: time.Minute}, true
		}
		reporter{r}.hookPassed(p, h)
	}
	return ctrl.Result{}, false
}
