package release

import "time"

// action is what one pass does to a release; exactly one runs per pass.
type action string

// Actions, as chosen by nextAction.
const (
	actNone          action = "None"          // in sync and healthy: nothing to do
	actInstall       action = "Install"       // no release yet
	actUpgrade       action = "Upgrade"       // new inputs, or finish an interrupted upgrade
	actRollback      action = "Rollback"      // the newest revision failed: back to the last good one
	actUnlock        action = "Unlock"        // a revision left pending by a dead process
	actCleanup       action = "Cleanup"       // remove a release that never deployed, to install again
	actDiscard       action = "Discard"       // a revision broken off by an API error: drop its record, act again
	actCheckHealth   action = "CheckHealth"   // a fresh revision: wait for its workloads
	actCorrectDrift  action = "CorrectDrift"  // set changed or deleted objects back
	actBackOff       action = "BackOff"       // the same inputs failed recently: wait
	actQueue         action = "Queue"         // no upgrade slot free: wait for one
	actHoldRollout   action = "HoldRollout"   // a maintenance window or canaries hold the new chart version
	actHoldUnhealthy action = "HoldUnhealthy" // these inputs were rolled back as unhealthy
	actStallForeign  action = "StallForeign"  // the release is not chartpilot's, or another object's
	actWaitLock      action = "WaitLock"      // a live replica's action holds the release
	actRewriteAPIs   action = "RewriteAPIs"   // the stored manifest names API versions no longer served
)

// gates are the facts besides the release's state that the choice of action
// depends on. They are read before the choice, from memory and caches.
type gates struct {
	// backoff > 0: the action these inputs call for failed recently.
	backoff time.Duration
	// condemned: these inputs were rolled back because they never became healthy.
	condemned bool
	// rolloutHold: a window or canaries hold this chart version change.
	rolloutHold bool
	// slotFree: an upgrade slot is held or free.
	slotFree bool
	// healthy: the newest revision was seen healthy.
	healthy bool
	// driftDue: the release's objects may have changed.
	driftDue bool
	// lockLive: the holder of a pending revision may still be working on it.
	lockLive bool
	// brokenOff: the newest revision failed only because a request to the
	// API server did (throttling, a server error, a lost connection).
	brokenOff bool
	// unservedAPIs: the newest revision is deployed, its stored manifest
	// names API versions the cluster no longer serves, and their served
	// replacements hold the same (planAPIRewrite).
	unservedAPIs bool
}

// nextAction chooses the one action a pass takes, from the observed
// release and the gates. It is a pure function (see its table test).
func nextAction(o Observation, g gates) action {
	switch o.State {
	case StateAbsent:
		return waitOr(g, actInstall)
	case StateUnmanaged, StateConflict:
		return actStallForeign
	case StateLocked:
		if g.lockLive {
			return actWaitLock
		}
		return actUnlock
	case StateUninstalling:
		return actCleanup
	case StateFailedInstall:
		if g.brokenOff {
			return actDiscard
		}
		return waitOr(g, actCleanup)
	case StateFailedUpgrade:
		if g.brokenOff {
			return actDiscard
		}
		return actRollback
	case StateInterrupted:
		switch {
		case g.brokenOff:
			return actDiscard
		case o.LastGood == nil:
			return actCleanup
		}
		return upgradeOr(g)
	case StateOutOfSync:
		switch {
		case g.unservedAPIs:
			return actRewriteAPIs
		case g.condemned:
			return actHoldUnhealthy
		case g.backoff > 0:
			return actBackOff
		case g.rolloutHold:
			return actHoldRollout
		}
		return upgradeOr(g)
	case StateInSync:
		switch {
		case g.unservedAPIs:
			return actRewriteAPIs
		case !g.healthy:
			return actCheckHealth
		case g.driftDue:
			return actCorrectDrift
		}
	}
	return actNone
}

func waitOr(g gates, a action) action {
	if g.backoff > 0 {
		return actBackOff
	}
	return a
}

func upgradeOr(g gates) action {
	if !g.slotFree {
		return actQueue
	}
	return actUpgrade
}
