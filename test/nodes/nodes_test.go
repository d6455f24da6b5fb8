// Package nodes runs what chartpilot deploys on real nodes: containers
// that run (containerd, runc, a kubelet, CNI), not simulated pods.
package nodes

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"

	"github.com/chartpilot/chartpilot/internal/testcluster"
)

var cluster *testcluster.Cluster

func TestMain(m *testing.M) {
	os.Exit(testcluster.RunMain(m, testcluster.Options{Tier: testcluster.TierFull, Nodes: 1, RealNodes: 1}, &cluster))
}

// onRealNode places a pod on the real node (its label and taint).
func onRealNode(spec *corev1.PodSpec) {
	spec.NodeSelector = map[string]string{testcluster.RealNodeLabel: "true"}
	spec.Tolerations = append(spec.Tolerations, corev1.Toleration{Key: testcluster.RealNodeTaint, Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoSchedule})
}

// TestPodAnswersAtItsIP: a pod on the real node runs its container as UID
// 65532 with a read-only root filesystem, pulled from the cluster's
// registry, and answers HTTP at its pod IP with its own host name: only a
// running container can (a simulated pod has an IP nothing listens on).
func TestPodAnswersAtItsIP(t *testing.T) {
	ctx := context.Background()
	ns := cluster.Namespace(t)
	cs, err := kubernetes.NewForConfig(cluster.Config)
	if err != nil {
		t.Fatal(err)
	}
	uid, yes, no := int64(65532), true, false
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: ns},
		Spec: corev1.PodSpec{
			AutomountServiceAccountToken: &no,
			Containers: []corev1.Container{{
				Name: "web", Image: cluster.PodUtilImage, Args: []string{"serve", ":8080"},
				Ports:          []corev1.ContainerPort{{ContainerPort: 8080}},
				ReadinessProbe: &corev1.Probe{ProbeHandler: corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Path: "/", Port: intstr.FromInt32(8080)}}, PeriodSeconds: 1},
				SecurityContext: &corev1.SecurityContext{RunAsUser: &uid, RunAsNonRoot: &yes, ReadOnlyRootFilesystem: &yes, AllowPrivilegeEscalation: &no,
					Capabilities: &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}}},
			}},
		},
	}
	onRealNode(&pod.Spec)
	if _, err := cs.CoreV1().Pods(ns).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	var ip, last string
	err = wait.PollUntilContextTimeout(ctx, time.Second, 3*time.Minute, true, func(ctx context.Context) (bool, error) {
		p, err := cs.CoreV1().Pods(ns).Get(ctx, "web", metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		last = fmt.Sprintf("phase %s, ip %q, conditions %v, statuses %v", p.Status.Phase, p.Status.PodIP, p.Status.Conditions, p.Status.ContainerStatuses)
		for _, c := range p.Status.Conditions {
			if c.Type == corev1.PodReady && c.Status == corev1.ConditionTrue {
				ip = p.Status.PodIP
				return true, nil
			}
		}
		return false, nil
	})
	if err != nil {
		t.Fatalf("pod not Ready: %s: %v", last, err)
	}
	if !strings.HasPrefix(ip, "198.18.") {
		t.Fatalf("pod IP %s is outside 198.18.0.0/15", ip)
	}
	client := &http.Client{Timeout: 10 * time.Second}
	resp, err := client.Get("http://" + ip + ":8080/")
	if err != nil {
		t.Fatalf("GET the pod at %s: %v", ip, err)
	}
	body, _ := io.ReadAll(resp.Body)
	_ = resp.Body.Close()
	if got := strings.TrimSpace(string(body)); got != "hello from web" {
		t.Errorf("the pod at %s answered %q, want %q", ip, got, "hello from web")
	}
}
