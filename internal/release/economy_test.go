package release_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ctrlmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"

	"github.com/chartpilot/chartpilot/internal/api/v1alpha1"
	"github.com/chartpilot/chartpilot/internal/helm"
	"github.com/chartpilot/chartpilot/internal/testing/testcluster"
	"github.com/chartpilot/chartpilot/internal/watches"
)

// TestSettledReleasesCostNoRequests: releases deployed and healthy are
// checked for drift (on a reconcile request) from the caches alone, with no
// request to the API server; a new process over them reads one record body
// each and nothing else; deleting them reads no older record and stores no
// "uninstalling" mark. Requests are counted from the API server's audit
// log, in the test's namespace.
func TestSettledReleasesCostNoRequests(t *testing.T) {
	e := newEnv(t)
	audit := &testcluster.AuditLog{Path: cluster.AuditLogPath}
	if _, err := audit.Take(managerUser); err != nil {
		t.Fatal(err)
	}
	stop := startOperator(t, cluster.Config, []watches.Watch{webappWatch(t)})
	const n = 3
	for i := range n {
		e.create(fmt.Sprintf("calm-%d", i), map[string]any{"message": "m"}, nil, nil)
	}
	for i := range n {
		e.waitCondition(fmt.Sprintf("calm-%d", i), v1alpha1.ConditionReady, metav1.ConditionTrue, "")
	}
	// A first install reads none of its objects: Helm's existence checks
	// are answered by the creates (and the cache).
	installed, err := audit.Take(managerUser)
	if err != nil {
		t.Fatal(err)
	}
	for _, res := range []string{"configmaps", "services", "deployments"} {
		if got := installed.ByResource["get "+res]; got != 0 {
			t.Errorf("installing %d releases read %s %d times: %s", n, res, got, installed.Top(12))
		}
	}
	t.Logf("installing %d releases: %s", n, installed.Top(12))
	// A second revision each, for the deletion below to have an older one.
	for i := range n {
		e.patch(fmt.Sprintf("calm-%d", i), `{"spec":{"message":"m2"}}`)
	}
	for i := range n {
		name := fmt.Sprintf("calm-%d", i)
		e.waitFor(name+" at revision 2", func() (bool, string) {
			h := e.history(name)
			return len(h) == 2 && h[1].Status == helm.StatusDeployed, fmt.Sprint(len(h))
		})
		e.waitCondition(name, v1alpha1.ConditionReady, metav1.ConditionTrue, "")
	}
	quiet := func() {
		t.Helper()
		// Until two seconds pass without a request in the namespace.
		e.waitFor("no requests for 2s", func() (bool, string) {
			if _, err := audit.Take(managerUser); err != nil {
				return false, err.Error()
			}
			r := e.quietFor(audit, 2*time.Second, 0)
			return r.ByNamespace[e.ns] == 0, r.Top(5)
		})
	}
	// checked waits for the drift checks, gives anything they would do
	// after two seconds to show (ending at more than max requests), and
	// returns the requests since quiet.
	checked := func(since float64, max int) testcluster.Requests {
		t.Helper()
		e.waitFor(fmt.Sprintf("%d drift checks", n), func() (bool, string) {
			d := driftChecks(t) - since
			return d >= n, fmt.Sprint(d)
		})
		return e.quietFor(audit, 2*time.Second, max)
	}

	quiet()
	before := driftChecks(t)
	for i := range n {
		e.patch(fmt.Sprintf("calm-%d", i), fmt.Sprintf(`{"metadata":{"annotations":{%q:"now"}}}`, v1alpha1.AnnotationReconcileRequestedAt))
	}
	r := checked(before, 0)
	if got := r.ByNamespace[e.ns]; got != 0 {
		t.Errorf("a reconcile request (drift check) on %d settled releases cost %d requests: %s", n, got, r.Top(8))
	}

	stop()
	quiet()
	before = driftChecks(t)
	startOperator(t, cluster.Config, []watches.Watch{webappWatch(t)})
	r = checked(before, n)
	if got := r.ByNamespace[e.ns]; got > n {
		t.Errorf("a new process over %d settled releases made %d requests in their namespace, want at most one each: %s", n, got, r.Top(8))
	}

	// Deleting them: the newest record of each was read by the new process
	// above; the older one is deleted unread, and the purge stores no mark.
	quiet()
	for i := range n {
		if err := e.dyn.Resource(webappGVR).Namespace(e.ns).Delete(context.Background(), fmt.Sprintf("calm-%d", i), metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	for i := range n {
		name := fmt.Sprintf("calm-%d", i)
		e.waitFor(name+" gone with its records", func() (bool, string) {
			_, err := e.dyn.Resource(webappGVR).Namespace(e.ns).Get(context.Background(), name, metav1.GetOptions{})
			h := e.history(name)
			return isNotFound(err) && len(h) == 0, fmt.Sprintf("%v, %d records", err, len(h))
		})
	}
	r, err = audit.Take(managerUser)
	if err != nil {
		t.Fatal(err)
	}
	deleted := r.InNamespace[e.ns]
	t.Logf("deleting %d releases of 2 revisions: %v", n, deleted)
	for _, req := range []string{"get secrets", "update secrets"} {
		if got := deleted[req]; got != 0 {
			t.Errorf("deleting %d releases: %s %d, want 0: %v", n, req, got, deleted)
		}
	}
	if got := deleted["delete secrets"]; got != 2*n {
		t.Errorf("deleting %d releases of 2 revisions: delete secrets %d, want %d", n, got, 2*n)
	}
}

// driftChecks is chartpilot_drift_checks_total summed over its series.
func driftChecks(t *testing.T) float64 {
	t.Helper()
	families, err := ctrlmetrics.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	sum := 0.0
	for _, f := range families {
		if f.GetName() == "chartpilot_drift_checks_total" {
			for _, m := range f.GetMetric() {
				sum += m.GetCounter().GetValue()
			}
		}
	}
	return sum
}
