package release_test

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/chartpilot/chartpilot/internal/api/v1alpha1"
	"github.com/chartpilot/chartpilot/internal/helm"
	"github.com/chartpilot/chartpilot/internal/watches"
)

func TestNeverInstalledDeletedAtOnce(t *testing.T) {
	e := newEnv(t)
	startOperator(t, cluster.Config, []watches.Watch{webappWatch(t)})
	e.create("never", map[string]any{"replicas": "x"}, nil, nil)
	e.waitCondition("never", v1alpha1.ConditionStalled, metav1.ConditionTrue, "RenderFailed")
	if err := e.dyn.Resource(webappGVR).Namespace(e.ns).Delete(context.Background(), "never", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	e.waitFor("resource gone", func() (bool, string) {
		_, err := e.dyn.Resource(webappGVR).Namespace(e.ns).Get(context.Background(), "never", metav1.GetOptions{})
		return isNotFound(err), fmt.Sprint(err)
	})
}

func TestUnmanagedReleaseUntouched(t *testing.T) {
	e := newEnv(t)
	ch, err := helm.LoadChart(filepath.Join("..", "..", "test", "charts", "webapp"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.hc.Install(context.Background(), ch, helm.ActionOptions{Namespace: e.ns, Name: "theirs", Values: map[string]any{"message": "mine"}, Timeout: time.Minute}); err != nil {
		t.Fatal(err)
	}
	startOperator(t, cluster.Config, []watches.Watch{webappWatch(t)})
	e.create("theirs", map[string]any{"message": "ours"}, nil, nil)
	u := e.waitCondition("theirs", v1alpha1.ConditionStalled, metav1.ConditionTrue, "ReleaseNotManaged")
	if msg := condition(u, v1alpha1.ConditionStalled).Message; !strings.Contains(msg, v1alpha1.AnnotationAdopt) {
		t.Errorf("message does not say how to adopt: %q", msg)
	}
	if cm, _ := e.configMap("theirs-config"); cm.Data["message"] != "mine" {
		t.Errorf("unmanaged release changed: %q", cm.Data["message"])
	}
	// Deleting the CR leaves the other release alone.
	if err := e.dyn.Resource(webappGVR).Namespace(e.ns).Delete(context.Background(), "theirs", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	e.waitFor("resource gone", func() (bool, string) {
		_, err := e.dyn.Resource(webappGVR).Namespace(e.ns).Get(context.Background(), "theirs", metav1.GetOptions{})
		return isNotFound(err), fmt.Sprint(err)
	})
	if h := e.history("theirs"); len(h) != 1 || h[0].Status != helm.StatusDeployed {
		t.Errorf("unmanaged release touched on delete: %d revisions", len(h))
	}
}
