package release

import (
	"slices"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
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

// TestInfoSeriesReplaced: a resource has one chartpilot_release_info
// series, replaced when its labels change and gone when it is forgotten;
// another resource's series is left alone.
func TestInfoSeriesReplaced(t *testing.T) {
	r := &Reconciler{}
	r.Watch.GVK.Kind = "InfoSeriesTest"
	a := types.NamespacedName{Namespace: "ns", Name: "a"}
	b := types.NamespacedName{Namespace: "ns", Name: "b"}
	series := func(key types.NamespacedName) []string {
		t.Helper()
		ch := make(chan prometheus.Metric)
		go func() { releaseInfo.Collect(ch); close(ch) }()
		var out []string
		for m := range ch {
			pb := &dto.Metric{}
			if err := m.Write(pb); err != nil {
				t.Fatal(err)
			}
			l := map[string]string{}
			for _, lp := range pb.GetLabel() {
				l[lp.GetName()] = lp.GetValue()
			}
			if l["kind"] == r.Watch.GVK.Kind && l["namespace"] == key.Namespace && l["name"] == key.Name {
				out = append(out, l["chart"]+" "+l["version"]+" "+l["status"])
			}
		}
		return out
	}
	reporter{r}.setInfoSeries(a, [3]string{"webapp", "1.0.0", "pending-upgrade"})
	reporter{r}.setInfoSeries(b, [3]string{"webapp", "1.0.0", "deployed"})
	reporter{r}.setInfoSeries(a, [3]string{"webapp", "1.0.1", "deployed"})
	reporter{r}.setInfoSeries(a, [3]string{"webapp", "1.0.1", "deployed"})
	if got := series(a); len(got) != 1 || got[0] != "webapp 1.0.1 deployed" {
		t.Fatalf("series of a = %q, want only webapp 1.0.1 deployed", got)
	}
	r.forget(a)
	if got := series(a); len(got) != 0 {
		t.Fatalf("series of a after forget = %q, want none", got)
	}
	if got := series(b); len(got) != 1 || got[0] != "webapp 1.0.0 deployed" {
		t.Fatalf("series of b = %q, want webapp 1.0.0 deployed", got)
	}
}
