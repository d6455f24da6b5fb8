package release_test

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/chartpilot/chartpilot/internal/api/v1alpha1"
	"github.com/chartpilot/chartpilot/internal/apiretry"
	"github.com/chartpilot/chartpilot/internal/helm"
	"github.com/chartpilot/chartpilot/internal/testing/testcluster"
	"github.com/chartpilot/chartpilot/internal/testing/testwait"
	"github.com/chartpilot/chartpilot/internal/watches"
)

// TestConvergesThroughAPIFaults: with 15% of the operator's requests
// answered 429 (Retry-After), 500, or passed on 2 s late, every resource
// converges, and no Helm action fails: the requests' own retries absorb
// the faults, so no failed revision is stored and nothing is rolled back.
func TestConvergesThroughAPIFaults(t *testing.T) {
	e := newEnv(t)
	faults, err := testcluster.StartFaultProxy(managerConfig(t), 0.15, 42)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(faults.Close)
	startOperator(t, faults.Config(), []watches.Watch{webappWatch(t, func(w *watches.Watch) { w.MaxConcurrentReconciles = 8 })})
	const n = 20
	for i := range n {
		e.create(fmt.Sprintf("f-%02d", i), map[string]any{"message": "v1"}, nil, nil)
	}
	waitAllReady := func(what string) {
		deadline := time.Now().Add(5 * time.Minute)
		for i := range n {
			name := fmt.Sprintf("f-%02d", i)
			var u *unstructured.Unstructured
			if !testwait.Until(time.Until(deadline), 500*time.Millisecond, func() bool {
				u = e.get(name)
				c := condition(u, v1alpha1.ConditionReady)
				return c != nil && c.Status == metav1.ConditionTrue && c.ObservedGeneration == u.GetGeneration()
			}) {
				t.Fatalf("%s: %s not Ready within 5 minutes of faults: %v (faults injected %d)", what, name, u.Object["status"], faults.Injected())
			}
		}
	}
	waitAllReady("install")
	for i := range n {
		e.patch(fmt.Sprintf("f-%02d", i), `{"spec":{"message":"v2"}}`)
	}
	waitAllReady("upgrade")
	var bad []string
	for i := range n {
		for _, r := range e.history(fmt.Sprintf("f-%02d", i)) {
			if r.Status != helm.StatusDeployed && r.Status != helm.StatusSuperseded {
				bad = append(bad, fmt.Sprintf("f-%02d rev %d %s", i, r.Revision, r.Status))
			}
		}
		if h := e.history(fmt.Sprintf("f-%02d", i)); len(h) != 2 {
			bad = append(bad, fmt.Sprintf("f-%02d has %d revisions, want 2 (install, upgrade)", i, len(h)))
		}
	}
	if len(bad) > 0 {
		t.Errorf("faults reached the releases: %s", strings.Join(bad, ", "))
	}
	if faults.Injected() < 40 {
		t.Errorf("only %d faults injected: the test proves little", faults.Injected())
	}
	t.Logf("converged %d releases twice through %d injected faults", n, faults.Injected())
}

// TestInstallBrokenOffIsFinished: when the API server fails every attempt
// to create the release's Deployment (beyond the request's retries), the
// install fails with the ConfigMap and Service made. The next try carries
// it on instead of removing it: the broken-off revision's record is dropped
// and the install runs again, taking over what the first one made. No
// object is deleted, the failure does not count toward the back-off, and
// the history shows one deployed revision.
func TestInstallBrokenOffIsFinished(t *testing.T) {
	e := newEnv(t)
	faults, err := testcluster.StartFaultProxy(managerConfig(t), 0, 1)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(faults.Close)
	var failedCreates, deletes, recordDeletes atomic.Int64
	ns := "/namespaces/" + e.ns + "/"
	faults.Force = func(r *http.Request) bool {
		if !strings.Contains(r.URL.Path, ns) {
			return false
		}
		if r.Method == http.MethodDelete {
			if strings.Contains(r.URL.Path, ns+"secrets/sh.helm.release.") {
				recordDeletes.Add(1)
			} else {
				deletes.Add(1)
			}
		}
		if r.Method == http.MethodPost && strings.HasSuffix(r.URL.Path, ns+"deployments") && failedCreates.Load() < int64(apiretry.DefaultPolicy.Attempts) {
			failedCreates.Add(1)
			return true
		}
		return false
	}
	startOperator(t, faults.Config(), []watches.Watch{webappWatch(t)})
	e.create("broken", map[string]any{"message": "v1"}, nil, nil)
	e.waitEvent("broken", "APIError", "Install broken off by an API error")
	u := e.waitCondition("broken", v1alpha1.ConditionReady, metav1.ConditionTrue, "")
	if f := status(u).LastFailure; f != nil {
		t.Errorf("lastFailure = %+v: an API error is not a failure of the inputs", f)
	}
	h := e.history("broken")
	var got []string
	for _, r := range h {
		got = append(got, fmt.Sprintf("%d:%s", r.Revision, r.Status))
	}
	if strings.Join(got, ",") != "1:deployed" {
		t.Errorf("history %v, want one revision, deployed (the broken-off one replaced)", got)
	}
	if n := deletes.Load(); n != 0 {
		t.Errorf("%d DELETE requests of objects in the namespace: the half-made install was cleaned up instead of finished", n)
	}
	if n := recordDeletes.Load(); n != 1 {
		t.Errorf("%d release records deleted, want 1 (the broken-off revision)", n)
	}
	if failedCreates.Load() != int64(apiretry.DefaultPolicy.Attempts) {
		t.Errorf("the Deployment's create was failed %d times, want %d", failedCreates.Load(), apiretry.DefaultPolicy.Attempts)
	}
	if _, err := e.cs.AppsV1().Deployments(e.ns).Get(context.Background(), "broken", metav1.GetOptions{}); err != nil {
		t.Errorf("Deployment of the finished install: %v", err)
	}
}
