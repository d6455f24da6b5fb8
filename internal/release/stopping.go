package release

import (
	"context"
	"errors"
	"sync"
	"time"
)

// errStopping ends a pass that had not begun a Helm action when its
// manager was told to stop: it read and decided, but changed nothing that
// the next pass (in this process or the next leader) does not redo.
var errStopping = errors.New("the manager is stopping: the pass ended before its Helm action began")

// passGuard is what lets a pass's context go from "ends with the manager"
// to "runs to its end".
type passGuard struct {
	once sync.Once
	// detach unregisters the cancellation on the manager's stop; true
	// when it was still registered (the manager had not stopped).
	detach    func() bool
	cancel    context.CancelCauseFunc
	committed bool
}

type passGuardKey struct{}

// passContext is the context of one pass. Until the pass begins a Helm
// action (commit), the manager's stop (mgr) cancels it: the reads before
// an action wait on informers and the API server, and one that cannot
// complete while the manager stops (an informer that never syncs) would
// otherwise hold the stop for the whole PassTimeout. From the action on,
// the pass runs to its end, bounded by timeout only: a Helm action cut
// off half-way leaves a failed revision for the next leader to roll back.
func passContext(mgr context.Context, timeout time.Duration) (context.Context, context.CancelFunc) {
	bounded, cancelBounded := context.WithTimeout(context.WithoutCancel(mgr), timeout)
	ctx, cancel := context.WithCancelCause(bounded)
	g := &passGuard{detach: context.AfterFunc(mgr, func() { cancel(errStopping) }), cancel: cancel}
	return context.WithValue(ctx, passGuardKey{}, g), func() {
		g.detach()
		cancel(nil)
		cancelBounded()
	}
}

// commit is called just before a Helm action, or a write the pass must
// follow through (a StatefulSet deleted to grow its volumes, release
// records deleted or rewritten): from here on the manager's stop no
// longer cancels the pass. It fails with errStopping when the manager
// stopped first; the action is then not begun.
func commit(ctx context.Context) error {
	g, ok := ctx.Value(passGuardKey{}).(*passGuard)
	if !ok {
		return nil // not a pass's context (tests calling a step directly)
	}
	g.once.Do(func() {
		if g.committed = g.detach(); !g.committed {
			// The stop's cancellation may still be on its way (AfterFunc
			// runs it in a goroutine of its own): the pass ends by the
			// stop now, whatever the order.
			g.cancel(errStopping)
		}
	})
	if !g.committed {
		return errStopping
	}
	return nil
}

// endedByStop reports whether the pass of ctx ended because its manager
// stopped before it began a Helm action.
func endedByStop(ctx context.Context) bool {
	return errors.Is(context.Cause(ctx), errStopping)
}

// event records an event on the pass's resource, unless the pass ended
// because its manager stopped: what it would report then (a read or a
// hook cut short) is the stop, not the resource.
func (r *Reconciler) event(p *pass, eventtype, reason, message string) {
	if p.stopped != nil && p.stopped() {
		return
	}
	r.Recorder.Event(p.obj, eventtype, reason, message)
}
