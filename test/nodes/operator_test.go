package nodes

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/go-logr/logr"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/chartpilot/chartpilot/internal/helm"
	"github.com/chartpilot/chartpilot/internal/image"
	"github.com/chartpilot/chartpilot/internal/testing/testcluster"
)

// builtImage is the repository operatorImage pushed, once per run.
var builtImage string

// operatorImage builds chartpilot's image as `make image` does (linux/amd64
// only) and pushes it to the cluster's registry (once); it returns the
// repository (tag "test").
func operatorImage(t *testing.T) string {
	t.Helper()
	if builtImage != "" {
		return builtImage
	}
	root, err := testcluster.ModuleRoot()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	build := func(out string, tags ...string) {
		args := []string{"build", "-trimpath", "-ldflags=-s -w -X main.version=test", "-o", out}
		if len(tags) > 0 {
			args = append(args, "-tags", strings.Join(tags, ","))
		}
		cmd := exec.Command("go", append(args, "./cmd/chartpilot")...)
		cmd.Dir = root
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux", "GOARCH=amd64")
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("building chartpilot: %v\n%s", err, out)
		}
	}
	bin, mgr := filepath.Join(dir, "chartpilot"), filepath.Join(dir, "chartpilot-manager")
	build(bin)
	build(mgr, "manager")
	idx, err := image.Build(image.Options{Binaries: map[string]string{"linux/amd64": bin}, Managers: map[string]string{"linux/amd64": mgr}, Root: root, Version: "test"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cluster.Registry.PushIndex("chartpilot:test", idx); err != nil {
		t.Fatal(err)
	}
	builtImage = cluster.Registry.Host + "/chartpilot"
	return builtImage
}

// installOperator installs charts/chartpilot as release "chartpilot" in
// namespace ops with the image operatorImage built, on the real node, with
// extra values merged over that, and waits until its replicas are ready.
// At the end of the test it is uninstalled and its pods removed at once.
func installOperator(t *testing.T, ops string, replicas int, extra map[string]any) {
	t.Helper()
	ctx := context.Background()
	cs, _ := clients(t)
	ch, err := helm.LoadChart(filepath.Join("..", "..", "charts", "chartpilot"))
	if err != nil {
		t.Fatal(err)
	}
	hc, err := helm.NewClient(cluster.Config, logr.Discard())
	if err != nil {
		t.Fatal(err)
	}
	clusterKinds := []string{"ClusterRole.rbac.authorization.k8s.io", "ClusterRoleBinding.rbac.authorization.k8s.io",
		"ValidatingWebhookConfiguration.admissionregistration.k8s.io", "CustomResourceDefinition.apiextensions.k8s.io"}
	vals := map[string]any{
		"replicas":     int64(replicas),
		"image":        map[string]any{"repository": operatorImage(t), "tag": "test"},
		"nodeSelector": map[string]any{testcluster.RealNodeLabel: "true"},
		"tolerations":  []any{map[string]any{"key": testcluster.RealNodeTaint, "operator": "Exists", "effect": "NoSchedule"}},
	}
	for k, v := range extra {
		vals[k] = v
	}
	const release = "chartpilot"
	start := time.Now()
	if _, err := hc.Install(ctx, ch, helm.ActionOptions{Namespace: ops, Name: release, Values: vals, Timeout: 2 * time.Minute, ClusterKinds: clusterKinds}); err != nil {
		t.Fatalf("installing charts/chartpilot: %v", err)
	}
	t.Cleanup(func() {
		// Uninstalled, and its pods gone at once (not after their grace
		// period): the package's other tests run an operator of their own.
		_ = hc.Uninstall(helm.Scope{Namespace: ops, ClusterKinds: clusterKinds}, release, time.Minute)
		zero := int64(0)
		_ = cs.CoreV1().Pods(ops).DeleteCollection(ctx, metav1.DeleteOptions{GracePeriodSeconds: &zero}, metav1.ListOptions{})
		_ = wait.PollUntilContextTimeout(ctx, time.Second, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
			pods, err := cs.CoreV1().Pods(ops).List(ctx, metav1.ListOptions{})
			return err == nil && len(pods.Items) == 0, nil
		})
	})
	// On failure, what the operator said (it runs in a pod, so its log is
	// not among the cluster's component logs); registered after the
	// uninstall, so it runs before it.
	t.Cleanup(func() {
		if t.Failed() {
			logOperator(t, ops)
		}
	})
	var last string
	err = wait.PollUntilContextTimeout(ctx, 2*time.Second, 5*time.Minute, true, func(ctx context.Context) (bool, error) {
		d, err := cs.AppsV1().Deployments(ops).Get(ctx, release, metav1.GetOptions{})
		if err != nil {
			last = err.Error()
			return false, nil
		}
		last = fmt.Sprintf("%d of %d replicas ready", d.Status.ReadyReplicas, replicas)
		return int(d.Status.ReadyReplicas) == replicas, nil
	})
	if err != nil {
		pods, _ := cs.CoreV1().Pods(ops).List(ctx, metav1.ListOptions{})
		for _, p := range pods.Items {
			t.Logf("pod %s: %s %v", p.Name, p.Status.Phase, p.Status.ContainerStatuses)
		}
		t.Fatalf("the operator's Deployment: %s", last)
	}
	t.Logf("%d replicas ready %s after install", replicas, time.Since(start).Round(time.Second))
}

// logOperator logs the last lines of the operator pods' logs in ops.
func logOperator(t *testing.T, ops string) {
	t.Helper()
	cs, _ := clients(t)
	pods, err := cs.CoreV1().Pods(ops).List(context.Background(), metav1.ListOptions{})
	if err != nil {
		t.Logf("the operator's pods: %v", err)
		return
	}
	for _, p := range pods.Items {
		for container, log := range cluster.PodLogs(ops, p.Name) {
			lines := strings.Split(strings.TrimSpace(log), "\n")
			t.Logf("operator pod %s, %s's log, last %d of %d lines:\n%s", p.Name, container, min(len(lines), 120), len(lines), strings.Join(lines[max(0, len(lines)-120):], "\n"))
		}
	}
}

// logResource logs the conditions of resource ns/name and the events
// about it, as a failing test's diagnosis.
func logResource(t *testing.T, gvr schema.GroupVersionResource, ns, name string) {
	t.Helper()
	ctx := context.Background()
	cs, dyn := clients(t)
	if u, err := dyn.Resource(gvr).Namespace(ns).Get(ctx, name, metav1.GetOptions{}); err != nil {
		t.Logf("%s %s: %v", gvr.Resource, name, err)
	} else {
		conds, _, _ := unstructured.NestedSlice(u.Object, "status", "conditions")
		for _, c := range conds {
			m, _ := c.(map[string]any)
			t.Logf("%s %s: %v=%v (%v) %v", gvr.Resource, name, m["type"], m["status"], m["reason"], m["message"])
		}
	}
	evs, err := cs.CoreV1().Events(ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Logf("events in %s: %v", ns, err)
		return
	}
	for _, e := range evs.Items {
		if e.InvolvedObject.Name != name {
			continue
		}
		t.Logf("event %s/%s %s %s x%d: %s", e.InvolvedObject.Kind, e.InvolvedObject.Name, e.Type, e.Reason, e.Count, e.Message)
	}
}

// TestOperatorAsInstalled: charts/chartpilot, installed with the image
// `make image` builds, runs on the real node as users run it: two replicas
// whose probes answer, one of them leading; the API server calls the
// webhook the pods serve; once the leader's container is killed, a new
// process takes the Lease and the killed container is back.
func TestOperatorAsInstalled(t *testing.T) {
	ctx := context.Background()
	ops := cluster.Namespace(t)
	installOperator(t, ops, 2, nil)
	cs, dyn := clients(t)
	var last string
	// The webhook: the API server calls the pods through their Service.
	tenant := cluster.Namespace(t)
	pg := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "chartpilot.dev/v1alpha1", "kind": "Postgres",
		"metadata": map[string]any{"name": "db", "annotations": map[string]any{"chartpilot.dev/chart-version": "not a constraint"}},
		"spec":     map[string]any{"version": "17", "storage": map[string]any{"size": "1Gi"}},
	}}
	gvr := schema.GroupVersionResource{Group: "chartpilot.dev", Version: "v1alpha1", Resource: "postgres"}
	err := wait.PollUntilContextTimeout(ctx, 2*time.Second, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
		_, err := dyn.Resource(gvr).Namespace(tenant).Create(ctx, pg, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		last = fmt.Sprint(err)
		return err != nil && strings.Contains(last, "denied the request") && strings.Contains(last, "not a semver constraint"), nil
	})
	if err != nil {
		t.Fatalf("the webhook served by the pods: %s", last)
	}

	// Leader election: the leader's container killed, a new process leads
	// (the other replica, or the killed one's restart: whichever takes the
	// Lease once it expires), and the killed container was restarted.
	leader := func() (pod, identity string) {
		leases, err := cs.CoordinationV1().Leases(ops).List(ctx, metav1.ListOptions{})
		if err != nil {
			return "", ""
		}
		pods, _ := cs.CoreV1().Pods(ops).List(ctx, metav1.ListOptions{})
		for _, l := range leases.Items {
			if l.Spec.HolderIdentity == nil {
				continue
			}
			for _, p := range pods.Items {
				if strings.HasPrefix(*l.Spec.HolderIdentity, p.Name) {
					return p.Name, *l.Spec.HolderIdentity
				}
			}
		}
		return "", ""
	}
	var first, firstID string
	err = wait.PollUntilContextTimeout(ctx, time.Second, 2*time.Minute, true, func(context.Context) (bool, error) {
		first, firstID = leader()
		return first != "", nil
	})
	if err != nil {
		t.Fatal("no replica leads")
	}
	p, err := cs.CoreV1().Pods(ops).Get(ctx, first, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	killed := killContainer(t, string(p.UID), "chartpilot-manager")
	t.Logf("leader %s: killed its process %d", first, killed)
	handover := time.Now()
	var next, nextID string
	err = wait.PollUntilContextTimeout(ctx, time.Second, 3*time.Minute, true, func(context.Context) (bool, error) {
		next, nextID = leader()
		return nextID != "" && nextID != firstID, nil
	})
	if err != nil {
		t.Fatalf("after the leader's container was killed, the Lease stayed with %q", firstID)
	}
	t.Logf("%s (a new process) leads %s after the kill", next, time.Since(handover).Round(time.Second))
	err = wait.PollUntilContextTimeout(ctx, time.Second, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
		p, err = cs.CoreV1().Pods(ops).Get(ctx, first, metav1.GetOptions{})
		return err == nil && len(p.Status.ContainerStatuses) == 1 && p.Status.ContainerStatuses[0].RestartCount >= 1 && podReady(p), nil
	})
	if err != nil {
		t.Errorf("the killed container of %s was not restarted and ready: %v", first, p.Status.ContainerStatuses)
	}
}

// killContainer SIGKILLs a container's main process in pod uid: the
// oldest process of the pod (found on this machine: the real node's
// containers are its processes) whose program's name starts with prog. It
// returns the PID.
func killContainer(t *testing.T, uid, prog string) int {
	t.Helper()
	found := containerProcess(uid, prog)
	if found == 0 {
		t.Fatalf("no process %s of pod %s on this machine", prog, uid)
	}
	if err := syscall.Kill(found, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	return found
}

// containerProcess is the pid of the first process prog of the pod with
// uid on this machine (0: none).
func containerProcess(uid, prog string) int {
	procs, _ := filepath.Glob("/proc/[0-9]*/cgroup")
	want := strings.ReplaceAll(uid, "-", "_")
	found := 0
	for _, f := range procs {
		cg, err := os.ReadFile(f)
		if err != nil || (!strings.Contains(string(cg), uid) && !strings.Contains(string(cg), want)) {
			continue
		}
		pid, _ := strconv.Atoi(strings.TrimSuffix(strings.TrimPrefix(f, "/proc/"), "/cgroup"))
		cmd, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
		if !strings.HasPrefix(filepath.Base(strings.SplitN(string(cmd), "\x00", 2)[0]), prog) {
			continue
		}
		if found == 0 || pid < found {
			found = pid // a server's own children (PostgreSQL's) come after it
		}
	}
	return found
}
