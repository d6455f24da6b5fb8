package release

import (
	"context"

	ctrl "sigs.k8s.io/controller-runtime"
)

// holdStep carries out the actions that wait (BackOff, HoldUnhealthy,
// StallForeign, WaitLock): the status says why, nothing is changed.
type holdStep struct{}

var (
	_ = registerStep(actBackOff, holdStep{})
	_ = registerStep(actHoldUnhealthy, holdStep{})
	_ = registerStep(actStallForeign, holdStep{})
	_ = registerStep(actWaitLock, holdStep{})
)

func (holdStep) full(_ context.Context, r *Reconciler, f *fullPass) (ctrl.Result, bool, error) {
	return r.hold(f.p, f.a, f.o, *f.c), false, nil
}

// queueStep is the Queue action: every upgrade slot is taken.
type queueStep struct{ holdStep }

var _ = registerStep(actQueue, queueStep{})

// cached waits for a slot without reading anything (a freed slot wakes
// the resource).
func (queueStep) cached(_ context.Context, r *Reconciler, p *pass, _ *desired, _ *cacheView) (ctrl.Result, bool, bool) {
	return healthGate{r}.queued(p), false, true
}

// holdRolloutStep is the HoldRollout action: a maintenance window or
// canaries hold the new chart version.
type holdRolloutStep struct{ holdStep }

var _ = registerStep(actHoldRollout, holdRolloutStep{})

func (holdRolloutStep) cached(_ context.Context, r *Reconciler, p *pass, _ *desired, v *cacheView) (ctrl.Result, bool, bool) {
	return chartVersions{r}.waitRollout(p, *v.c.rollout), false, true
}
