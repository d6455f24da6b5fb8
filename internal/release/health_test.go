package release_test

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	ctrlmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"

	"github.com/chartpilot/chartpilot/internal/api/v1alpha1"
	"github.com/chartpilot/chartpilot/internal/helm"
	"github.com/chartpilot/chartpilot/internal/testing/testcluster"
	"github.com/chartpilot/chartpilot/internal/watches"
)

// TestUnhealthyUpgradeRolledBack: an upgrade whose pods never become ready
// (no node matches their selector) is rolled back when healthTimeout passes;
// the resource says which object was not ready; the same inputs are not
// retried until a reconcile is requested.
func TestUnhealthyUpgradeRolledBack(t *testing.T) {
	e := newEnv(t)
	startOperator(t, cluster.Config, []watches.Watch{webappWatch(t, func(w *watches.Watch) { w.HealthTimeout = 8 * time.Second })})
	e.create("hg", map[string]any{"message": "good"}, nil, nil)
	e.waitCondition("hg", v1alpha1.ConditionReady, metav1.ConditionTrue, "")

	e.patch("hg", `{"spec":{"message":"stuck","nodeSelector":{"chartpilot.dev/no-such-node":"true"}}}`)
	// While it waits the resource is not Ready and says what it waits for.
	e.waitFor("Progressing while the new pods are pending", func() (bool, string) {
		c := condition(e.get("hg"), v1alpha1.ConditionReconciling)
		return c != nil && c.Reason == "Progressing" && strings.Contains(c.Message, "Deployment/hg"), fmt.Sprint(c)
	})
	u := e.waitRolledBack("hg")
	msg := condition(u, v1alpha1.ConditionReleased).Message
	for _, want := range []string{"rolled back to revision 1", "did not become ready within 8s", "Deployment/hg"} {
		if !strings.Contains(msg, want) {
			t.Errorf("Released message %q does not mention %q", msg, want)
		}
	}
	if cm, _ := e.configMap("hg-config"); cm.Data["message"] != "good" {
		t.Errorf("configmap after rollback = %q", cm.Data["message"])
	}
	e.waitEvent("hg", "UpgradeFailed", "did not become ready")
	hist := e.history("hg")
	if len(hist) != 3 || hist[1].Status != helm.StatusFailed || hist[2].Status != helm.StatusDeployed {
		t.Fatalf("history after rollback: %d revisions", len(hist))
	}
	// Not retried on its own, not even after the back-off would allow it.
	if ok, n := e.holds(20*time.Second, func() (bool, string) { n := len(e.history("hg")); return n == 3, fmt.Sprint(n) }); !ok {
		t.Errorf("unhealthy inputs retried without a request: %s revisions", n)
	}
	if c := condition(e.get("hg"), v1alpha1.ConditionReconciling); c == nil || !strings.Contains(c.Message, v1alpha1.AnnotationReconcileRequestedAt) {
		t.Errorf("Reconciling does not say how to retry: %v", c)
	}
	// A reconcile request retries.
	e.patch("hg", fmt.Sprintf(`{"metadata":{"annotations":{%q:"retry"}}}`, v1alpha1.AnnotationReconcileRequestedAt))
	e.waitFor("a retry", func() (bool, string) {
		n := len(e.history("hg"))
		return n >= 4, fmt.Sprintf("%d revisions", n)
	})
}

// TestMaxConcurrentUpgrades: a chart change reaching many resources upgrades
// at most maxConcurrentUpgrades of them at once (from upgrade to healthy).
func TestMaxConcurrentUpgrades(t *testing.T) {
	e := newEnv(t)
	startOperator(t, cluster.Config, []watches.Watch{webappWatch(t, func(w *watches.Watch) {
		w.MaxConcurrentUpgrades = 2
		w.MaxConcurrentReconciles = 8
	})})
	const n = 6
	for i := range n {
		e.create(fmt.Sprintf("fleet-%d", i), map[string]any{"message": "v1"}, nil, nil)
	}
	for i := range n {
		e.waitCondition(fmt.Sprintf("fleet-%d", i), v1alpha1.ConditionReady, metav1.ConditionTrue, "")
	}
	var mu sync.Mutex
	peak := 0.0
	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	sample(ctx, 20*time.Millisecond, func() {
		if v := gauge("chartpilot_upgrades_in_progress", "Webapp"); v >= 0 {
			mu.Lock()
			peak = max(peak, v)
			mu.Unlock()
		}
	})
	// A watch sees every write of the resources' status, so every one that
	// waited for a slot (wrote UpgradeQueued) is known, however briefly.
	list, err := e.dyn.Resource(webappGVR).Namespace(e.ns).List(context.Background(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	wi, err := e.dyn.Resource(webappGVR).Namespace(e.ns).Watch(ctx, metav1.ListOptions{ResourceVersion: list.GetResourceVersion()})
	if err != nil {
		t.Fatal(err)
	}
	defer wi.Stop()
	waited := map[string]bool{}
	watched := make(chan struct{})
	go func() {
		defer close(watched)
		for ev := range wi.ResultChan() {
			u, ok := ev.Object.(*unstructured.Unstructured)
			if !ok {
				continue
			}
			// Written for the changed spec (a condition left from the
			// installs does not count).
			if c := condition(u, v1alpha1.ConditionReconciling); c != nil && c.Reason == "UpgradeQueued" && c.ObservedGeneration == u.GetGeneration() && u.GetGeneration() > 1 {
				mu.Lock()
				waited[u.GetName()] = true
				mu.Unlock()
			}
		}
	}()
	audit := &testcluster.AuditLog{Path: cluster.AuditLogPath}
	if _, err := audit.Take(managerUser); err != nil {
		t.Fatal(err)
	}
	for i := range n {
		e.patch(fmt.Sprintf("fleet-%d", i), `{"spec":{"message":"v2"}}`)
	}
	for i := range n {
		name := fmt.Sprintf("fleet-%d", i)
		e.waitFor(name+" upgraded and ready", func() (bool, string) {
			u := e.get(name)
			st := status(u)
			c := condition(u, v1alpha1.ConditionReady)
			return st.Release != nil && st.Release.Revision == 2 && c != nil && c.Status == metav1.ConditionTrue, fmt.Sprint(c)
		})
	}
	stop()
	<-watched
	// An upgrade that waited for a slot starts from the cache, which shows
	// the resource as its own UpgradeQueued write left it: no read. Only
	// those that found a slot at once (2 when all changes arrive before
	// the first upgrade ends; more on a machine slow to send them) read.
	r, err := audit.Take(managerUser)
	if err != nil {
		t.Fatal(err)
	}
	reads := r.InNamespace[e.ns]["get webapps"]
	mu.Lock()
	queued := len(waited)
	names := slices.Sorted(maps.Keys(waited))
	mu.Unlock()
	t.Logf("reads of the resources during the upgrades: %d; %d of %d waited for a slot (%s); %s", reads, queued, n, strings.Join(names, ", "), r.Top(10))
	if reads > n-queued {
		t.Errorf("the %d upgrades read their resource %d times; only the %d that did not wait for a slot may", n, reads, n-queued)
	}
	mu.Lock()
	defer mu.Unlock()
	if peak > 2 {
		t.Errorf("%.0f upgrades ran at once; maxConcurrentUpgrades is 2", peak)
	}
	t.Logf("peak upgrades at once: %.0f", peak)
	if peak < 2 && queued == 0 {
		t.Errorf("the bound was never reached (peak %.0f), so this test proves nothing", peak)
	}
}

// gauge reads a gauge of the operator's metrics registry by its kind label.
// sample calls f at once and then every interval until ctx ends, in a
// goroutine of its own.
func sample(ctx context.Context, interval time.Duration, f func()) {
	go func() {
		tick := time.NewTicker(interval)
		defer tick.Stop()
		for {
			f()
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
		}
	}()
}

func gauge(name, kind string) float64 {
	families, err := ctrlmetrics.Registry.Gather()
	if err != nil {
		return -1
	}
	for _, f := range families {
		if f.GetName() != name {
			continue
		}
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "kind" && l.GetValue() == kind {
					return m.GetGauge().GetValue()
				}
			}
		}
	}
	return -1
}
