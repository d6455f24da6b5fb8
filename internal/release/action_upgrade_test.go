package release_test

import (
	"context"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	ctrlmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"

	"github.com/chartpilot/chartpilot/internal/api/v1alpha1"
	"github.com/chartpilot/chartpilot/internal/helm"
	"github.com/chartpilot/chartpilot/internal/hooks"
	"github.com/chartpilot/chartpilot/internal/operator"
	"github.com/chartpilot/chartpilot/internal/watches"
)

func TestForceUpgradeAndHistoryCap(t *testing.T) {
	e := newEnv(t)
	startOperator(t, cluster.Config, []watches.Watch{webappWatch(t, func(w *watches.Watch) { w.MaxHistory = 3 })})
	e.create("hist", map[string]any{"message": "m0"}, nil, nil)
	e.waitCondition("hist", v1alpha1.ConditionReady, metav1.ConditionTrue, "")
	waitRevision := func(rev int) {
		t.Helper()
		e.waitFor(fmt.Sprintf("revision %d ready", rev), func() (bool, string) {
			u := e.get("hist")
			st := status(u)
			c := condition(u, v1alpha1.ConditionReady)
			return st.Release != nil && st.Release.Revision == rev && c != nil && c.Status == metav1.ConditionTrue,
				fmt.Sprintf("%+v", st.Release)
		})
	}
	e.patch("hist", fmt.Sprintf(`{"metadata":{"annotations":{%q:"one"}}}`, v1alpha1.AnnotationForceUpgrade))
	waitRevision(2)
	if h := e.history("hist"); h[len(h)-1].Labels[v1alpha1.LabelForceToken] != "one" {
		t.Errorf("force token not recorded: %v", h[len(h)-1].Labels)
	}
	for i := 1; i <= 4; i++ {
		e.patch("hist", fmt.Sprintf(`{"spec":{"message":"m%d"}}`, i))
		waitRevision(2 + i)
	}
	if h := e.history("hist"); len(h) > 3 {
		t.Errorf("%d revisions stored, maxHistory is 3", len(h))
	}
	if st := status(e.get("hist")); len(st.History) == 0 || st.History[0].Action != "Upgrade" || st.History[0].Revision != 6 {
		t.Errorf("status.history[0] = %+v", st.History)
	}
	families, err := ctrlmetrics.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, f := range families {
		if f.GetName() != "chartpilot_release_info" {
			continue
		}
		for _, m := range f.GetMetric() {
			l := map[string]string{}
			for _, lp := range m.GetLabel() {
				l[lp.GetName()] = lp.GetValue()
			}
			if l["namespace"] == e.ns && l["name"] == "hist" && l["chart"] == "webapp" && l["version"] == "1.0.0" && l["status"] == "deployed" {
				found = true
			}
		}
	}
	if !found {
		t.Errorf("chartpilot_release_info has no series for %s/hist", e.ns)
	}
}

// TestShutdownLetsAnUpgradeFinish: a manager told to stop (SIGTERM cancels
// its context) while an upgrade is in flight lets the upgrade finish: the
// release is left deployed on the new inputs, not failed (a cancelled
// action is marked failed and the next leader rolls it back).
func TestShutdownLetsAnUpgradeFinish(t *testing.T) {
	e := newEnv(t)
	stop := startOperator(t, cluster.Config, []watches.Watch{webappWatch(t)})
	e.create("term", map[string]any{"message": "v1"}, nil, nil)
	e.waitCondition("term", v1alpha1.ConditionReady, metav1.ConditionTrue, "")
	// The pre-upgrade hook Job is never scheduled here: the upgrade waits
	// on it, pending-upgrade, until the test deletes the Job.
	e.patch("term", `{"spec":{"message":"v2","slowHook":true}}`)
	e.waitPendingUpgrade("term")
	stopped := make(chan struct{})
	go func() { stop(); close(stopped) }()
	select {
	case <-stopped:
		t.Fatal("the manager stopped with an upgrade in flight")
	case <-time.After(3 * time.Second):
	}
	if err := e.cs.BatchV1().Jobs(e.ns).Delete(context.Background(), "term-pre-upgrade", metav1.DeleteOptions{PropagationPolicy: ptr.To(metav1.DeletePropagationBackground)}); err != nil {
		t.Fatal(err)
	}
	select {
	case <-stopped:
	case <-time.After(2 * time.Minute):
		t.Fatal("the manager did not stop within 2 minutes of its upgrade's hook finishing")
	}
	h := e.history("term")
	last := h[len(h)-1]
	if last.Status != helm.StatusDeployed || last.Revision != 2 {
		t.Fatalf("after the shutdown the latest revision is %d %s, want 2 deployed", last.Revision, last.Status)
	}
	if cm, err := e.configMap("term-config"); err != nil || cm.Data["message"] != "v2" {
		t.Errorf("configmap after the shutdown: %v %v", cm.Data, err)
	}
}

// TestShutdownEndsAPassThatHasNotActed: a manager told to stop while one
// of its passes waits on a read that cannot complete (here a hook's values
// that never come; in a stopping manager, an informer that never syncs)
// stops at once, not after the pass timeout, and that pass leaves nothing
// behind: no revision, no event. The next manager installs the release.
func TestShutdownEndsAPassThatHasNotActed(t *testing.T) {
	e := newEnv(t)
	var block atomic.Bool
	block.Store(true)
	entered := make(chan struct{}, 1)
	ended := make(chan error, 1)
	slow := &hooks.Hook{
		Name: "slow",
		Values: hooks.ValuesFunc(func(ctx context.Context, obj hooks.Object) (map[string]any, error) {
			if obj.Resource.GetNamespace() != e.ns || !block.Load() {
				return nil, nil
			}
			select {
			case entered <- struct{}{}:
			default:
			}
			<-ctx.Done()
			select {
			case ended <- context.Cause(ctx):
			default:
			}
			return nil, ctx.Err()
		}),
	}
	// The pass timeout is 31 minutes: a pass left to run out would hold
	// the stop far beyond this test's wait for it.
	w := webappWatch(t, func(w *watches.Watch) { w.Hooks = []string{"slow"}; w.Timeout = 30 * time.Minute })
	withHook := func(o *operator.Options) { o.Hooks = []*hooks.Hook{slow} }
	stop := startOperator(t, cluster.Config, []watches.Watch{w}, withHook)
	e.create("waits", map[string]any{"message": "v1"}, nil, nil)
	select {
	case <-entered:
	case <-time.After(2 * time.Minute):
		t.Fatal("the pass never asked the hook for its values")
	}
	stopped := make(chan struct{})
	go func() { stop(); close(stopped) }()
	select {
	case <-stopped:
	case <-time.After(2 * time.Minute):
		t.Fatal("the manager did not stop within 2 minutes while a pass waited on a read")
	}
	select {
	case cause := <-ended:
		if cause == nil || !strings.Contains(cause.Error(), "manager is stopping") {
			t.Errorf("the pass ended on %v, want the manager's stop", cause)
		}
	default:
		t.Error("the hook's wait did not end with the stop")
	}
	if h := e.history("waits"); len(h) != 0 {
		t.Errorf("a pass ended by the stop left %d revisions", len(h))
	}
	if evs := e.events("waits"); len(evs) != 0 {
		t.Errorf("a pass ended by the stop recorded events: %q", evs)
	}

	block.Store(false)
	startOperator(t, cluster.Config, []watches.Watch{w}, withHook)
	e.waitCondition("waits", v1alpha1.ConditionReady, metav1.ConditionTrue, "")
	if cm, err := e.configMap("waits-config"); err != nil || cm.Data["message"] != "v1" {
		t.Errorf("configmap after the next manager: %v %v", cm, err)
	}
}
