package release

import (
	"context"
	"testing"

	ctrl "sigs.k8s.io/controller-runtime"
)

// everyAction is every action nextAction can choose.
var everyAction = []action{actNone, actInstall, actUpgrade, actRollback, actUnlock, actCleanup, actDiscard,
	actCheckHealth, actCorrectDrift, actBackOff, actQueue, actHoldRollout, actHoldUnhealthy, actStallForeign, actWaitLock, actRewriteAPIs}

// Every action has a step of its own, and exactly these have a variant
// the cache path may run: nothing, the health gate, the drift check, the
// waits for a slot or a rollout gate, and the slot reservation before an
// upgrade.
func TestEveryActionHasItsStep(t *testing.T) {
	cached := map[action]bool{actNone: true, actCheckHealth: true, actCorrectDrift: true, actQueue: true, actHoldRollout: true, actUpgrade: true}
	for _, a := range everyAction {
		if _, ok := steps[a]; !ok {
			t.Errorf("action %s has no step (registerStep in its file)", a)
		}
		if _, ok := cachedStepFor(a); ok != cached[a] {
			t.Errorf("action %s: cached variant %v, want %v", a, ok, cached[a])
		}
	}
	if len(steps) != len(everyAction) {
		t.Errorf("%d steps registered for %d actions", len(steps), len(everyAction))
	}
}

// recordingStep records what the cache path ran of it.
type recordingStep struct{ ran *[]string }

func (s recordingStep) full(context.Context, *Reconciler, *fullPass) (ctrl.Result, bool, error) {
	*s.ran = append(*s.ran, "full")
	return ctrl.Result{}, false, nil
}

// recordingCachedStep also has a cached variant, whose gate passes once.
type recordingCachedStep struct{ recordingStep }

func (s recordingCachedStep) cached(context.Context, *Reconciler, *pass, *desired, *cacheView) (ctrl.Result, bool, bool) {
	*s.ran = append(*s.ran, "cached")
	return ctrl.Result{}, len(*s.ran) == 1, true
}

// An action without a cached variant is never run by the cache path: it
// ends there, for the full pass to carry it out; one with a variant runs
// it, and the cache path chooses again while its gate passes.
func TestCachePathRunsOnlyCachedVariants(t *testing.T) {
	const fullOnly, withCache action = "TestFullOnly", "TestWithCache"
	var ran []string
	registerStep(fullOnly, recordingStep{&ran})
	registerStep(withCache, recordingCachedStep{recordingStep{&ran}})
	t.Cleanup(func() { delete(steps, fullOnly); delete(steps, withCache) })

	if _, done := runCached(context.Background(), nil, nil, nil, &cacheView{}, func(*cacheView) action { return fullOnly }); done || len(ran) != 0 {
		t.Errorf("an action without a cached variant: done %v, ran %v; want the full pass to take it, nothing run", done, ran)
	}
	choices := []action{withCache, fullOnly}
	_, done := runCached(context.Background(), nil, nil, nil, &cacheView{}, func(*cacheView) action {
		a := choices[0]
		choices = choices[1:]
		return a
	})
	if done || len(ran) != 1 || ran[0] != "cached" {
		t.Errorf("a cached variant whose gate passed, then an action without one: done %v, ran %v; want [cached], then the full pass", done, ran)
	}
}

// A step that says its gate passed without passing it does not keep the
// cache path choosing forever: after maxChoices it goes to the full pass.
func TestCachePathChoicesBounded(t *testing.T) {
	const loops action = "TestLoops"
	var ran []string
	registerStep(loops, loopingStep{recordingStep{&ran}})
	t.Cleanup(func() { delete(steps, loops) })
	if _, done := runCached(context.Background(), nil, nil, nil, &cacheView{}, func(*cacheView) action { return loops }); done || len(ran) != maxChoices {
		t.Errorf("done %v after %d runs, want the full pass after %d", done, len(ran), maxChoices)
	}
}

// loopingStep always says its gate passed.
type loopingStep struct{ recordingStep }

func (s loopingStep) cached(context.Context, *Reconciler, *pass, *desired, *cacheView) (ctrl.Result, bool, bool) {
	*s.ran = append(*s.ran, "cached")
	return ctrl.Result{}, true, true
}
