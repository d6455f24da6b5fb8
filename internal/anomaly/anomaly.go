// Package anomaly tells when a release behaves unlike itself. It counts
// what the release's pods do (container restarts, readiness changes, the
// time they are not ready) in the latest window, and scores that count
// against the same count in each window of the release's own history:
// how far it lies above their median, in units of their median absolute
// deviation (MAD). A release that restarts a pod every few minutes has a
// normal of its own, and one that never does has another: no threshold is
// shared by the fleet.
package anomaly

import (
	"fmt"
	"math"
	"slices"
	"time"

	"k8s.io/apimachinery/pkg/types"
)

// Signal is one thing counted per window.
type Signal string

const (
	// Restarts are container restarts (restartCount increases).
	Restarts Signal = "restarts"
	// ReadinessChanges are pods' Ready condition changes, either way.
	ReadinessChanges Signal = "readinessChanges"
	// UnreadySeconds are pod-seconds not Ready.
	UnreadySeconds Signal = "unreadySeconds"
)

// Signals are all signals, in the order they are reported.
var Signals = []Signal{Restarts, ReadinessChanges, UnreadySeconds}

// Settings are how a release is scored.
type Settings struct {
	// Window is the span of one count (2m).
	Window time.Duration
	// History is how far back the release's normal reaches (1h): its
	// windows before the latest.
	History time.Duration
	// Threshold is the score from which a count is anomalous (3.5).
	Threshold float64
}

// Defaults for Settings.
const (
	DefaultWindow    = 2 * time.Minute
	DefaultHistory   = time.Hour
	DefaultThreshold = 3.5
)

// WithDefaults fills in what s leaves zero.
func (s Settings) WithDefaults() Settings {
	if s.Window <= 0 {
		s.Window = DefaultWindow
	}
	if s.History < s.Window {
		s.History = DefaultHistory
	}
	if s.Threshold <= 0 {
		s.Threshold = DefaultThreshold
	}
	return s
}

// floor is the least spread a signal's normal is given: a history of
// identical windows (a MAD of 0) would make any change at all infinitely
// unusual. One restart or readiness change per window, and a tenth of the
// window in unready pod-seconds (12 s in 2 minutes: a pod that restarts
// once is not an anomaly, one down for most of the window is).
func floor(sig Signal, window time.Duration) float64 {
	if sig == UnreadySeconds {
		return window.Seconds() / 10
	}
	return 1
}

// madScale makes a MAD comparable to a standard deviation (normal data).
const madScale = 1.4826

// Verdict is one signal's score in the latest window.
type Verdict struct {
	Signal Signal
	// Count is the latest window's count; Median and MAD those of the
	// history's windows (Windows of them).
	Count, Median, MAD float64
	Windows            int
	// Score is (Count - Median) / max(1.4826 * MAD, floor).
	Score     float64
	Anomalous bool
}

// String describes v for a condition or an event.
func (v Verdict) String() string {
	return fmt.Sprintf("%s %s in the last window against a normal of %s (median of %d windows, MAD %s): score %.1f",
		num(v.Count), v.Signal, num(v.Median), v.Windows, num(v.MAD), v.Score)
}

func num(f float64) string {
	if f == math.Trunc(f) {
		return fmt.Sprintf("%.0f", f)
	}
	return fmt.Sprintf("%.1f", f)
}

// Pod is what the tracker reads of one pod.
type Pod struct {
	UID      types.UID
	Created  time.Time
	Restarts int32
	Ready    bool
}

// point is an amount of a signal at a time.
type point struct {
	at time.Time
	n  float64
}

// podState is a pod as last observed.
type podState struct {
	restarts int32
	ready    bool
	// unreadySince is when it was last seen going unready (zero: ready,
	// or unready since before it was first seen).
	unreadySince time.Time
	seen         time.Time
}

// Tracker follows one release. It is not safe for concurrent use.
type Tracker struct {
	s     Settings
	start time.Time
	pods  map[types.UID]*podState
	// counts are restarts and readiness changes; spans are the closed
	// unready spans of pods.
	counts map[Signal][]point
	spans  []span
}

type span struct{ from, to time.Time }

// NewTracker starts following a release at now.
func NewTracker(s Settings, now time.Time) *Tracker {
	return &Tracker{s: s.WithDefaults(), start: now, pods: map[types.UID]*podState{}, counts: map[Signal][]point{}}
}

// Observe records the release's pods as they are at now: what changed
// since the last observation counts at now. A pod seen the first time
// counts its restarts, and its time unready from now, only when it was
// created within the latest window (all of them are recent then; an older
// pod's may not be), and a pod gone is forgotten (its unready time up to
// its last observation counts). A pod that has finished (Succeeded or
// Failed: a Job's, an evicted one) is for the caller to leave out. While the release acts (acting: an install, upgrade or
// rollback replaces its pods), nothing counts: the pods are followed
// only, and time unready counts from the end of the action.
func (t *Tracker) Observe(now time.Time, pods []Pod, acting bool) {
	present := make(map[types.UID]bool, len(pods))
	for _, p := range pods {
		present[p.UID] = true
		st, known := t.pods[p.UID]
		young := p.Created.After(now.Add(-t.s.Window))
		if !known {
			st = &podState{restarts: p.Restarts, ready: p.Ready}
			if young {
				st.restarts = 0
			}
			t.pods[p.UID] = st
		}
		if d := p.Restarts - st.restarts; d > 0 && !acting {
			t.count(Restarts, now, float64(d))
		}
		st.restarts = p.Restarts
		if known && p.Ready != st.ready && !acting {
			t.count(ReadinessChanges, now, 1)
		}
		switch {
		case p.Ready && !st.unreadySince.IsZero():
			if !acting {
				t.addSpan(st.unreadySince, now)
			}
			st.unreadySince = time.Time{}
		case !p.Ready && acting:
			st.unreadySince = now
		case !p.Ready && st.unreadySince.IsZero() && (known || young):
			// Unready since now: an older pod first seen unready (after a
			// restart of this process) is unready since a time unknown,
			// and counts only once it has been ready again.
			st.unreadySince = now
		}
		st.ready = p.Ready
		st.seen = now
	}
	for uid, st := range t.pods {
		if !present[uid] {
			if !st.ready && !st.unreadySince.IsZero() {
				t.addSpan(st.unreadySince, st.seen)
			}
			delete(t.pods, uid)
		}
	}
	t.prune(now)
}

// count adds n of sig at now; what falls within a second of the last
// point joins it, so that a pod that changes many times a second costs
// one point a second, not one per change.
func (t *Tracker) count(sig Signal, now time.Time, n float64) {
	ps := t.counts[sig]
	if l := len(ps) - 1; l >= 0 && now.Sub(ps[l].at) < time.Second {
		ps[l].n += n
		return
	}
	t.counts[sig] = append(ps, point{now, n})
}

// maxSpans bounds the unready spans a tracker keeps: many pods whose
// readiness flaps at once (spans that overlap cannot be joined) cost at
// most this many, the oldest half dropped when it is reached.
const maxSpans = 4096

// addSpan remembers a pod unready from from to to. A span that begins
// less than a second after the last one ends joins it, the seconds of both
// summed: a pod whose readiness flaps many times a second costs one span a
// second, not one per flap, and every second still counts.
func (t *Tracker) addSpan(from, to time.Time) {
	if l := len(t.spans) - 1; l >= 0 && !from.Before(t.spans[l].to) && from.Sub(t.spans[l].to) < time.Second {
		t.spans[l].to = t.spans[l].to.Add(to.Sub(from))
		return
	}
	if len(t.spans) >= maxSpans {
		t.spans = append(t.spans[:0], t.spans[maxSpans/2:]...)
	}
	t.spans = append(t.spans, span{from, to})
}

// prune forgets what lies before the history.
func (t *Tracker) prune(now time.Time) {
	oldest := now.Add(-t.s.History - t.s.Window)
	for sig, ps := range t.counts {
		i := 0
		for i < len(ps) && ps[i].at.Before(oldest) {
			i++
		}
		t.counts[sig] = ps[i:]
	}
	t.spans = slices.DeleteFunc(t.spans, func(s span) bool { return s.to.Before(oldest) })
}

// Active reports whether anything counted lies in the latest window at
// now, or a pod is not ready: a verdict may change without a pod changing.
func (t *Tracker) Active(now time.Time) bool {
	from := now.Add(-t.s.Window)
	for _, ps := range t.counts {
		if len(ps) > 0 && ps[len(ps)-1].at.After(from) {
			return true
		}
	}
	for _, st := range t.pods {
		if !st.ready {
			return true
		}
	}
	for _, s := range t.spans {
		if s.to.After(from) {
			return true
		}
	}
	return false
}

// Evaluate scores each signal's latest window, ending at now, against the
// windows before it within the history (only those since the tracker
// started: a release followed for 10 minutes has 4 windows of normal).
// With no window of history yet, the normal is 0.
func (t *Tracker) Evaluate(now time.Time) []Verdict {
	n := int(t.s.History / t.s.Window)
	if since := int(now.Sub(t.start)/t.s.Window) - 1; since < n {
		n = max(since, 0)
	}
	out := make([]Verdict, 0, len(Signals))
	for _, sig := range Signals {
		windows := t.windows(sig, now, n+1) // the latest, then the history's
		hist := windows[1:]
		v := Verdict{Signal: sig, Count: windows[0], Windows: n}
		if n > 0 {
			v.Median = median(hist)
			dev := make([]float64, n)
			for i, h := range hist {
				dev[i] = math.Abs(h - v.Median)
			}
			v.MAD = median(dev)
		}
		v.Score = (v.Count - v.Median) / math.Max(madScale*v.MAD, floor(sig, t.s.Window))
		v.Anomalous = v.Score >= t.s.Threshold
		out = append(out, v)
	}
	return out
}

// windows is sig's amount in each of the k windows ending at now, the
// latest first: window i is (now-(i+1)w, now-iw]. One pass over what is
// remembered, however many windows.
func (t *Tracker) windows(sig Signal, now time.Time, k int) []float64 {
	w := t.s.Window
	out := make([]float64, k)
	if sig != UnreadySeconds {
		for _, p := range t.counts[sig] {
			if d := now.Sub(p.at); d >= 0 {
				if i := int(d / w); i < k {
					out[i] += p.n
				}
			}
		}
		return out
	}
	add := func(from, to time.Time) {
		if to.After(now) {
			to = now
		}
		for i := int(now.Sub(to) / w); i < k; i++ {
			wto := now.Add(-time.Duration(i) * w)
			o := overlap(from, to, wto.Add(-w), wto)
			if o == 0 && !from.Before(wto.Add(-w)) {
				break
			}
			out[i] += o
		}
	}
	for _, s := range t.spans {
		add(s.from, s.to)
	}
	for _, st := range t.pods {
		if !st.ready && !st.unreadySince.IsZero() {
			add(st.unreadySince, now)
		}
	}
	for i := range out {
		out[i] = math.Round(out[i])
	}
	return out
}

// overlap is the seconds [a1,a2] and [b1,b2] share.
func overlap(a1, a2, b1, b2 time.Time) float64 {
	from, to := a1, a2
	if b1.After(from) {
		from = b1
	}
	if b2.Before(to) {
		to = b2
	}
	if !to.After(from) {
		return 0
	}
	return to.Sub(from).Seconds()
}

func median(xs []float64) float64 {
	s := slices.Clone(xs)
	slices.Sort(s)
	m := len(s) / 2
	if len(s)%2 == 1 {
		return s[m]
	}
	return (s[m-1] + s[m]) / 2
}

// Worst is the anomalous verdict with the highest score, if any.
func Worst(vs []Verdict) (Verdict, bool) {
	var best Verdict
	found := false
	for _, v := range vs {
		if v.Anomalous && (!found || v.Score > best.Score) {
			best, found = v, true
		}
	}
	return best, found
}
