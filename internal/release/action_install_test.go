package release_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
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
	if ok, seen := e.holds(3*time.Second, func() (bool, string) {
		hist := e.history("iv")
		return len(hist) == 1 && hist[0].Status == helm.StatusDeployed, fmt.Sprintf("%d revisions, latest %s", len(hist), hist[len(hist)-1].Status)
	}); !ok {
		t.Fatalf("a stalled upgrade touched the release: %s", seen)
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

// TestInstallLeavesSomeoneElsesObject: an object of the release's manifest
// already exists and is not the release's. The first install, which takes
// the manifest's objects to be absent, finds it with its create; the
// attempt is undone and the install is refused before anything is stored,
// naming the object. That object is untouched, nothing of the release is
// left, and once it is gone the install goes ahead.
func TestInstallLeavesSomeoneElsesObject(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	theirs := &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Name: "taken-config", Namespace: e.ns},
		Data:       map[string]string{"owner": "someone else"},
	}
	theirs, err := e.cs.CoreV1().ConfigMaps(e.ns).Create(ctx, theirs, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	startOperator(t, cluster.Config, []watches.Watch{webappWatch(t)})
	e.create("taken", map[string]any{"message": "mine"}, nil, nil)
	u := e.waitCondition("taken", v1alpha1.ConditionStalled, metav1.ConditionTrue, "")
	if msg := condition(u, v1alpha1.ConditionStalled).Message; !strings.Contains(msg, "taken-config") || !strings.Contains(msg, "exists") {
		t.Errorf("Stalled message = %q, want the ConfigMap named", msg)
	}
	cm, err := e.configMap("taken-config")
	if err != nil || cm.UID != theirs.UID || cm.Data["owner"] != "someone else" || len(cm.Data) != 1 {
		t.Fatalf("someone else's ConfigMap was changed: %+v %v", cm, err)
	}
	if _, err := e.cs.AppsV1().Deployments(e.ns).Get(ctx, "taken", metav1.GetOptions{}); !isNotFound(err) {
		t.Errorf("the undone install left its Deployment: %v", err)
	}
	if _, err := e.cs.CoreV1().Services(e.ns).Get(ctx, "taken", metav1.GetOptions{}); !isNotFound(err) {
		t.Errorf("the undone install left its Service: %v", err)
	}
	if h := e.history("taken"); len(h) != 0 {
		t.Errorf("the undone install left %d revisions", len(h))
	}

	if err := e.cs.CoreV1().ConfigMaps(e.ns).Delete(ctx, "taken-config", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	e.patch("taken", `{"spec":{"message":"mine, now"}}`)
	e.waitCondition("taken", v1alpha1.ConditionReady, metav1.ConditionTrue, "")
	if cm, err := e.configMap("taken-config"); err != nil || cm.Data["message"] != "mine, now" {
		t.Errorf("after the other ConfigMap went: %v %v", cm, err)
	}
	if h := e.history("taken"); len(h) != 1 || h[0].Status != helm.StatusDeployed {
		t.Errorf("history after the install: %d revisions", len(h))
	}
}
