package nodes

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/yaml"

	"github.com/chartpilot/chartpilot/internal/operator"
	"github.com/chartpilot/chartpilot/internal/testing/testcluster"
	"github.com/chartpilot/chartpilot/internal/watches"
)

// debianPath is the PATH of the images made from Debian's packages.
const debianPath = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

// rootFS is the root filesystem hack/images.sh built from Debian's
// packages (bin/images/NAME.tar).
func rootFS(t *testing.T, name string) string {
	t.Helper()
	cluster.Skip(t)
	root, err := testcluster.ModuleRoot()
	if err != nil {
		t.Fatal(err)
	}
	tar := filepath.Join(root, "bin", "images", name+".tar")
	if _, err := os.Stat(tar); err != nil {
		t.Fatalf("%s: run make tools (hack/images.sh builds it)", tar)
	}
	return tar
}

// debianImage pushes rootFS(name) as debian/NAME:bookworm and returns its
// repository and tag.
func debianImage(t *testing.T, name string) (repo, tag string) {
	t.Helper()
	if _, err := cluster.Registry.PushRootFS("debian/"+name+":bookworm", rootFS(t, name), v1.Config{Env: []string{debianPath}}); err != nil {
		t.Fatal(err)
	}
	return cluster.Registry.Host + "/debian/" + name, "bookworm"
}

// startOperator runs the operator in this process with the repository's
// watches.yaml until the test ends.
func startOperator(t *testing.T, mutate ...func(*watches.Watch)) {
	t.Helper()
	cluster.Skip(t)
	ws, err := watches.Load(filepath.Join("..", "..", "watches.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	for i := range ws {
		for _, m := range mutate {
			m(&ws[i])
		}
	}
	mgr, err := operator.New(operator.Options{Config: cluster.Config, Watches: ws, MetricsAddr: "0", ProbeAddr: "0", SeveralInProcess: true})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = mgr.Start(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
}

// clients are the typed and dynamic clients of the cluster.
func clients(t *testing.T) (kubernetes.Interface, dynamic.Interface) {
	t.Helper()
	cluster.Skip(t)
	cs, err := kubernetes.NewForConfig(cluster.Config)
	if err != nil {
		t.Fatal(err)
	}
	dyn, err := dynamic.NewForConfig(cluster.Config)
	if err != nil {
		t.Fatal(err)
	}
	return cs, dyn
}

// sample reads config/samples/FILE and places its pods on the real node.
func sample(t *testing.T, file string) *unstructured.Unstructured {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join("..", "..", "config", "samples", file))
	if err != nil {
		t.Fatal(err)
	}
	u := &unstructured.Unstructured{}
	if err := yaml.Unmarshal(raw, &u.Object); err != nil {
		t.Fatal(err)
	}
	spec := u.Object["spec"].(map[string]any)
	spec["nodeSelector"] = map[string]any{testcluster.RealNodeLabel: "true"}
	spec["tolerations"] = []any{map[string]any{"key": testcluster.RealNodeTaint, "operator": "Exists", "effect": "NoSchedule"}}
	return u
}

// condition returns the status and message of condition typ of u.
func condition(u *unstructured.Unstructured, typ string) (string, string) {
	conds, _, _ := unstructured.NestedSlice(u.Object, "status", "conditions")
	for _, c := range conds {
		m, _ := c.(map[string]any)
		if m["type"] == typ {
			return fmt.Sprint(m["status"]), fmt.Sprint(m["message"])
		}
	}
	return "", ""
}

// waitReady waits until resource ns/name has Ready=want and returns it.
func waitReady(t *testing.T, dyn dynamic.Interface, gvr schema.GroupVersionResource, ns, name, want string, timeout time.Duration) *unstructured.Unstructured {
	t.Helper()
	var got *unstructured.Unstructured
	var status, msg string
	err := wait.PollUntilContextTimeout(context.Background(), time.Second, timeout, true, func(ctx context.Context) (bool, error) {
		u, err := dyn.Resource(gvr).Namespace(ns).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, nil
		}
		got = u
		status, msg = condition(u, "Ready")
		return status == want, nil
	})
	if err != nil {
		t.Fatalf("%s: Ready=%s (%s), want %s", name, status, msg, want)
	}
	return got
}

// eventCounts counts the events of reason about object name in ns, by
// event name (an event repeated raises its count).
func eventCounts(t *testing.T, cs kubernetes.Interface, ns, name, reason string) map[string]int32 {
	t.Helper()
	evs, err := cs.CoreV1().Events(ns).List(context.Background(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]int32{}
	for _, e := range evs.Items {
		if e.Reason == reason && e.InvolvedObject.Name == name {
			out[e.Name] = max(e.Count, 1)
		}
	}
	return out
}

// waitNewEvent waits for an event of reason about name in ns that is not
// in before (or was repeated since) and returns its message.
func waitNewEvent(t *testing.T, cs kubernetes.Interface, ns, name, reason string, before map[string]int32, timeout time.Duration) string {
	t.Helper()
	var msg string
	err := wait.PollUntilContextTimeout(context.Background(), time.Second, timeout, true, func(ctx context.Context) (bool, error) {
		evs, err := cs.CoreV1().Events(ns).List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, nil
		}
		for _, e := range evs.Items {
			if e.Reason == reason && e.InvolvedObject.Name == name && max(e.Count, 1) > before[e.Name] {
				msg = e.Message
				return true, nil
			}
		}
		return false, nil
	})
	if err != nil {
		t.Fatalf("no new %s event for %s within %s", reason, name, timeout)
	}
	return msg
}

func podReady(p *corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// onlyPod returns the one pod of release name in ns, checking it runs on
// the real node and is Ready.
func onlyPod(t *testing.T, cs kubernetes.Interface, ns, name string) corev1.Pod {
	t.Helper()
	pods, err := cs.CoreV1().Pods(ns).List(context.Background(), metav1.ListOptions{LabelSelector: "app.kubernetes.io/instance=" + name})
	if err != nil || len(pods.Items) != 1 {
		t.Fatalf("pods of %s: %v (%d)", name, err, len(pods.Items))
	}
	pod := pods.Items[0]
	if pod.Spec.NodeName != testcluster.RealNodeName(0) || !podReady(&pod) {
		t.Fatalf("pod %s on %s, ready %v", pod.Name, pod.Spec.NodeName, podReady(&pod))
	}
	return pod
}

// killReportedAndBack SIGKILLs the main process prog of pod, the one pod
// of resource gvr named after its release, and waits for a new
// WorkloadsUnavailable event of the resource naming its StatefulSet, then
// for the resource to be Ready again.
func killReportedAndBack(t *testing.T, gvr schema.GroupVersionResource, pod corev1.Pod, prog string) {
	t.Helper()
	cs, dyn := clients(t)
	name := pod.Labels["app.kubernetes.io/instance"]
	before := eventCounts(t, cs, pod.Namespace, name, "WorkloadsUnavailable")
	killContainer(t, string(pod.UID), prog)
	unavailable := waitNewEvent(t, cs, pod.Namespace, name, "WorkloadsUnavailable", before, 2*time.Minute)
	if !strings.Contains(unavailable, "StatefulSet") || !strings.Contains(unavailable, name) {
		t.Errorf("WorkloadsUnavailable %q does not name the workload", unavailable)
	}
	waitReady(t, dyn, gvr, pod.Namespace, name, "True", 4*time.Minute)
}

// createThroughWebhook creates a chartpilot.dev/v1alpha1 resource in ns
// with the operator's admission webhook in the way: kube-proxy follows
// the webhook Service's endpoints a moment after the operator's pod is
// ready, so a refusal for not reaching the webhook is tried again.
func createThroughWebhook(t *testing.T, dyn dynamic.Interface, gvr schema.GroupVersionResource, ns, kind, name string, spec map[string]any) {
	t.Helper()
	createObjectThroughWebhook(t, dyn, gvr, &unstructured.Unstructured{Object: map[string]any{"apiVersion": "chartpilot.dev/v1alpha1", "kind": kind,
		"metadata": map[string]any{"name": name, "namespace": ns}, "spec": spec}})
}

// createObjectThroughWebhook is createThroughWebhook of a whole object.
func createObjectThroughWebhook(t *testing.T, dyn dynamic.Interface, gvr schema.GroupVersionResource, u *unstructured.Unstructured) {
	t.Helper()
	var err error
	_ = wait.PollUntilContextTimeout(context.Background(), time.Second, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
		_, err = dyn.Resource(gvr).Namespace(u.GetNamespace()).Create(ctx, u, metav1.CreateOptions{})
		return err == nil || !strings.Contains(err.Error(), "failed calling webhook"), nil
	})
	if err != nil {
		t.Fatalf("creating %s %s: %v", u.GetKind(), u.GetName(), err)
	}
}
