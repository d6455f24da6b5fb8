package release

import (
	"context"

	ctrl "sigs.k8s.io/controller-runtime"

	"github.com/chartpilot/chartpilot/internal/helm"
)

// An actionStep carries out one action that nextAction chooses. Each
// action is a type of its own, in its own file (action_*.go), registered
// with registerStep; run and fromCaches are the one loop each over
// nextAction, and neither names an action.
type actionStep interface {
	// full carries the action out in the full pass (the resource read
	// again, the history observed). next: the action's gate is passed,
	// and the pass chooses again.
	full(ctx context.Context, r *Reconciler, f *fullPass) (res ctrl.Result, next bool, err error)
}

// cachedStep is the capability of an action that can also be carried out
// from the informer caches alone (fromCaches). An action without it is
// never run by the cache path: the full pass takes it over. next: the
// gate is passed and the cache path chooses again; done false: the full
// pass is to observe and act.
type cachedStep interface {
	cached(ctx context.Context, r *Reconciler, p *pass, d *desired, v *cacheView) (res ctrl.Result, next, done bool)
}

// fullPass is what the full pass knows when it acts: the chosen action,
// what it observed, and the gates it read (a step may pass one).
type fullPass struct {
	a       action
	p       *pass
	d       *desired
	o       Observation
	history []*helm.Release
	c       *choice
}

// maxChoices bounds the choices of one pass: a gate passed makes the pass
// choose again (health, then drift, then nothing), and a step that says
// so without passing its gate must not keep a worker forever.
const maxChoices = 4

// steps are the registered action types.
var steps = map[action]actionStep{}

// registerStep makes s the carrying out of a (at package initialisation,
// from the action's own file).
func registerStep(a action, s actionStep) struct{} {
	if _, dup := steps[a]; dup {
		panic("release: two steps for action " + string(a))
	}
	steps[a] = s
	return struct{}{}
}

// stepFor is the step of a; an action with none waits (holdStep), never
// acts.
func stepFor(a action) actionStep {
	if s, ok := steps[a]; ok {
		return s
	}
	return holdStep{}
}

// cachedStepFor is a's cache-path variant, when it has one.
func cachedStepFor(a action) (cachedStep, bool) {
	cs, ok := stepFor(a).(cachedStep)
	return cs, ok
}
