package release_test

import (
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/chartpilot/chartpilot/internal/api/v1alpha1"
	"github.com/chartpilot/chartpilot/internal/helm"
	"github.com/chartpilot/chartpilot/internal/watches"
)

func TestInvalidValuesStalled(t *testing.T) {
	e := newEnv(t)
	startOperator(t, cluster.Config, []watches.Watch{webappWatch(t)})
	e.create("iv", map[string]any{"message": "ok"}, nil, nil)
	e.waitCondition("iv", v1alpha1.ConditionReady, metav1.ConditionTrue, "")
	e.patch("iv", `{"spec":{"replicas":"three"}}`)
	u := e.waitCondition("iv", v1alpha1.ConditionStalled, metav1.ConditionTrue, "RenderFailed")
	msg := condition(u, v1alpha1.ConditionStalled).Message
	if !strings.Contains(msg, "replicas") || !strings.Contains(msg, "revision 1 keeps running") {
		t.Errorf("Stalled message = %q", msg)
	}
	if r := condition(u, v1alpha1.ConditionReady); r.Status != metav1.ConditionFalse || r.Reason != "RenderFailed" {
		t.Errorf("Ready = %+v", r)
	}
	time.Sleep(3 * time.Second)
	hist := e.history("iv")
	if len(hist) != 1 || hist[0].Status != helm.StatusDeployed {
		t.Fatalf("a stalled upgrade touched the release: %d revisions, latest %s", len(hist), hist[len(hist)-1].Status)
	}
	if _, err := e.configMap("iv-config"); err != nil {
		t.Errorf("deployed objects gone: %v", err)
	}
	// Fixing the input clears Stalled.
	e.patch("iv", `{"spec":{"replicas":3}}`)
	u = e.waitCondition("iv", v1alpha1.ConditionReady, metav1.ConditionTrue, "")
	if condition(u, v1alpha1.ConditionStalled) != nil {
		t.Errorf("Stalled not cleared")
	}
}
