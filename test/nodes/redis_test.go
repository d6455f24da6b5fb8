package nodes

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/wait"
)

var redisGVR = schema.GroupVersionResource{Group: "chartpilot.dev", Version: "v1alpha1", Resource: "redis"}

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
	cs, dyn := clients(t)
	u := sample(t, "redis.yaml")
	name := u.GetName()
	u.Object["spec"].(map[string]any)["image"] = map[string]any{"repository": repo, "tag": tag}
	start := time.Now()
	if _, err := dyn.Resource(redisGVR).Namespace(ns).Create(ctx, u, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitReady(t, dyn, redisGVR, ns, name, "True", 5*time.Minute)
	t.Logf("%s Ready %s after create", name, time.Since(start).Round(time.Second))

	pod := onlyPod(t, cs, ns, name)
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

	// A killed container: reported, naming the workload; then Ready again.
	killReportedAndBack(t, redisGVR, pod, "redis-server")
	var r []string
	err = wait.PollUntilContextTimeout(ctx, time.Second, time.Minute, true, func(context.Context) (bool, error) {
		r, err = redisCommands(addr, []string{"AUTH", string(secret.Data["password"])}, []string{"PING"})
		return err == nil && len(r) == 2 && r[1] == "+PONG", nil
	})
	if err != nil {
		t.Errorf("redis-server after its restart: %q, %v", r, err)
	}
}
