package release_test

import (
	"fmt"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/chartpilot/chartpilot/internal/api/v1alpha1"
	"github.com/chartpilot/chartpilot/internal/helm"
	"github.com/chartpilot/chartpilot/internal/watches"
)

func TestFailedUpgradeRolledBack(t *testing.T) {
	e := newEnv(t)
	startOperator(t, cluster.Config, []watches.Watch{webappWatch(t)})
	e.create("rb", map[string]any{"message": "good", "port": 8080}, nil, nil)
	e.waitCondition("rb", v1alpha1.ConditionReady, metav1.ConditionTrue, "")
	// Port 70000 renders fine but the API server refuses the Service.
	e.patch("rb", `{"spec":{"message":"bad","port":70000}}`)
	u := e.waitRolledBack("rb")
	c := condition(u, v1alpha1.ConditionReleased)
	if !strings.Contains(c.Message, "rolled back to revision 1") || !strings.Contains(c.Message, "70000") {
		t.Errorf("Released message does not say what failed: %q", c.Message)
	}
	if r := condition(u, v1alpha1.ConditionReady); r.Status != metav1.ConditionFalse {
		t.Errorf("Ready = %s after a rollback", r.Status)
	}
	hist := e.history("rb")
	last := hist[len(hist)-1]
	if last.Status != helm.StatusDeployed || last.Revision != 3 || last.Labels[v1alpha1.LabelDigest] != hist[0].Labels[v1alpha1.LabelDigest] {
		t.Errorf("after rollback, latest = rev %d %s", last.Revision, last.Status)
	}
	if cm, _ := e.configMap("rb-config"); cm.Data["message"] != "good" {
		t.Errorf("configmap after rollback = %q", cm.Data["message"])
	}
	if rel := status(u).Release; rel == nil || rel.Revision != 3 || rel.Status != "deployed" {
		t.Errorf("status.release after rollback = %+v, want revision 3 deployed", rel)
	}
	e.waitEvent("rb", "UpgradeFailed", "70000")
	e.waitEvent("rb", "RolledBack", "revision 1")
	// Not retried in a hot loop: the same inputs back off.
	if ok, n := e.holds(3*time.Second, func() (bool, string) { n := len(e.history("rb")); return n == 3, fmt.Sprint(n) }); !ok {
		t.Errorf("failed upgrade retried at once: %s revisions", n)
	}
	// A fix rolls forward at once.
	e.patch("rb", `{"spec":{"message":"fixed","port":8081}}`)
	e.waitFor("fixed upgrade", func() (bool, string) {
		u := e.get("rb")
		c := condition(u, v1alpha1.ConditionReady)
		return c != nil && c.Status == metav1.ConditionTrue && c.ObservedGeneration == u.GetGeneration(), fmt.Sprint(c)
	})
}
