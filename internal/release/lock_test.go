package release

import (
	"testing"
	"time"
)

func TestLockLive(t *testing.T) {
	now := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	young := now.Add(-5 * time.Second)
	maxAge := 75 * time.Second
	single := Holder{Identity: "me"}
	elected := Holder{Identity: "me", LeaseNamespace: "ops", LeaseName: "a"}
	liveLease := &leaseState{holder: "other", expires: now.Add(10 * time.Second)}
	for _, tc := range []struct {
		name  string
		lock  lockInfo
		self  Holder
		lease *leaseState
		live  bool
	}{
		{"no holder recorded", lockInfo{startedAt: young}, elected, nil, false},
		{"no start time recorded", lockInfo{holder: "other", lease: "b", leaseNamespace: "ops"}, elected, liveLease, false},
		{"older than the action could run", lockInfo{holder: "other", lease: "b", leaseNamespace: "ops", startedAt: now.Add(-2 * maxAge)}, elected, liveLease, false},
		{"this process: no action of ours runs on it", lockInfo{holder: "me", lease: "a", leaseNamespace: "ops", startedAt: young}, elected, &leaseState{holder: "me", expires: now.Add(time.Minute)}, false},
		{"single replica: any other holder is gone", lockInfo{holder: "other", startedAt: young}, single, nil, false},
		{"holder outside leader election, we elect: wait for the age", lockInfo{holder: "other", startedAt: young}, elected, nil, true},
		{"holder holds its lease", lockInfo{holder: "other", lease: "b", leaseNamespace: "ops", startedAt: young}, elected, liveLease, true},
		{"holder holds its lease, we run alone", lockInfo{holder: "other", lease: "b", leaseNamespace: "ops", startedAt: young}, single, liveLease, true},
		{"lease gone", lockInfo{holder: "other", lease: "b", leaseNamespace: "ops", startedAt: young}, elected, nil, false},
		{"lease expired", lockInfo{holder: "other", lease: "b", leaseNamespace: "ops", startedAt: young}, elected, &leaseState{holder: "other", expires: now.Add(-time.Second)}, false},
		{"lease held by another replica", lockInfo{holder: "other", lease: "b", leaseNamespace: "ops", startedAt: young}, elected, &leaseState{holder: "third", expires: now.Add(time.Minute)}, false},
	} {
		live, recheck := lockLive(tc.lock, tc.self, tc.lease, now, maxAge)
		if live != tc.live {
			t.Errorf("%s: live = %v, want %v", tc.name, live, tc.live)
		}
		if live && (recheck <= 0 || recheck > lockRecheck) {
			t.Errorf("%s: recheck %s, want in (0, %s]", tc.name, recheck, lockRecheck)
		}
	}
}
