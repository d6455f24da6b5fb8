package testcluster

import (
	"bufio"
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

	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"
)

// panicHelperEnv makes the test binary act as a process that starts a
// cluster and then panics, for TestNoOrphansWhenTestPanics.
const panicHelperEnv = "CHARTPILOT_TESTCLUSTER_PANIC_HELPER"

var cluster *Cluster

func TestMain(m *testing.M) {
	if os.Getenv(panicHelperEnv) != "" || os.Getenv(realNodeHelperEnv) != "" {
		os.Exit(m.Run())
	}
	os.Exit(RunMain(m, Options{Tier: TierFull, Nodes: 3}, &cluster))
}

// waitFor polls cond every half second until it holds or the generous
// deadline passes; the last observation is reported on failure.
func waitFor(t *testing.T, what string, timeout time.Duration, cond func(ctx context.Context) (bool, string, error)) {
	t.Helper()
	var last string
	err := wait.PollUntilContextTimeout(context.Background(), 500*time.Millisecond, timeout, true, func(ctx context.Context) (bool, error) {
		ok, obs, err := cond(ctx)
		last = obs
		return ok, err
	})
	if err != nil {
		t.Fatalf("waiting for %s: %v; last seen: %s (logs in %s)", what, err, last, cluster.LogDir)
	}
}

func clientset(t *testing.T) kubernetes.Interface {
	t.Helper()
	cluster.Skip(t)
	cs, err := kubernetes.NewForConfig(cluster.Config)
	if err != nil {
		t.Fatal(err)
	}
	return cs
}

func TestFullTierStatefulSetWithVolumeBecomesReady(t *testing.T) {
	cs := clientset(t)
	ns := cluster.Namespace(t)
	ctx := context.Background()
	labels := map[string]string{"app": "db"}
	sts := &appsv1.StatefulSet{
		ObjectMeta: metav1.ObjectMeta{Name: "db", Namespace: ns},
		Spec: appsv1.StatefulSetSpec{
			Replicas:    ptr.To[int32](2),
			ServiceName: "db",
			Selector:    &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec: corev1.PodSpec{Containers: []corev1.Container{{
					Name:         "db",
					Image:        "postgres:17",
					VolumeMounts: []corev1.VolumeMount{{Name: "data", MountPath: "/var/lib/postgresql/data"}},
					Resources: corev1.ResourceRequirements{Requests: corev1.ResourceList{
						corev1.ResourceEphemeralStorage: resource.MustParse("1Gi"),
					}},
				}}},
			},
			VolumeClaimTemplates: []corev1.PersistentVolumeClaim{{
				ObjectMeta: metav1.ObjectMeta{Name: "data"},
				Spec: corev1.PersistentVolumeClaimSpec{
					AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
					Resources: corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{
						corev1.ResourceStorage: resource.MustParse("1Gi"),
					}},
				},
			}},
		},
	}
	if _, err := cs.AppsV1().StatefulSets(ns).Create(ctx, sts, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "StatefulSet db to have 2 ready replicas", 3*time.Minute, func(ctx context.Context) (bool, string, error) {
		got, err := cs.AppsV1().StatefulSets(ns).Get(ctx, "db", metav1.GetOptions{})
		if err != nil {
			return false, err.Error(), nil
		}
		return got.Status.ReadyReplicas == 2, fmt.Sprintf("readyReplicas=%d", got.Status.ReadyReplicas), nil
	})
	pvcs, err := cs.CoreV1().PersistentVolumeClaims(ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(pvcs.Items) != 2 {
		t.Fatalf("want 2 PVCs, got %d", len(pvcs.Items))
	}
	for _, pvc := range pvcs.Items {
		if pvc.Status.Phase != corev1.ClaimBound {
			t.Errorf("PVC %s is %s, want Bound", pvc.Name, pvc.Status.Phase)
		}
		if pvc.Spec.StorageClassName == nil || *pvc.Spec.StorageClassName != DefaultStorageClass {
			t.Errorf("PVC %s has storage class %v, want the default %q", pvc.Name, pvc.Spec.StorageClassName, DefaultStorageClass)
		}
	}

	// Volume expansion: the default class allows it and the resizer completes it.
	pvc := pvcs.Items[0]
	pvc.Spec.Resources.Requests[corev1.ResourceStorage] = resource.MustParse("2Gi")
	if _, err := cs.CoreV1().PersistentVolumeClaims(ns).Update(ctx, &pvc, metav1.UpdateOptions{}); err != nil {
		t.Fatalf("expanding PVC: %v", err)
	}
	waitFor(t, "PVC expansion to 2Gi", 2*time.Minute, func(ctx context.Context) (bool, string, error) {
		got, err := cs.CoreV1().PersistentVolumeClaims(ns).Get(ctx, pvc.Name, metav1.GetOptions{})
		if err != nil {
			return false, err.Error(), nil
		}
		c := got.Status.Capacity[corev1.ResourceStorage]
		return c.Cmp(resource.MustParse("2Gi")) == 0, "capacity=" + c.String(), nil
	})
}

func TestFullTierJobCompletes(t *testing.T) {
	cs := clientset(t)
	ns := cluster.Namespace(t)
	job := &batchv1.Job{
		ObjectMeta: metav1.ObjectMeta{Name: "once", Namespace: ns},
		Spec: batchv1.JobSpec{
			Template: corev1.PodTemplateSpec{Spec: corev1.PodSpec{
				RestartPolicy: corev1.RestartPolicyNever,
				Containers:    []corev1.Container{{Name: "c", Image: "busybox"}},
			}},
		},
	}
	if _, err := cs.BatchV1().Jobs(ns).Create(context.Background(), job, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "Job once to complete", 3*time.Minute, func(ctx context.Context) (bool, string, error) {
		got, err := cs.BatchV1().Jobs(ns).Get(ctx, "once", metav1.GetOptions{})
		if err != nil {
			return false, err.Error(), nil
		}
		for _, c := range got.Status.Conditions {
			if c.Type == batchv1.JobComplete && c.Status == corev1.ConditionTrue {
				return true, "", nil
			}
		}
		return false, fmt.Sprintf("succeeded=%d failed=%d active=%d", got.Status.Succeeded, got.Status.Failed, got.Status.Active), nil
	})
}

func TestFullTierDeletingDeploymentCollectsPods(t *testing.T) {
	cs := clientset(t)
	ns := cluster.Namespace(t)
	ctx := context.Background()
	labels := map[string]string{"app": "web"}
	dep := &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: ns},
		Spec: appsv1.DeploymentSpec{
			Replicas: ptr.To[int32](2),
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "web", Image: "nginx"}}},
			},
		},
	}
	if _, err := cs.AppsV1().Deployments(ns).Create(ctx, dep, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "Deployment web to be available", 3*time.Minute, func(ctx context.Context) (bool, string, error) {
		got, err := cs.AppsV1().Deployments(ns).Get(ctx, "web", metav1.GetOptions{})
		if err != nil {
			return false, err.Error(), nil
		}
		return got.Status.AvailableReplicas == 2, fmt.Sprintf("available=%d", got.Status.AvailableReplicas), nil
	})
	pods, err := cs.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: "app=web"})
	if err != nil {
		t.Fatal(err)
	}
	if len(pods.Items) != 2 {
		t.Fatalf("want 2 pods before deletion, got %d", len(pods.Items))
	}
	bg := metav1.DeletePropagationBackground
	if err := cs.AppsV1().Deployments(ns).Delete(ctx, "web", metav1.DeleteOptions{PropagationPolicy: &bg}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "pods of the deleted Deployment to be garbage-collected", 3*time.Minute, func(ctx context.Context) (bool, string, error) {
		pods, err := cs.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: "app=web"})
		if err != nil {
			return false, err.Error(), nil
		}
		rs, err := cs.AppsV1().ReplicaSets(ns).List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, err.Error(), nil
		}
		return len(pods.Items) == 0 && len(rs.Items) == 0, fmt.Sprintf("%d pods, %d replicasets", len(pods.Items), len(rs.Items)), nil
	})
}

func TestCheckBinariesNamesTheFix(t *testing.T) {
	err := CheckBinaries(t.TempDir(), TierFull)
	if err == nil {
		t.Fatal("want an error for an empty bin directory")
	}
	for _, want := range []string{"run make tools", "kube-apiserver", "kwok"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not mention %q", err, want)
		}
	}
	if _, err := Start(context.Background(), Options{BinDir: t.TempDir()}); err == nil || !strings.Contains(err.Error(), "run make tools") {
		t.Errorf("Start with an empty bin dir: want 'run make tools', got %v", err)
	}
}

// TestNoOrphansWhenTestPanics runs this test binary as a helper that starts an
// api-tier cluster and panics, then checks that etcd and kube-apiserver died
// with it.
func TestNoOrphansWhenTestPanics(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a cluster")
	}
	if os.Getenv(panicHelperEnv) != "" {
		c, err := Start(context.Background(), Options{Tier: TierAPI, Dir: os.Getenv(panicHelperEnv)})
		if err != nil {
			fmt.Println("start failed:", err)
			os.Exit(3)
		}
		for _, pid := range childPIDs() {
			if pid != c.watchdog.cmd.Process.Pid {
				fmt.Printf("pid %d\n", pid)
			}
		}
		fmt.Println("started")
		panic("deliberate panic with a running cluster")
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestNoOrphansWhenTestPanics$", "-test.v")
	cmd.Env = append(os.Environ(), panicHelperEnv+"="+filepath.Join(t.TempDir(), "cluster"))
	out, _ := cmd.CombinedOutput()
	var pids []int
	started := false
	sc := bufio.NewScanner(strings.NewReader(string(out)))
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, "pid ") {
			if pid, err := strconv.Atoi(strings.TrimPrefix(line, "pid ")); err == nil {
				pids = append(pids, pid)
			}
		}
		if line == "started" {
			started = true
		}
	}
	if !started || len(pids) < 2 {
		t.Fatalf("helper did not start a cluster (pids %v); output:\n%s", pids, out)
	}
	waitFor(t, "etcd and kube-apiserver of the panicked process to exit", time.Minute, func(context.Context) (bool, string, error) {
		var alive []int
		for _, pid := range pids {
			if processAlive(pid) {
				alive = append(alive, pid)
			}
		}
		return len(alive) == 0, fmt.Sprintf("still alive: %v", alive), nil
	})
}

// processAlive reports whether pid runs and is not a zombie.
func processAlive(pid int) bool {
	if err := syscall.Kill(pid, 0); err != nil {
		return false
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	// The state follows the command name in parentheses.
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	return i < 0 || i+2 >= len(s) || s[i+2] != 'Z'
}

// TestKubeletStatsThroughNodeProxy: volume statistics set for a pod are
// read back through the API server's node proxy of the pod's node.
func TestKubeletStatsThroughNodeProxy(t *testing.T) {
	cs := clientset(t)
	ctx := context.Background()
	ns := cluster.Namespace(t)
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "stats", Namespace: ns},
		Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "busybox"}}},
	}
	if _, err := cs.CoreV1().Pods(ns).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	var node string
	waitFor(t, "the pod scheduled", time.Minute, func(ctx context.Context) (bool, string, error) {
		p, err := cs.CoreV1().Pods(ns).Get(ctx, "stats", metav1.GetOptions{})
		if err != nil {
			return false, "", err
		}
		node = p.Spec.NodeName
		return node != "", "unscheduled", nil
	})
	ks, err := cluster.ServeKubeletStats(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(ks.Stop)
	if err := ks.SetVolume(ctx, ns, "stats", "data-stats-0", 850, 1000); err != nil {
		t.Fatal(err)
	}
	raw, err := cs.CoreV1().RESTClient().Get().AbsPath("/api/v1/nodes", node, "proxy", "stats", "summary").DoRaw(ctx)
	if err != nil {
		t.Fatalf("GET stats/summary of %s through the node proxy: %v", node, err)
	}
	if !strings.Contains(string(raw), `"name":"data-stats-0"`) || !strings.Contains(string(raw), `"usedBytes":850`) {
		t.Errorf("summary of %s lacks the claim's statistics: %s", node, raw)
	}
	for i := range 3 {
		if other := NodeName(i); other != node {
			raw, err := cs.CoreV1().RESTClient().Get().AbsPath("/api/v1/nodes", other, "proxy", "stats", "summary").DoRaw(ctx)
			if err != nil || strings.Contains(string(raw), "data-stats-0") {
				t.Errorf("summary of %s (not the pod's node): %v %s", other, err, raw)
			}
		}
	}
}

// TestKubernetesMinor: a minor outside the matrix, or real nodes on an
// older control plane, are refused before anything starts; an older minor
// runs the control plane of its own directory and the rest of bin/.
func TestKubernetesMinor(t *testing.T) {
	bin := t.TempDir()
	for _, tc := range []struct {
		opts Options
		want string
	}{
		{Options{Kubernetes: "1.34", BinDir: bin}, "not in the version matrix"},
		{Options{Kubernetes: "1.35", Tier: TierFull, RealNodes: 1, BinDir: bin}, "newest control plane"},
	} {
		err := tc.opts.defaults()
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%+v: got %v, want an error saying %q", tc.opts, err, tc.want)
		}
	}
	o := Options{Kubernetes: "1.35", BinDir: bin}
	if err := o.defaults(); err != nil {
		t.Fatal(err)
	}
	if got, want := o.binPath("kube-apiserver"), filepath.Join(bin, "kubernetes-1.35", "kube-apiserver"); got != want {
		t.Errorf("kube-apiserver of 1.35: %s, want %s", got, want)
	}
	if got, want := o.binPath("etcd"), filepath.Join(bin, "etcd"); got != want {
		t.Errorf("etcd of 1.35: %s, want %s", got, want)
	}
	if err := checkBinaries(&o, TierAPI); err == nil || !strings.Contains(err.Error(), "kubernetes-1.35/kube-apiserver") {
		t.Errorf("missing 1.35 control plane: got %v, want it named", err)
	}
}

// TestWatchdogTrimsItsDirectoryToLogs: when the watchdog's stdin closes
// (the test binary died, or Stop kept the directory), the working
// directory keeps its logs and nothing else.
func TestWatchdogTrimsItsDirectoryToLogs(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "cluster")
	for _, f := range []string{"logs/etcd.log", "etcd/member/db", "volumes/pv-1/data", "kubeconfig", ".hidden"} {
		p := filepath.Join(dir, f)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte("x"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	wd, err := startWatchdog()
	if err != nil {
		t.Fatal(err)
	}
	wd.trimOnExit(dir)
	wd.close()
	waitFor(t, "the directory trimmed to its logs", time.Minute, func(context.Context) (bool, string, error) {
		entries, err := os.ReadDir(dir)
		if err != nil {
			return false, "", err
		}
		var names []string
		for _, e := range entries {
			names = append(names, e.Name())
		}
		return len(names) == 1 && names[0] == "logs", fmt.Sprintf("left: %v", names), nil
	})
	if b, err := os.ReadFile(filepath.Join(dir, "logs", "etcd.log")); err != nil || string(b) != "x" {
		t.Fatalf("the log is gone or changed: %q, %v", b, err)
	}
}
