package nodes

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/yaml"

	"github.com/chartpilot/chartpilot/internal/operator"
	"github.com/chartpilot/chartpilot/internal/testcluster"
	"github.com/chartpilot/chartpilot/internal/watches"
)

var redisGVR = schema.GroupVersionResource{Group: "chartpilot.dev", Version: "v1alpha1", Resource: "redis"}

// debianImage pushes the root filesystem hack/images.sh built from
// Debian's packages (bin/images/NAME.tar) as NAME:bookworm.
func debianImage(t *testing.T, name string) (repo, tag string) {
	t.Helper()
	root, err := testcluster.ModuleRoot()
	if err != nil {
		t.Fatal(err)
	}
	tar := filepath.Join(root, "bin", "images", name+".tar")
	if _, err := os.Stat(tar); err != nil {
		t.Fatalf("%s: run make tools (hack/images.sh builds it)", tar)
	}
	if _, err := cluster.Registry.PushRootFS("debian/"+name+":bookworm", tar, []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}); err != nil {
		t.Fatal(err)
	}
	return cluster.Registry.Host + "/debian/" + name, "bookworm"
}

// startOperator runs the operator in this process with the repository's
// watches.yaml until the test ends.
func startOperator(t *testing.T) {
	t.Helper()
	ws, err := watches.Load(filepath.Join("..", "..", "watches.yaml"))
	if err != nil {
		t.Fatal(err)
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

// redisCommands sends RESP commands to addr and returns the replies' lines.
func redisCommands(addr string, cmds ...[]string) ([]string, error) {
	conn, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(10 * time.Second))
	var b strings.Builder
	for _, c := range cmds {
		fmt.Fprintf(&b, "*%d\r\n", len(c))
		for _, a := range c {
			fmt.Fprintf(&b, "$%d\r\n%s\r\n", len(a), a)
		}
	}
	if _, err := conn.Write([]byte(b.String())); err != nil {
		return nil, err
	}
	r := bufio.NewReader(conn)
	var out []string
	for range cmds {
		line, err := r.ReadString('\n')
		if err != nil {
			return out, err
		}
		line = strings.TrimSpace(line)
		if strings.HasPrefix(line, "*") { // an array of bulk strings
			var n int
			fmt.Sscanf(line, "*%d", &n)
			var parts []string
			for range 2 * n {
				l, err := r.ReadString('\n')
				if err != nil {
					return out, err
				}
				if l = strings.TrimSpace(l); !strings.HasPrefix(l, "$") {
					parts = append(parts, l)
				}
			}
			line = strings.Join(parts, " ")
		}
		out = append(out, line)
	}
	return out, nil
}

// TestRedisSampleOnRealPods: config/samples/redis.yaml, its image from
// Debian's redis-server, on the real node: Ready only once redis-server
// answers, its Service serves the password the chart made and the
// sample's extraArgs; a killed container makes the resource report its
// workload unavailable (WorkloadsUnavailable, naming it), and it is Ready
// again by itself.
func TestRedisSampleOnRealPods(t *testing.T) {
	ctx := context.Background()
	repo, tag := debianImage(t, "redis")
	startOperator(t)
	ns := cluster.Namespace(t)
	cs, err := kubernetes.NewForConfig(cluster.Config)
	if err != nil {
		t.Fatal(err)
	}
	dyn, err := dynamic.NewForConfig(cluster.Config)
	if err != nil {
		t.Fatal(err)
	}
	raw, err := os.ReadFile(filepath.Join("..", "..", "config", "samples", "redis.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	u := &unstructured.Unstructured{}
	if err := yaml.Unmarshal(raw, &u.Object); err != nil {
		t.Fatal(err)
	}
	name := u.GetName()
	spec := u.Object["spec"].(map[string]any)
	spec["image"] = map[string]any{"repository": repo, "tag": tag}
	spec["nodeSelector"] = map[string]any{testcluster.RealNodeLabel: "true"}
	spec["tolerations"] = []any{map[string]any{"key": testcluster.RealNodeTaint, "operator": "Exists", "effect": "NoSchedule"}}
	start := time.Now()
	if _, err := dyn.Resource(redisGVR).Namespace(ns).Create(ctx, u, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	ready := func(want string, timeout time.Duration) string {
		t.Helper()
		var msg, status string
		err := wait.PollUntilContextTimeout(ctx, time.Second, timeout, true, func(ctx context.Context) (bool, error) {
			got, err := dyn.Resource(redisGVR).Namespace(ns).Get(ctx, name, metav1.GetOptions{})
			if err != nil {
				return false, nil
			}
			status, msg = condition(got, "Ready")
			return status == want, nil
		})
		if err != nil {
			t.Fatalf("%s: Ready=%s (%s), want %s", name, status, msg, want)
		}
		return msg
	}
	ready("True", 5*time.Minute)
	t.Logf("%s Ready %s after create", name, time.Since(start).Round(time.Second))

	pods, err := cs.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/instance=" + name})
	if err != nil || len(pods.Items) != 1 {
		t.Fatalf("pods of %s: %v (%d)", name, err, len(pods.Items))
	}
	pod := pods.Items[0]
	if pod.Spec.NodeName != testcluster.RealNodeName(0) || !podReady(&pod) {
		t.Fatalf("pod %s on %s, ready %v", pod.Name, pod.Spec.NodeName, podReady(&pod))
	}
	svc, err := cs.CoreV1().Services(ns).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	secret, err := cs.CoreV1().Secrets(ns).Get(ctx, name+"-auth", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	addr := net.JoinHostPort(svc.Spec.ClusterIP, "6379")
	// kube-proxy follows the Service's endpoints a moment after the pod is ready.
	var replies []string
	err = wait.PollUntilContextTimeout(ctx, time.Second, time.Minute, true, func(context.Context) (bool, error) {
		replies, err = redisCommands(addr, []string{"AUTH", string(secret.Data["password"])}, []string{"PING"}, []string{"CONFIG", "GET", "maxmemory"})
		return err == nil, nil
	})
	if err != nil || len(replies) != 3 || replies[0] != "+OK" || replies[1] != "+PONG" || replies[2] != "maxmemory 268435456" {
		t.Fatalf("redis-server through Service %s: %q, %v", addr, replies, err)
	}
	if r, err := redisCommands(addr, []string{"PING"}); err != nil || len(r) != 1 || !strings.HasPrefix(r[0], "-NOAUTH") {
		t.Errorf("redis-server without the password: %q, %v", r, err)
	}

	// A killed container: not Ready, naming the workload; then Ready again.
	killContainer(t, string(pod.UID), "redis-server")
	var unavailable string
	err = wait.PollUntilContextTimeout(ctx, time.Second, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
		evs, err := cs.CoreV1().Events(ns).List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, nil
		}
		for _, e := range evs.Items {
			if e.Reason == "WorkloadsUnavailable" && e.InvolvedObject.Name == name {
				unavailable = e.Message
				return true, nil
			}
		}
		return false, nil
	})
	if err != nil {
		t.Fatalf("no WorkloadsUnavailable event for %s after its container was killed", name)
	}
	if !strings.Contains(unavailable, "StatefulSet") || !strings.Contains(unavailable, name) {
		t.Errorf("WorkloadsUnavailable %q does not name the workload", unavailable)
	}
	ready("True", 3*time.Minute)
	var r []string
	err = wait.PollUntilContextTimeout(ctx, time.Second, time.Minute, true, func(context.Context) (bool, error) {
		r, err = redisCommands(addr, []string{"AUTH", string(secret.Data["password"])}, []string{"PING"})
		return err == nil && len(r) == 2 && r[1] == "+PONG", nil
	})
	if err != nil {
		t.Errorf("redis-server after its restart: %q, %v", r, err)
	}
}

func podReady(p *corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}
