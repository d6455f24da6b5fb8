package release

import (
	"strconv"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/types"

	"github.com/chartpilot/chartpilot/internal/api/v1alpha1"
)

// memo is what this process remembers of one resource between passes. None
// of it is needed for correctness after a restart: every decision is made
// again from observed state, and memo only saves work and requests.
type memo struct {
	// seen: reconciled since start; requested is the reconcile-requested-at
	// token last handled (a new one asks for a drift check).
	seen      bool
	requested string
	// driftDue: an event of the release's objects may be drift;
	// driftRecheck: the caches showed a difference, to be looked at again.
	driftDue     bool
	driftRecheck bool
	// failure is the last failed action (status may lag behind it).
	failure *v1alpha1.Failure
	// statusSettled: Kind.Status asked for nothing more.
	statusSettled bool
	// healthyRev is the revision last seen healthy.
	healthyRev int
	// awaiting: the health gate waits on the workloads; healthLooks counts
	// its looks at revision healthLooksRev, for their back-off.
	awaiting       bool
	healthLooks    int
	healthLooksRev int
	// owed is a status a pass did not write because the next pass was due
	// within a moment (see Reconciler.owe); that pass starts from it.
	owed      *v1alpha1.ReleaseStatus
	owedSince time.Time
	owedUID   types.UID
	// wroteRV is the resource version this process's last write of the
	// resource (finalizer, status) returned.
	wroteRV string
	// refreshToken is the reconcile-requested-at value that last refreshed
	// the chart source.
	refreshToken string
	// waiting is why a rollout gate holds the resource ("" when it does not).
	waiting string
	// brokenOff is the newest revision when an action on it was broken off
	// by a transient API error (0: none): the next pass carries on from it
	// instead of treating it as failed. transients counts such errors in a
	// row, for the short delay before the next try.
	brokenOff  int
	transients int
	// workloadsDue: a workload of the release changed between available
	// and not (its status), to be looked at by the next pass.
	workloadsDue bool
	// unavailable: the last look found workloads unavailable; until they
	// are back, every status change of them is looked at (so that the
	// kind's status, such as ready replicas, follows).
	unavailable bool
	// retries counts the failures in a row of actions retried on their own
	// (rollback, uninstall), for their back-off.
	retries map[string]int
	// infoSeries is the chart, version and status of the resource's
	// chartpilot_release_info series set by this process (zero: none).
	infoSeries [3]string
	// apiSeries are the resource's chartpilot_release_deprecated_api_objects
	// series set by this process, with their values.
	apiSeries map[apiSeries]int
	// apiRewriteNote is why the stored manifest was last found not safe
	// to rewrite (RewriteAPIs), told once.
	apiRewriteNote string
}

// memory holds one memo per resource behind one lock.
type memory struct {
	mu sync.Mutex
	m  map[types.NamespacedName]*memo
	// onWaiting is told the count of resources per waiting reason whenever
	// one changes (metrics).
	onWaiting func(counts map[string]int)
}

// with runs f on key's memo (made on first use) under the lock.
func (m *memory) with(key types.NamespacedName, f func(*memo)) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.m == nil {
		m.m = map[types.NamespacedName]*memo{}
	}
	e := m.m[key]
	if e == nil {
		e = &memo{}
		m.m[key] = e
	}
	f(e)
}

// get returns a copy of key's memo (the zero memo when none).
func (m *memory) get(key types.NamespacedName) memo {
	m.mu.Lock()
	defer m.mu.Unlock()
	if e := m.m[key]; e != nil {
		return *e
	}
	return memo{}
}

// forget drops key's memo.
func (m *memory) forget(key types.NamespacedName) {
	m.mu.Lock()
	defer m.mu.Unlock()
	delete(m.m, key)
	m.countWaitingLocked()
}

// takeDrift reports whether a drift check is due for key (flagged, first
// pass since start, or a new reconcile request) and clears the flag.
func (m *memory) takeDrift(key types.NamespacedName, requested string) (due bool) {
	m.with(key, func(e *memo) {
		due = e.driftDue || !e.seen || e.requested != requested
		e.driftDue, e.seen, e.requested = false, true, requested
	})
	return due
}

// setWaiting records why key waits for a rollout gate ("" for not waiting);
// it reports whether the reason changed.
func (m *memory) setWaiting(key types.NamespacedName, reason string) (changed bool) {
	m.with(key, func(e *memo) {
		if e.waiting != reason {
			e.waiting, changed = reason, true
		}
	})
	if changed {
		m.mu.Lock()
		m.countWaitingLocked()
		m.mu.Unlock()
	}
	return changed
}

// waitingFor lists the resources that wait for one of reasons.
func (m *memory) waitingFor(reasons ...string) []types.NamespacedName {
	m.mu.Lock()
	defer m.mu.Unlock()
	var out []types.NamespacedName
	for key, e := range m.m {
		for _, why := range reasons {
			if e.waiting == why {
				out = append(out, key)
			}
		}
	}
	return out
}

func (m *memory) countWaitingLocked() {
	if m.onWaiting == nil {
		return
	}
	counts := map[string]int{reasonWindow: 0, reasonInvalidWindow: 0, reasonCanaries: 0, reasonHalted: 0, reasonQueued: 0}
	for _, e := range m.m {
		if e.waiting != "" {
			counts[e.waiting]++
		}
	}
	m.onWaiting(counts)
}

// retryAfter counts one more failure of action for key and returns the
// back-off before the next try: 15s, 30s, 1m, ... capped at 15m.
func (m *memory) retryAfter(key types.NamespacedName, action string) time.Duration {
	n := 0
	m.with(key, func(e *memo) {
		if e.retries == nil {
			e.retries = map[string]int{}
		}
		e.retries[action]++
		n = e.retries[action]
	})
	return backoffDelay(n)
}

// retried forgets the failures of action for key (it succeeded).
func (m *memory) retried(key types.NamespacedName, action string) {
	m.with(key, func(e *memo) { delete(e.retries, action) })
}

// healthLookAfter counts one more look of the health gate at revision rev
// of key that found the workloads settling, and returns when to look again
// on its own: healthPoll, doubling to healthPollMax. The workloads' own
// status changes wake the gate sooner; the look on its own is a safety net
// that costs less the longer a release stays unready.
func (m *memory) healthLookAfter(key types.NamespacedName, rev int) time.Duration {
	n := 0
	m.with(key, func(e *memo) {
		if e.healthLooksRev != rev {
			e.healthLooksRev, e.healthLooks = rev, 0
		}
		e.healthLooks++
		n = e.healthLooks
	})
	d := healthPoll
	for i := 1; i < n && d < healthPollMax; i++ {
		d *= 2
	}
	return min(d, healthPollMax)
}

// wrote records the resource version a write of key's resource returned.
func (m *memory) wrote(key types.NamespacedName, rv string) {
	m.with(key, func(e *memo) { e.wroteRV = rv })
}

// behind reports whether rv (the cache's) is older than this process's
// last write of key's resource.
func (m *memory) behind(key types.NamespacedName, rv string) bool {
	e := m.get(key)
	return e.wroteRV != "" && olderRV(rv, e.wroteRV)
}

// olderRV reports whether resource version a is older than b (both etcd
// revisions; a version that is not a number is never older).
func olderRV(a, b string) bool {
	x, err1 := strconv.ParseUint(a, 10, 64)
	y, err2 := strconv.ParseUint(b, 10, 64)
	return err1 == nil && err2 == nil && x < y
}
