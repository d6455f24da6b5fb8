package release_test

import (
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/chartpilot/chartpilot/internal/api/v1alpha1"
	"github.com/chartpilot/chartpilot/internal/helm"
	"github.com/chartpilot/chartpilot/internal/watches"
)

// TestFailedInstallRemovedAndInstalledAgain: an install the API server
// refuses stores a failed revision and nothing else happens to it; once the
// spec is fixed, the release that never deployed is removed and installed
// afresh as revision 1.
func TestFailedInstallRemovedAndInstalledAgain(t *testing.T) {
	e := newEnv(t)
	startOperator(t, cluster.Config, []watches.Watch{webappWatch(t)})
	// Port 70000 renders fine but the API server refuses the Service.
	e.create("fi", map[string]any{"message": "first", "port": 70000}, nil, nil)
	e.waitEvent("fi", "InstallFailed", "70000")
	if h := e.history("fi"); len(h) == 0 || h[len(h)-1].Status != helm.StatusFailed {
		t.Fatalf("after a refused install: %d revisions", len(h))
	}
	e.patch("fi", `{"spec":{"port":8080}}`)
	e.waitEvent("fi", "FailedInstallRemoved", "never deployed")
	e.waitCondition("fi", v1alpha1.ConditionReady, metav1.ConditionTrue, "")
	h := e.history("fi")
	if len(h) != 1 || h[0].Revision != 1 || h[0].Status != helm.StatusDeployed {
		t.Fatalf("after the fix: %d revisions, want revision 1 deployed alone", len(h))
	}
	if cm, err := e.configMap("fi-config"); err != nil || cm.Data["message"] != "first" {
		t.Fatalf("configmap after the reinstall: %v %v", cm, err)
	}
}
