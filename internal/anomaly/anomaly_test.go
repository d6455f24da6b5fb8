package anomaly

import (
	"strings"
	"testing"
	"time"
)

var t0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

func verdict(t *testing.T, vs []Verdict, sig Signal) Verdict {
	t.Helper()
	for _, v := range vs {
		if v.Signal == sig {
			return v
		}
	}
	t.Fatalf("no verdict for %s in %+v", sig, vs)
	return Verdict{}
}

// A release that never restarted: four restarts in a window are an
// anomaly, one is not.
func TestQuietReleaseFlagsACrashLoop(t *testing.T) {
	tr := NewTracker(Settings{}, t0)
	pod := Pod{UID: "a", Ready: true}
	now := t0
	for range 30 { // an hour of quiet, observed every 2 minutes
		now = now.Add(2 * time.Minute)
		tr.Observe(now, []Pod{pod}, false)
	}
	pod.Restarts = 1
	now = now.Add(10 * time.Second)
	tr.Observe(now, []Pod{pod}, false)
	if v := verdict(t, tr.Evaluate(now), Restarts); v.Anomalous || v.Count != 1 || v.Windows != 29 {
		t.Errorf("one restart after an hour of none: %+v", v)
	}
	for i := 2; i <= 4; i++ {
		pod.Restarts = int32(i)
		now = now.Add(20 * time.Second)
		tr.Observe(now, []Pod{pod}, false)
	}
	v := verdict(t, tr.Evaluate(now), Restarts)
	if !v.Anomalous || v.Count != 4 || v.Median != 0 || v.Score != 4 {
		t.Errorf("four restarts in a window after an hour of none: %+v", v)
	}
	if s := v.String(); !strings.Contains(s, "4 restarts in the last window against a normal of 0 (median of 29 windows, MAD 0): score 4.0") {
		t.Errorf("verdict reads %q", s)
	}
	// Two quiet windows later the count is back to normal.
	now = now.Add(4 * time.Minute)
	tr.Observe(now, []Pod{pod}, false)
	if v := verdict(t, tr.Evaluate(now), Restarts); v.Anomalous || v.Count != 0 {
		t.Errorf("after the restarts stopped: %+v", v)
	}
}

// A release whose pods restart about three times every window has that
// as its normal: three or five is not an anomaly, twenty is.
func TestNoisyReleaseHasItsOwnNormal(t *testing.T) {
	tr := NewTracker(Settings{}, t0)
	pod := Pod{UID: "a", Ready: true}
	now := t0
	tr.Observe(now, []Pod{pod}, false)
	for i := range 30 {
		now = now.Add(2 * time.Minute)
		pod.Restarts += int32(2 + i%3) // 2, 3, 4, 2, 3, 4, ...
		tr.Observe(now, []Pod{pod}, false)
	}
	now = now.Add(2 * time.Minute)
	pod.Restarts += 5
	tr.Observe(now, []Pod{pod}, false)
	if v := verdict(t, tr.Evaluate(now), Restarts); v.Anomalous || v.Median != 3 {
		t.Errorf("five restarts where 2-4 are usual: %+v", v)
	}
	now = now.Add(2 * time.Minute)
	pod.Restarts += 20
	tr.Observe(now, []Pod{pod}, false)
	if v := verdict(t, tr.Evaluate(now), Restarts); !v.Anomalous || v.Median != 3 || v.MAD != 1 {
		t.Errorf("twenty restarts where 2-4 are usual: %+v", v)
	}
}

// A pod not ready for most of a window is an anomaly; one that comes
// back within seconds is not. Time unready is counted while it lasts.
func TestUnreadyTime(t *testing.T) {
	tr := NewTracker(Settings{}, t0)
	a, b := Pod{UID: "a", Ready: true}, Pod{UID: "b", Ready: true}
	now := t0
	for range 10 {
		now = now.Add(2 * time.Minute)
		tr.Observe(now, []Pod{a, b}, false)
	}
	b.Ready = false
	tr.Observe(now, []Pod{a, b}, false)
	now = now.Add(10 * time.Second)
	b.Ready = true
	tr.Observe(now, []Pod{a, b}, false)
	vs := tr.Evaluate(now)
	if v := verdict(t, vs, UnreadySeconds); v.Anomalous || v.Count != 10 {
		t.Errorf("a pod unready for 10 s: %+v", v)
	}
	if v := verdict(t, vs, ReadinessChanges); v.Count != 2 || v.Anomalous {
		t.Errorf("a pod unready for 10 s, readiness changes: %+v", v)
	}
	b.Ready = false
	tr.Observe(now, []Pod{a, b}, false)
	now = now.Add(90 * time.Second) // no change observed: the time still counts
	if !tr.Active(now) {
		t.Error("a release with a pod unready is not active")
	}
	if v := verdict(t, tr.Evaluate(now), UnreadySeconds); !v.Anomalous || v.Count != 100 {
		t.Errorf("a pod unready for 90 s more: %+v", v)
	}
	// The pod is replaced: the old one's time up to its last sight counts.
	now = now.Add(5 * time.Minute)
	tr.Observe(now, []Pod{a, {UID: "c", Ready: true}}, false)
	if v := verdict(t, tr.Evaluate(now), UnreadySeconds); v.Anomalous || v.Count != 0 {
		t.Errorf("after the unready pod was replaced: %+v", v)
	}
	if tr.Active(now.Add(3 * time.Minute)) {
		t.Error("a quiet release stays active")
	}
}

// What happens while the release acts (its pods replaced by an upgrade)
// does not count.
func TestActingCountsNothing(t *testing.T) {
	tr := NewTracker(Settings{}, t0)
	a := Pod{UID: "a", Ready: true}
	now := t0.Add(time.Hour)
	tr.Observe(now, []Pod{a}, false)
	a.Ready, a.Restarts = false, 3
	now = now.Add(time.Minute)
	tr.Observe(now, []Pod{a}, true)
	now = now.Add(time.Minute)
	tr.Observe(now, []Pod{{UID: "b", Ready: false}}, true)
	now = now.Add(5 * time.Second)
	tr.Observe(now, []Pod{{UID: "b", Ready: true}}, false)
	for _, v := range tr.Evaluate(now) {
		if v.Signal == Restarts && v.Count != 0 || v.Count > 5 || v.Anomalous {
			t.Errorf("after an upgrade: %+v", v)
		}
	}
}

// With no history, the normal is 0; the history grows with the time
// followed, up to its bound.
func TestHistoryWindows(t *testing.T) {
	tr := NewTracker(Settings{Window: time.Minute, History: 10 * time.Minute}, t0)
	if v := tr.Evaluate(t0.Add(30 * time.Second)); v[0].Windows != 0 || v[0].Score != 0 {
		t.Errorf("at the start: %+v", v[0])
	}
	if v := tr.Evaluate(t0.Add(4 * time.Minute)); v[0].Windows != 3 {
		t.Errorf("after 4 minutes: %d windows", v[0].Windows)
	}
	if v := tr.Evaluate(t0.Add(time.Hour)); v[0].Windows != 10 {
		t.Errorf("after an hour: %d windows", v[0].Windows)
	}
}

// A pod first seen young counts the restarts it already has; one first
// seen old does not (they may be from long ago).
func TestFirstSightOfAPod(t *testing.T) {
	now := t0.Add(time.Hour)
	tr := NewTracker(Settings{}, t0)
	tr.Observe(now, []Pod{{UID: "young", Created: now.Add(-30 * time.Second), Restarts: 4, Ready: true}, {UID: "old", Created: now.Add(-10 * time.Minute), Restarts: 7, Ready: true}}, false)
	if v := verdict(t, tr.Evaluate(now), Restarts); v.Count != 4 || !v.Anomalous {
		t.Errorf("first sight of a young pod with 4 restarts and an old one with 7: %+v", v)
	}
}

// A pod whose readiness flaps many times a second costs a point and a
// span a second, and every flap still counts.
func TestFlappingPodStaysSmall(t *testing.T) {
	tr := NewTracker(Settings{}, t0)
	now := t0.Add(time.Hour)
	p := Pod{UID: "a", Ready: true}
	tr.Observe(now, []Pod{p}, false)
	for range 1000 { // 1000 changes, 10 ms apart
		now = now.Add(10 * time.Millisecond)
		p.Ready = !p.Ready
		tr.Observe(now, []Pod{p}, false)
	}
	if n, m := len(tr.counts[ReadinessChanges]), len(tr.spans); n > 11 || m > 11 {
		t.Errorf("10 s of flapping kept %d points and %d spans", n, m)
	}
	vs := tr.Evaluate(now)
	if v := verdict(t, vs, ReadinessChanges); v.Count != 1000 || !v.Anomalous {
		t.Errorf("readiness changes: %+v", v)
	}
	if v := verdict(t, vs, UnreadySeconds); v.Count != 5 {
		t.Errorf("unready seconds: %+v", v)
	}
}

// Spans that overlap (many pods flapping at once) are bounded too.
func TestOverlappingSpansAreBounded(t *testing.T) {
	tr := NewTracker(Settings{}, t0)
	now := t0.Add(time.Hour)
	pods := []Pod{{UID: "a", Ready: true}, {UID: "b", Ready: true}}
	tr.Observe(now, pods, false)
	for i := range 3 * maxSpans {
		now = now.Add(100 * time.Millisecond)
		pods[i%2].Ready = !pods[i%2].Ready
		tr.Observe(now, pods, false)
	}
	if n := len(tr.spans); n > maxSpans {
		t.Errorf("%d spans kept, bound %d", n, maxSpans)
	}
}

// A pod first seen unready long after it was created (this process
// restarted) counts no unready time until it has been ready again.
func TestOldPodFirstSeenUnready(t *testing.T) {
	now := t0.Add(time.Hour)
	tr := NewTracker(Settings{}, now)
	p := Pod{UID: "a", Created: t0, Ready: false}
	tr.Observe(now, []Pod{p}, false)
	now = now.Add(time.Minute)
	tr.Observe(now, []Pod{p}, false)
	if v := verdict(t, tr.Evaluate(now), UnreadySeconds); v.Count != 0 {
		t.Errorf("an old pod first seen unready: %+v", v)
	}
	p.Ready = true
	tr.Observe(now, []Pod{p}, false)
	p.Ready = false
	tr.Observe(now, []Pod{p}, false)
	now = now.Add(30 * time.Second)
	if v := verdict(t, tr.Evaluate(now), UnreadySeconds); v.Count != 30 {
		t.Errorf("the same pod unready again for 30 s: %+v", v)
	}
}
