package nodes

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"os"
	"path"
	"path/filepath"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/dynamic"
	"sigs.k8s.io/yaml"

	"github.com/chartpilot/chartpilot/internal/api/v1alpha1"
	"github.com/chartpilot/chartpilot/internal/testing/testcluster"
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

// watchesWithRedisBackupImage is the repository's watches.yaml as
// charts/chartpilot's watches value, its charts where the image holds
// them, with image as the Redis backup block's image.
func watchesWithRedisBackupImage(t *testing.T, image string) []any {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join("..", "..", "watches.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var ws []any
	if err := yaml.Unmarshal(raw, &ws); err != nil {
		t.Fatal(err)
	}
	for _, w := range ws {
		m := w.(map[string]any)
		if c, ok := m["chart"].(string); ok {
			m["chart"] = path.Join("/etc/chartpilot", c)
		}
		if m["kind"] == "Redis" {
			m["backup"].(map[string]any)["image"] = image
		}
	}
	return ws
}

// redisKeys writes n keys k0… with values v0-… to Redis name in ns, or
// (write false) reads them back, returning them in order.
func redisKeys(t *testing.T, ns, name string, n int, write bool) []string {
	t.Helper()
	cs, _ := clients(t)
	_, password := superuser(t, cs, ns, name)
	addr := net.JoinHostPort(serviceIP(t, cs, ns, name), "6379")
	cmds := [][]string{{"AUTH", password}}
	get := []string{"MGET"}
	for i := range n {
		if write {
			cmds = append(cmds, []string{"SET", fmt.Sprintf("k%d", i), fmt.Sprintf("v%d-%s", i, strings.Repeat("x", i%50))})
		}
		get = append(get, fmt.Sprintf("k%d", i))
	}
	cmds = append(cmds, get)
	var replies []string
	var err error
	// kube-proxy follows the Service's endpoints a moment after the pod is ready.
	if werr := wait.PollUntilContextTimeout(context.Background(), time.Second, time.Minute, true, func(context.Context) (bool, error) {
		replies, err = redisCommands(addr, cmds...)
		return err == nil && len(replies) == len(cmds) && replies[0] == "+OK", nil
	}); werr != nil {
		t.Fatalf("Redis %s at %s: %q, %v", name, addr, replies, err)
	}
	return strings.Fields(replies[len(replies)-1])
}

// TestRedisBackupRestoreOnRealPods: a Redis on the real node backed up by
// a real Job (redis-cli in Debian's redis image, the agent copied in) to
// the S3 server on the node network; a new Redis annotated
// chartpilot.dev/restore-from starts on the restored data file: every key
// and value equal. The backup corrupted in the store is refused by the
// restore Job before the data file is written: the release of a third
// Redis is not installed and its claim holds no data file.
func TestRedisBackupRestoreOnRealPods(t *testing.T) {
	ctx := context.Background()
	cs, dyn := clients(t)
	repo, tag := debianImage(t, "redis")
	s3dir, tenant := operatorWithStore(t, map[string]any{"watches": watchesWithRedisBackupImage(t, repo+":"+tag)})
	redis := func(name, restoreFrom string) {
		t.Helper()
		u := &unstructured.Unstructured{Object: map[string]any{"apiVersion": "chartpilot.dev/v1alpha1", "kind": "Redis",
			"metadata": map[string]any{"name": name, "namespace": tenant},
			"spec": map[string]any{"persistence": map[string]any{"enabled": true}, "image": map[string]any{"repository": repo, "tag": tag},
				"nodeSelector": map[string]any{testcluster.RealNodeLabel: "true"},
				"tolerations":  []any{map[string]any{"key": testcluster.RealNodeTaint, "operator": "Exists", "effect": "NoSchedule"}}}}}
		if restoreFrom != "" {
			u.SetAnnotations(map[string]string{v1alpha1.AnnotationRestoreFrom: restoreFrom})
		}
		createObjectThroughWebhook(t, dyn, redisGVR, u)
	}
	redis("cache", "")
	waitReady(t, dyn, redisGVR, tenant, "cache", "True", 5*time.Minute)
	const keys = 500
	want := redisKeys(t, tenant, "cache", keys, true)
	if len(want) != keys {
		t.Fatalf("%d keys written, want %d", len(want), keys)
	}
	createThroughWebhook(t, dyn, backupGVR, tenant, "Backup", "rb", map[string]any{"target": map[string]any{"kind": "Redis", "name": "cache"}, "store": map[string]any{"name": "local"}})
	waitBackupCompleted(t, tenant, "rb")

	redis("copy", "rb")
	u := waitReady(t, dyn, redisGVR, tenant, "copy", "True", 6*time.Minute)
	if status, msg := condition(u, v1alpha1.ConditionRestored); status != "True" {
		t.Errorf("Restored=%s (%s)", status, msg)
	}
	if got := redisKeys(t, tenant, "copy", keys, false); strings.Join(got, " ") != strings.Join(want, " ") {
		t.Errorf("the restored Redis has %d of the keys, or other values", len(got))
	}

	corruptLargest(t, s3dir)
	redis("bad", "rb")
	var msg string
	err := wait.PollUntilContextTimeout(ctx, 2*time.Second, 6*time.Minute, true, func(ctx context.Context) (bool, error) {
		u, err := dyn.Resource(redisGVR).Namespace(tenant).Get(ctx, "bad", metav1.GetOptions{})
		if err != nil {
			return false, nil
		}
		if status, _ := condition(u, v1alpha1.ConditionRestored); status == "True" {
			t.Fatal("the corrupted backup was restored")
		}
		_, msg = condition(u, "Reconciling")
		return strings.Contains(msg, "corrupted"), nil
	})
	if err != nil {
		t.Fatalf("the restore of the corrupted backup was not refused as such: %q", msg)
	}
	t.Logf("the corrupted backup: %s", msg)
	if rel, _, _ := unstructured.NestedMap(mustGet(t, dyn, redisGVR, tenant, "bad").Object, "status", "release"); rel != nil {
		t.Errorf("the release of bad was installed: %v", rel)
	}
	pvc, err := cs.CoreV1().PersistentVolumeClaims(tenant).Get(ctx, "data-bad-0", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	pv, err := cs.CoreV1().PersistentVolumes().Get(ctx, pvc.Spec.VolumeName, metav1.GetOptions{})
	if err != nil || pv.Spec.HostPath == nil {
		t.Fatalf("the volume of data-bad-0: %v", err)
	}
	entries, err := os.ReadDir(pv.Spec.HostPath.Path)
	if err != nil || len(entries) != 0 {
		t.Errorf("the claim of the refused restore holds %d files (%v)", len(entries), err)
	}
}

// mustGet reads resource ns/name.
func mustGet(t *testing.T, dyn dynamic.Interface, gvr schema.GroupVersionResource, ns, name string) *unstructured.Unstructured {
	t.Helper()
	u, err := dyn.Resource(gvr).Namespace(ns).Get(context.Background(), name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return u
}
