package release_test

import (
	"context"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/chartpilot/chartpilot/internal/api/v1alpha1"
	"github.com/chartpilot/chartpilot/internal/testing/testcluster"
	"github.com/chartpilot/chartpilot/internal/watches"
)

// TestReadyFollowsWorkloads: a release seen healthy whose Deployment and
// StatefulSet lose their pods (every node cordoned, the pods deleted) turns
// Ready=False, reason WorkloadsUnavailable, naming both, with no Helm action;
// once the pods are back it is Ready again by itself, and then the
// operator sends no request for it while idle.
func TestReadyFollowsWorkloads(t *testing.T) {
	e := newEnv(t)
	startOperator(t, cluster.Config, []watches.Watch{webappWatch(t)})
	e.create("wl", map[string]any{"message": "v1", "statefulSet": true}, nil, nil)
	e.waitCondition("wl", v1alpha1.ConditionReady, metav1.ConditionTrue, "")
	revisions := len(e.history("wl"))

	ctx := context.Background()
	cordon := func(on bool) {
		if err := cluster.Cordon(ctx, on); err != nil {
			t.Error(err)
		}
	}
	cordon(true)
	t.Cleanup(func() { cordon(false) })
	if err := e.cs.CoreV1().Pods(e.ns).DeleteCollection(ctx, metav1.DeleteOptions{GracePeriodSeconds: new(int64)}, metav1.ListOptions{LabelSelector: "app.kubernetes.io/instance=wl"}); err != nil {
		t.Fatal(err)
	}
	e.waitCondition("wl", v1alpha1.ConditionReady, metav1.ConditionFalse, "WorkloadsUnavailable")
	e.waitFor("Ready to name the Deployment and the StatefulSet", func() (bool, string) {
		c := condition(e.get("wl"), v1alpha1.ConditionReady)
		return c.Reason == "WorkloadsUnavailable" && strings.Contains(c.Message, "Deployment/wl is InProgress") && strings.Contains(c.Message, "StatefulSet/wl-store is InProgress"), c.Message
	})
	e.waitEvent("wl", "WorkloadsUnavailable", "not available: ")

	cordon(false)
	u := e.waitCondition("wl", v1alpha1.ConditionReady, metav1.ConditionTrue, "")
	if c := condition(u, v1alpha1.ConditionWorkloadsAvailable); c == nil || c.Status != metav1.ConditionTrue {
		t.Errorf("WorkloadsAvailable = %v, want True once the pods are back", c)
	}
	e.waitEvent("wl", "WorkloadsAvailable", "available again")
	if n := len(e.history("wl")); n != revisions {
		t.Errorf("%d revisions after the outage, %d before: a Helm action ran", n, revisions)
	}

	// The recovery's own requests end first; then five idle seconds.
	audit := &testcluster.AuditLog{Path: cluster.AuditLogPath}
	e.waitFor("the recovery's requests to end", func() (bool, string) {
		r := e.quietFor(audit, 2*time.Second, 0)
		return r.ByNamespace[e.ns] == 0, r.Top(5)
	})
	r := e.quietFor(audit, 5*time.Second, 0)
	// Counted in this test's namespace: the operator also finishes the
	// uninstalls of earlier tests' resources, whose namespaces are going.
	if n := r.ByNamespace[e.ns]; n != 0 {
		t.Errorf("%d requests in %s while idle after the recovery (all: %s)", n, e.ns, r.Top(5))
	}
}
