package instance

import (
	"time"
)

// electionView is what a member knows when the primary's Lease is expired
// (or was never held): everything the election rule reads, gathered by
// elect before it decides. It holds no client and no server.
type electionView struct {
	self string // this member's name
	role string // this member's role
	// running: this member's server runs; initialized: it has a data directory.
	running, initialized bool
	// previous is the member the Lease names (empty: never held);
	// transitions is the Lease's leaseTransitions.
	previous    string
	transitions int32
	// expiredAt is when the Lease ran out: only reports after it are final.
	expiredAt time.Time
	members   []member
	// timeline and lsn: this standby's own position (read only when it is a
	// running standby); reported is the position it last wrote to its Lease.
	timeline, lsn, reported uint64
	// synchronous is the number of synchronous standbys configured.
	synchronous int
	// lastPrimaryLSN is the newest position the primary reported;
	// maxLagBytes bounds how far behind it a standby may promote (0: no bound).
	lastPrimaryLSN uint64
	maxLagBytes    int64
}

// newCluster reports whether the Lease was never held and this member has
// no data: the one case in which a cluster may be bootstrapped.
func (v electionView) newCluster() bool {
	return v.previous == "" && !v.initialized && v.transitions == 0
}

// electionAction is what a member does with an expired Lease.
type electionAction int

const (
	// electNothing: another member leads or promotes; nothing to say.
	electNothing electionAction = iota
	// electWait: this member may promote later; reason says what it waits for.
	electWait
	// electFence: the Lease ran out under this primary: stop its server.
	electFence
	// electBootstrap: take the Lease and initialise a new cluster.
	electBootstrap
	// electRestart: a member whose server is not running starts it with no primary.
	electRestart
	// electPromote: take the Lease and promote this standby.
	electPromote
)

// electionStep is the rule's answer: an action, why (for a wait), and for a
// promotion how far behind the last primary it is.
type electionStep struct {
	action electionAction
	reason string
	kv     []any
	// lag is how many bytes this standby is behind the last primary.
	lag int64
	// lastPrimaryLSN is the newest primary position known, to remember.
	lastPrimaryLSN uint64
}

// decideElection is the election rule, with no I/O. The first member of a
// cluster whose Lease was never held bootstraps it, unless another live
// member has data. Once a primary existed, only a running standby
// promotes, and only once positions are final: every other live standby
// must have reported after the expiry (the old primary fenced itself
// before it, so no WAL came later) a position that had stopped moving (a
// standby started without a primary replays its own WAL first), and so
// must this one. A newer timeline wins over any position on an older one,
// then the higher position, then the lower name. With a synchronous
// standby, the one the last primary named must be among those reporting
// (or be this one): a commit acknowledged to a client may exist only on
// it, so without it no one promotes (writes wait; nothing acknowledged is
// lost). A last primary that named none (it stopped within a step of a
// standby's first acknowledgement) makes every member one that must
// report. A standby further behind the last primary than maxLagBytes does
// not promote.
func decideElection(v electionView) electionStep {
	if v.role == RolePrimary {
		return electionStep{action: electFence}
	}
	// Only a cluster whose Lease was never held is bootstrapped: once a
	// primary existed its data is somewhere (a member restarting on an
	// empty volume, with the Lease released, waits for it), and a second
	// cluster beside it would split the data.
	if v.newCluster() {
		for _, o := range v.members {
			if o.name != v.self && o.fresh && o.role != RoleStopped {
				return electionStep{action: electNothing} // another member has data: it leads
			}
		}
		return electionStep{action: electBootstrap}
	}
	if v.role != RoleStandby || !v.running {
		return electionStep{action: electRestart} // only a running standby promotes
	}
	if step, ok := mayPromote(v); !ok {
		return step
	}
	last := v.lastPrimaryLSN
	if p, ok := find(v.members, v.previous); ok {
		last = max(last, p.lsn)
	}
	lag := int64(last) - int64(v.lsn)
	if v.maxLagBytes > 0 && lag > v.maxLagBytes {
		return electionStep{action: electWait, lastPrimaryLSN: last,
			reason: "this standby is further behind the last primary than maxLagBytes", kv: []any{"lagBytes", lag}}
	}
	return electionStep{action: electPromote, lag: max(lag, 0), lastPrimaryLSN: last}
}

// mayPromote is the part of the rule that compares positions: ok when this
// standby is the one to promote, else the step to take instead (a wait, or
// nothing when a more advanced standby promotes).
func mayPromote(v electionView) (electionStep, bool) {
	wait := func(reason string, kv ...any) (electionStep, bool) {
		return electionStep{action: electWait, reason: reason, kv: kv}, false
	}
	after := func(o member) bool { return o.fresh && o.role == RoleStandby && !o.at.Before(v.expiredAt) }
	final := func(o member) bool { return after(o) && o.positioned && o.settled }
	if v.lsn != v.reported {
		return wait("this standby's position is still moving", "lsn", formatLSN(v.lsn))
	}
	if p, ok := find(v.members, v.previous); ok && v.synchronous > 0 {
		named, reason := p.synchronous, "the last primary's synchronous standby has not reported since it stopped: commits acknowledged by it alone would be lost"
		if len(named) == 0 {
			// The last primary stopped before it named a synchronous
			// standby (it names the one acknowledging at its next step):
			// any member may hold commits acknowledged by it alone, so
			// every one reports, a server still starting too.
			reason = "the last primary named no synchronous standby before it stopped: every member must report, one may hold commits acknowledged by it alone"
			for _, o := range v.members {
				if o.name != v.previous {
					named = append(named, o.name)
				}
			}
		}
		var missing []string
		for _, name := range named {
			if name == v.self {
				continue
			}
			if o, ok := find(v.members, name); !ok || !final(o) {
				missing = append(missing, name)
			}
		}
		if len(missing) > 0 {
			return wait(reason, "synchronous", missing)
		}
	}
	for _, o := range v.members {
		if o.name == v.self || !o.fresh || o.role != RoleStandby {
			continue
		}
		if after(o) && !o.positioned {
			continue // it reports no position (its server does not answer): it cannot promote, and is not waited for
		}
		if !final(o) {
			return wait("waiting for every live standby's position after the primary's lease expired", "member", o.name)
		}
		if ahead(o.timeline, o.lsn, v.timeline, v.lsn) || (o.timeline == v.timeline && o.lsn == v.lsn && o.name < v.self) {
			return electionStep{action: electNothing}, false // a more advanced standby promotes
		}
	}
	return electionStep{}, true
}
