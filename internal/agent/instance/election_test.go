package instance

import (
	"testing"
	"time"
)

func TestDecideElection(t *testing.T) {
	expiry := time.Date(2026, 12, 3, 10, 0, 0, 0, time.UTC)
	before, after := expiry.Add(-time.Second), expiry.Add(time.Second)
	// standby is a live standby that reported a final position after the expiry.
	standby := func(name string, timeline, lsn uint64) member {
		return member{name: name, role: RoleStandby, timeline: timeline, lsn: lsn, positioned: true, settled: true, at: after, fresh: true}
	}
	oldPrimary := member{name: "pg-0", role: RolePrimary, timeline: 1, lsn: 1000, positioned: true, settled: true, at: before}
	syncPrimary := oldPrimary
	syncPrimary.synchronous = []string{"pg-2"}
	// failover is the common view: pg-1, a running standby at 1/900 that
	// reported that position, after pg-0's Lease expired.
	failover := func(members ...member) electionView {
		return electionView{
			self: "pg-1", role: RoleStandby, running: true, initialized: true,
			previous: "pg-0", transitions: 1, expiredAt: expiry,
			members:  append([]member{oldPrimary, standby("pg-1", 1, 900)}, members...),
			timeline: 1, lsn: 900, reported: 900,
		}
	}
	with := func(v electionView, f func(*electionView)) electionView { f(&v); return v }
	for _, tc := range []struct {
		name string
		view electionView
		want electionAction
		lag  int64
	}{
		{"the Lease ran out under this primary: it fences", with(failover(), func(v *electionView) { v.role = RolePrimary }), electFence, 0},
		{"a new cluster with no other member bootstraps",
			electionView{self: "pg-0", role: RoleStopped}, electBootstrap, 0},
		{"a new cluster where another live member has data: it leads",
			electionView{self: "pg-1", role: RoleStopped, members: []member{{name: "pg-0", role: RoleStandby, fresh: true}}}, electNothing, 0},
		{"a new cluster whose other member is stopped bootstraps",
			electionView{self: "pg-1", role: RoleStopped, members: []member{{name: "pg-0", role: RoleStopped, fresh: true}}}, electBootstrap, 0},
		{"a new cluster whose other member's report is stale bootstraps",
			electionView{self: "pg-1", role: RoleStopped, members: []member{{name: "pg-0", role: RoleStandby}}}, electBootstrap, 0},
		{"a Lease held before is never bootstrapped again, even with no data here",
			electionView{self: "pg-0", role: RoleStopped, transitions: 1}, electRestart, 0},
		{"a member with data and no primary starts its server",
			with(failover(), func(v *electionView) { v.role = RoleStopped; v.running = false }), electRestart, 0},
		{"a standby whose server stopped restarts it, it does not promote",
			with(failover(), func(v *electionView) { v.running = false }), electRestart, 0},
		{"the only standby, final, promotes 100 bytes behind", failover(), electPromote, 100},
		{"the position its server has is not what this standby reported: it waits",
			with(failover(), func(v *electionView) { v.lsn = 950 }), electWait, 0},
		{"another standby last reported before the expiry: wait for it",
			failover(func() member { m := standby("pg-2", 1, 800); m.at = before; return m }()), electWait, 0},
		{"another standby's position is still moving: wait for it",
			failover(func() member { m := standby("pg-2", 1, 800); m.settled = false; return m }()), electWait, 0},
		{"another standby is further ahead: it promotes", failover(standby("pg-2", 1, 950)), electNothing, 0},
		{"another standby on a newer timeline wins over a higher position",
			failover(standby("pg-2", 2, 500)), electNothing, 0},
		{"this standby on a newer timeline wins over a higher position on an older one",
			with(failover(standby("pg-2", 1, 990)), func(v *electionView) { v.timeline = 2 }), electPromote, 100},
		{"the same position: the lower name promotes", failover(standby("pg-0a", 1, 900)), electNothing, 0},
		{"the same position: this lower name promotes", failover(standby("pg-2", 1, 900)), electPromote, 100},
		{"a standby reporting no position after the expiry is not waited for",
			failover(member{name: "pg-2", role: RoleStandby, at: after, fresh: true}), electPromote, 100},
		{"a standby not heard from within a Lease duration is not waited for",
			failover(func() member { m := standby("pg-2", 1, 5000); m.fresh = false; return m }()), electPromote, 100},
		{"the last primary's synchronous standby has not reported since the expiry: no one promotes",
			with(failover(func() member { m := standby("pg-2", 1, 1000); m.at = before; return m }()), func(v *electionView) {
				v.synchronous = 1
				v.members[0] = syncPrimary
			}), electWait, 0},
		{"the last primary's synchronous standby is missing altogether: no one promotes",
			with(failover(), func(v *electionView) { v.synchronous = 1; v.members[0] = syncPrimary }), electWait, 0},
		{"the synchronous standby reported and is ahead: it promotes",
			with(failover(standby("pg-2", 1, 1000)), func(v *electionView) { v.synchronous = 1; v.members[0] = syncPrimary }), electNothing, 0},
		{"this standby is the synchronous one: it promotes",
			with(failover(), func(v *electionView) {
				v.synchronous = 1
				v.members[0] = syncPrimary
				v.members[0].synchronous = []string{"pg-1"}
			}), electPromote, 100},
		{"the last primary named no synchronous standby: a standby whose server does not answer yet is waited for",
			with(failover(member{name: "pg-2", role: RoleStandby, at: after, fresh: true}), func(v *electionView) { v.synchronous = 1 }), electWait, 0},
		{"the last primary named no synchronous standby: a member still starting (no role yet) is waited for",
			with(failover(member{name: "pg-2", at: after, fresh: true}), func(v *electionView) { v.synchronous = 1 }), electWait, 0},
		{"the last primary named no synchronous standby: a member not heard from is waited for",
			with(failover(func() member { m := standby("pg-2", 1, 800); m.fresh = false; return m }()), func(v *electionView) { v.synchronous = 1 }), electWait, 0},
		{"the last primary named no synchronous standby: every member final, the most advanced promotes",
			with(failover(standby("pg-2", 1, 950)), func(v *electionView) { v.synchronous = 1 }), electNothing, 0},
		{"the last primary named no synchronous standby: this one, the most advanced, promotes",
			with(failover(standby("pg-2", 1, 800)), func(v *electionView) { v.synchronous = 1 }), electPromote, 100},
		{"without synchronous standbys configured the primary's list is not waited for",
			with(failover(), func(v *electionView) { v.members[0] = syncPrimary }), electPromote, 100},
		{"further behind the last primary than maxLagBytes: it waits",
			with(failover(), func(v *electionView) { v.maxLagBytes = 50 }), electWait, 0},
		{"within maxLagBytes it promotes",
			with(failover(), func(v *electionView) { v.maxLagBytes = 100 }), electPromote, 100},
		{"the lag counts from the newest primary position remembered, not only its Lease's",
			with(failover(), func(v *electionView) { v.lastPrimaryLSN = 1200 }), electPromote, 300},
		{"a standby ahead of what the last primary reported is 0 bytes behind",
			with(failover(), func(v *electionView) { v.lsn, v.reported = 1100, 1100 }), electPromote, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := decideElection(tc.view)
			if got.action != tc.want {
				t.Fatalf("action %d (%s), want %d", got.action, got.reason, tc.want)
			}
			if got.action == electWait && got.reason == "" {
				t.Error("a wait gives no reason")
			}
			if got.action == electPromote && got.lag != tc.lag {
				t.Errorf("lag %d, want %d", got.lag, tc.lag)
			}
		})
	}
}

func TestDecideElectionRemembersThePrimaryPosition(t *testing.T) {
	v := electionView{
		self: "pg-1", role: RoleStandby, running: true, initialized: true, previous: "pg-0", transitions: 1,
		members:  []member{{name: "pg-0", role: RolePrimary, lsn: 5000}, {name: "pg-1", role: RoleStandby, lsn: 900, positioned: true, settled: true, fresh: true}},
		timeline: 1, lsn: 900, reported: 900, maxLagBytes: 10,
	}
	if got := decideElection(v); got.action != electWait || got.lastPrimaryLSN != 5000 {
		t.Fatalf("got %+v, want a wait that remembers position 5000", got)
	}
}
