package release

import (
	"slices"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/types"
)

func TestMemory(t *testing.T) {
	var m memory
	var counts map[string]int
	m.onWaiting = func(c map[string]int) { counts = c }
	a, b := types.NamespacedName{Namespace: "ns", Name: "a"}, types.NamespacedName{Namespace: "ns", Name: "b"}
	if !m.takeDrift(a, "") {
		t.Error("the first pass since start checks drift")
	}
	if m.takeDrift(a, "") {
		t.Error("a second pass with nothing flagged checks no drift")
	}
	m.with(a, func(e *memo) { e.driftDue = true })
	if !m.takeDrift(a, "") || m.takeDrift(a, "") {
		t.Error("a flagged drift is checked once")
	}
	if !m.takeDrift(a, "t1") {
		t.Error("a new reconcile request checks drift")
	}
	if !m.setWaiting(a, reasonCanaries) || m.setWaiting(a, reasonCanaries) || !m.setWaiting(b, reasonQueued) {
		t.Error("setWaiting reports changes only")
	}
	if counts[reasonCanaries] != 1 || counts[reasonQueued] != 1 || counts[reasonWindow] != 0 {
		t.Errorf("waiting counts %v", counts)
	}
	if got := m.waitingFor(reasonCanaries, reasonHalted); len(got) != 1 || got[0] != a {
		t.Errorf("waitingFor = %v, want [a]", got)
	}
	m.forget(a)
	if e := m.get(a); e.seen || e.waiting != "" {
		t.Errorf("forgotten memo still there: %+v", e)
	}
	if counts[reasonCanaries] != 0 {
		t.Errorf("a forgotten resource still counts as waiting: %v", counts)
	}
}

func TestRetryBackOff(t *testing.T) {
	var m memory
	key := types.NamespacedName{Namespace: "ns", Name: "a"}
	var got []time.Duration
	for range 4 {
		got = append(got, m.retryAfter(key, "Rollback"))
	}
	if want := []time.Duration{15 * time.Second, 30 * time.Second, time.Minute, 2 * time.Minute}; !slices.Equal(got, want) {
		t.Errorf("rollback failures in a row wait %v, want %v", got, want)
	}
	if d := m.retryAfter(key, "Uninstall"); d != 15*time.Second {
		t.Errorf("another action's count: %s", d)
	}
	m.retried(key, "Rollback")
	if d := m.retryAfter(key, "Rollback"); d != 15*time.Second {
		t.Errorf("after a success: %s, want 15s", d)
	}
	for range 20 {
		m.retryAfter(key, "Rollback")
	}
	if d := m.retryAfter(key, "Rollback"); d != backoffMax {
		t.Errorf("capped at %s, got %s", backoffMax, d)
	}
}

// The health gate's own looks at a settling release back off (events of
// its workloads wake it sooner); a new revision starts again at healthPoll.
func TestHealthLooksBackOff(t *testing.T) {
	var m memory
	key := types.NamespacedName{Namespace: "ns", Name: "a"}
	var got []time.Duration
	for range 8 {
		got = append(got, m.healthLookAfter(key, 2))
	}
	want := []time.Duration{2 * time.Second, 4 * time.Second, 8 * time.Second, 16 * time.Second, 32 * time.Second, 64 * time.Second, 2 * time.Minute, 2 * time.Minute}
	if !slices.Equal(got, want) {
		t.Errorf("looks at a settling revision wait %v, want %v", got, want)
	}
	if d := m.healthLookAfter(key, 3); d != healthPoll {
		t.Errorf("the first look at a new revision waits %s, want %s", d, healthPoll)
	}
}
