package release_test

import (
	"fmt"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/chartpilot/chartpilot/internal/api/v1alpha1"
	"github.com/chartpilot/chartpilot/internal/helm"
	"github.com/chartpilot/chartpilot/internal/testing/testwait"
	"github.com/chartpilot/chartpilot/internal/watches"
)

// TestConvergesThroughControlPlaneRestarts: kube-apiserver restarted while
// a fleet installs, and etcd restarted while it upgrades. The operator
// keeps running (no restart of it), every resource ends Ready on its new
// values, and no release is left pending or failed.
func TestConvergesThroughControlPlaneRestarts(t *testing.T) {
	e := newEnv(t)
	stop := startOperator(t, cluster.Config, []watches.Watch{webappWatch(t, func(w *watches.Watch) { w.MaxConcurrentReconciles = 8 })})
	const n = 16
	names := make([]string, n)
	for i := range n {
		names[i] = fmt.Sprintf("r-%02d", i)
	}
	waitAll := func(what string) {
		deadline := time.Now().Add(5 * time.Minute)
		for _, name := range names {
			var u *unstructured.Unstructured
			var err error
			if !testwait.Until(time.Until(deadline), 500*time.Millisecond, func() bool {
				u, err = e.dyn.Resource(webappGVR).Namespace(e.ns).Get(t.Context(), name, metav1.GetOptions{})
				if err != nil {
					return false
				}
				c := condition(u, v1alpha1.ConditionReady)
				return c != nil && c.Status == metav1.ConditionTrue && c.ObservedGeneration == u.GetGeneration()
			}) {
				var st any
				if u != nil {
					st = u.Object["status"]
				}
				t.Fatalf("%s: %s not Ready within 5 minutes: %v (%v)", what, name, st, err)
			}
		}
	}

	for _, name := range names[:n/2] {
		e.create(name, map[string]any{"message": "v1"}, nil, nil)
	}
	restart := func(component string) {
		t.Helper()
		if err := cluster.Restart(component, 2*time.Second); err != nil {
			t.Fatal(err)
		}
	}
	restart("kube-apiserver")
	for _, name := range names[n/2:] {
		e.create(name, map[string]any{"message": "v1"}, nil, nil)
	}
	waitAll("install across an API server restart")

	for _, name := range names {
		e.patch(name, `{"spec":{"message":"v2"}}`)
	}
	restart("etcd")
	waitAll("upgrade across an etcd restart")

	var bad []string
	for _, name := range names {
		h := e.history(name)
		if last := h[len(h)-1]; last.Status != helm.StatusDeployed || last.Labels == nil {
			bad = append(bad, fmt.Sprintf("%s rev %d %s", name, last.Revision, last.Status))
		}
		for _, r := range h {
			if r.Status.IsPending() {
				bad = append(bad, fmt.Sprintf("%s rev %d left %s", name, r.Revision, r.Status))
			}
		}
		cm, err := e.configMap(name + "-config")
		if err != nil || cm.Data["message"] != "v2" {
			bad = append(bad, fmt.Sprintf("%s ConfigMap not on v2 (%v)", name, err))
		}
	}
	if len(bad) > 0 {
		t.Errorf("after the restarts: %s", strings.Join(bad, "; "))
	}
	stop() // fails the test if the operator's manager ended with an error on its own
}
