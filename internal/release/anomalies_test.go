package release_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/chartpilot/chartpilot/internal/api/v1alpha1"
	"github.com/chartpilot/chartpilot/internal/watches"
)

// TestAnomaliesOfAReleasesPods: with anomalies asked for, a release's
// condition says whether its pods behave as they usually do. The test
// writes the pod's status as a kubelet would: container restarts, five
// or more in a window, raise Anomalous (RestartsAboveNormal, with a Warning event),
// and it clears once a window passes without them; a pod kept unready
// raises it again (UnreadyAboveNormal) until it is ready. A release
// beside it, left alone, is never anomalous.
func TestAnomaliesOfAReleasesPods(t *testing.T) {
	e := newEnv(t)
	startOperator(t, cluster.Config, []watches.Watch{webappWatch(t, func(w *watches.Watch) {
		w.Anomalies = &watches.Anomalies{Window: 30 * time.Second, History: 5 * time.Minute}
	})})
	e.create("flaky", map[string]any{"message": "m", "replicas": 1}, nil, nil)
	e.create("steady", map[string]any{"message": "m", "replicas": 1}, nil, nil)
	// What pods do while their release is installed counts for nothing:
	// the test plays the kubelet once the install has settled.
	for _, name := range []string{"flaky", "steady"} {
		e.waitCondition(name, v1alpha1.ConditionReady, metav1.ConditionTrue, "")
		e.waitCondition(name, v1alpha1.ConditionAnomalous, metav1.ConditionFalse, "WithinNormal")
	}
	steadyAnomalous := watchCondition(t, e, "steady", v1alpha1.ConditionAnomalous)

	kubelet := func(change func(*corev1.Pod)) {
		t.Helper()
		e.waitFor("the pod of flaky written", func() (bool, string) {
			pods, err := e.cs.CoreV1().Pods(e.ns).List(context.Background(), metav1.ListOptions{LabelSelector: "app.kubernetes.io/instance=flaky"})
			if err != nil || len(pods.Items) != 1 {
				return false, fmt.Sprintf("%v %v", pods, err)
			}
			p := &pods.Items[0]
			change(p)
			_, err = e.cs.CoreV1().Pods(e.ns).UpdateStatus(context.Background(), p, metav1.UpdateOptions{})
			return err == nil, fmt.Sprint(err)
		})
	}
	// Five restarts, then one more every few seconds until it is raised
	// (on a loaded machine the detector may still see the install settle
	// when the first come, and those count for nothing).
	for i := 0; ; i++ {
		kubelet(func(p *corev1.Pod) {
			for i := range p.Status.ContainerStatuses {
				p.Status.ContainerStatuses[i].RestartCount++
			}
		})
		if i < 5 {
			continue
		}
		if c := condition(e.get("flaky"), v1alpha1.ConditionAnomalous); c != nil && c.Status == metav1.ConditionTrue || i > 40 {
			break
		}
		time.Sleep(2 * time.Second)
	}
	u := e.waitCondition("flaky", v1alpha1.ConditionAnomalous, metav1.ConditionTrue, "RestartsAboveNormal")
	if c := condition(u, v1alpha1.ConditionAnomalous); !strings.Contains(c.Message, "restarts in the last window against a normal of 0") {
		t.Errorf("Anomalous reads %q", c.Message)
	}
	if c := condition(u, v1alpha1.ConditionReady); c == nil || c.Status != metav1.ConditionTrue {
		t.Errorf("an anomaly changed Ready: %+v", c)
	}
	e.waitEvent("flaky", "AnomalyDetected", "restarts in the last window")
	e.waitCondition("flaky", v1alpha1.ConditionAnomalous, metav1.ConditionFalse, "WithinNormal")
	e.waitEvent("flaky", "AnomalyCleared", "back within this release's own normal")

	setReady := func(ready corev1.ConditionStatus) {
		kubelet(func(p *corev1.Pod) {
			for i := range p.Status.Conditions {
				if p.Status.Conditions[i].Type == corev1.PodReady {
					p.Status.Conditions[i].Status = ready
				}
			}
		})
	}
	setReady(corev1.ConditionFalse)
	e.waitCondition("flaky", v1alpha1.ConditionAnomalous, metav1.ConditionTrue, "UnreadyAboveNormal")
	setReady(corev1.ConditionTrue)
	e.waitCondition("flaky", v1alpha1.ConditionAnomalous, metav1.ConditionFalse, "WithinNormal")

	if n := steadyAnomalous(); n != 0 {
		t.Errorf("the steady release was seen anomalous %d times", n)
	}
}

// watchCondition samples name's condition typ every half second until the
// returned function is called; that returns how many samples were True.
func watchCondition(t *testing.T, e *env, name, typ string) func() int {
	t.Helper()
	stop := make(chan struct{})
	done := make(chan int)
	go func() {
		n := 0
		tick := time.NewTicker(500 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-stop:
				done <- n
				return
			case <-tick.C:
				u, err := e.dyn.Resource(webappGVR).Namespace(e.ns).Get(context.Background(), name, metav1.GetOptions{})
				if err == nil {
					if c := condition(u, typ); c != nil && c.Status == metav1.ConditionTrue {
						n++
					}
				}
			}
		}
	}()
	var once sync.Once
	n := 0
	finish := func() int {
		once.Do(func() { close(stop); n = <-done })
		return n
	}
	t.Cleanup(func() { finish() })
	return finish
}
