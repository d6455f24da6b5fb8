package nodes

import (
	"context"
	"fmt"
	"strings"
	"syscall"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/dynamic"

	"github.com/chartpilot/chartpilot/internal/api/v1alpha1"
	"github.com/chartpilot/chartpilot/internal/watches"
)

// TestCrashLoopIsAnAnomaly: a Redis on the real node whose redis-server
// is killed each time it runs again (a crash loop, the kubelet restarting
// it with its back-off) is Anomalous within 2 minutes of the first kill,
// with a Warning event; left alone, it is ready again and the condition
// clears. Ready is not what says it: the resource's workload recovers
// between kills.
func TestCrashLoopIsAnAnomaly(t *testing.T) {
	ctx := context.Background()
	repo, tag := debianImage(t, "redis")
	startOperator(t, func(w *watches.Watch) {
		if w.GVK.Kind == "Redis" {
			w.Anomalies = &watches.Anomalies{Window: time.Minute, History: 10 * time.Minute}
		}
	})
	ns := cluster.Namespace(t)
	cs, dyn := clients(t)
	u := sample(t, "redis.yaml")
	name := u.GetName()
	u.Object["spec"].(map[string]any)["image"] = map[string]any{"repository": repo, "tag": tag}
	if _, err := dyn.Resource(redisGVR).Namespace(ns).Create(ctx, u, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitReady(t, dyn, redisGVR, ns, name, "True", 5*time.Minute)
	waitAnomalous(t, dyn, ns, name, metav1.ConditionFalse, 2*time.Minute)
	pod := onlyPod(t, cs, ns, name)

	first := time.Now()
	kills := 0
	var raised *metav1.Condition
	err := wait.PollUntilContextTimeout(ctx, time.Second, 4*time.Minute, true, func(ctx context.Context) (bool, error) {
		if c := anomalous(ctx, dyn, ns, name); c != nil && c.Status == metav1.ConditionTrue {
			raised = c
			return true, nil
		}
		if pid := containerProcess(string(pod.UID), "redis-server"); pid != 0 && syscall.Kill(pid, syscall.SIGKILL) == nil {
			kills++
		}
		return false, nil
	})
	if err != nil {
		t.Fatalf("not Anomalous after %d kills in %s: %v", kills, time.Since(first).Round(time.Second), anomalous(ctx, dyn, ns, name))
	}
	after := time.Since(first)
	t.Logf("Anomalous %s after the first kill (%d kills): %s: %s", after.Round(time.Second), kills, raised.Reason, raised.Message)
	if after > 2*time.Minute {
		t.Errorf("Anomalous only %s after the crash loop began, want within 2 minutes", after.Round(time.Second))
	}
	if raised.Reason != "UnreadyAboveNormal" && raised.Reason != "RestartsAboveNormal" {
		t.Errorf("raised for %s: %s", raised.Reason, raised.Message)
	}
	if got := eventCounts(t, cs, ns, name, "AnomalyDetected"); len(got) == 0 {
		t.Error("no AnomalyDetected event")
	}

	// Left alone, the container comes back and the condition clears.
	waitAnomalous(t, dyn, ns, name, metav1.ConditionFalse, 6*time.Minute)
	t.Logf("cleared %s after the last kill", time.Since(first.Add(after)).Round(time.Second))
	if got := eventCounts(t, cs, ns, name, "AnomalyCleared"); len(got) == 0 {
		t.Error("no AnomalyCleared event")
	}
	waitReady(t, dyn, redisGVR, ns, name, "True", 4*time.Minute)
}

// anomalous is name's Anomalous condition (nil: none yet, or unread).
func anomalous(ctx context.Context, dyn dynamic.Interface, ns, name string) *metav1.Condition {
	u, err := dyn.Resource(redisGVR).Namespace(ns).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return nil
	}
	return conditionOf(u, v1alpha1.ConditionAnomalous)
}

func conditionOf(u *unstructured.Unstructured, typ string) *metav1.Condition {
	for _, c := range v1alpha1.ReadReleaseStatus(u).Conditions {
		if c.Type == typ {
			return &c
		}
	}
	return nil
}

// waitAnomalous waits for name's Anomalous condition to be want.
func waitAnomalous(t *testing.T, dyn dynamic.Interface, ns, name string, want metav1.ConditionStatus, timeout time.Duration) {
	t.Helper()
	var last string
	err := wait.PollUntilContextTimeout(context.Background(), time.Second, timeout, true, func(ctx context.Context) (bool, error) {
		c := anomalous(ctx, dyn, ns, name)
		if c == nil {
			last = "no Anomalous condition"
			return false, nil
		}
		last = fmt.Sprintf("%s %s: %s", c.Status, c.Reason, c.Message)
		return c.Status == want, nil
	})
	if err != nil {
		t.Fatalf("%s Anomalous=%s: %v; last seen: %s", name, want, err, strings.TrimSpace(last))
	}
}
