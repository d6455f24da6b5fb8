package testcluster

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"

	"github.com/chartpilot/chartpilot/internal/testing/testcluster/hoststate"
)

// realNodeHelperEnv makes the test binary the process that starts a
// cluster with a real node for TestRealNodeLeavesNothing; its value says
// how that process ends (kill, stop, panic).
const realNodeHelperEnv = "CHARTPILOT_TESTCLUSTER_REAL_NODE_HELPER"

// boxInfo is what the helper reports of its running node.
type boxInfo struct {
	Dir        string
	InitPID    int
	PidNS      string
	NetNS      string
	MntNS      string
	NodeMounts []string
	ServiceIP  string
}

// TestRealNodeLeavesNothing starts a cluster with one real node in a child
// process, runs a pod there that holds mounts (an emptyDir in memory, its
// service-account token) behind a Service that answers from this machine,
// then ends the child three ways: every process of it SIGKILLed at once
// (its watchdog and the node's init included), a normal Stop, and a panic.
// Each time the machine must be as before the start: no process of the
// node or its pods, no mount under the run's directory, no interface,
// route, iptables rule, network namespace or cgroup of the run, and the
// kubelet's kernel tunables and the forwarding settings unchanged.
//
// After a kill nothing is alive to remove the node's cgroup directories
// (the kernel keeps them, empty): the test checks they hold no process,
// then runs what the next start runs (sweepNodeCgroups) before comparing.
func TestRealNodeLeavesNothing(t *testing.T) {
	if mode := os.Getenv(realNodeHelperEnv); mode != "" {
		realNodeHelper(mode)
		return
	}
	if testing.Short() {
		t.Skip("starts clusters with a real node")
	}
	if os.Geteuid() != 0 {
		t.Skip(errNotRoot.Error())
	}
	if err := checkFiles(cluster.opts.BinDir, realNodeBinaries); err != nil {
		t.Fatal(err)
	}
	for _, mode := range []string{"kill", "stop", "panic"} {
		t.Run(mode, func(t *testing.T) { leavesNothing(t, mode) })
	}
}

func leavesNothing(t *testing.T, mode string) {
	// The machine's real-nodes lock, held from the first record to the
	// last, and handed to the child for its cluster.
	lock, err := os.OpenFile(realNodesLock, os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	defer lock.Close()
	if err := wait.PollUntilContextTimeout(context.Background(), time.Second, 30*time.Minute, true, func(context.Context) (bool, error) {
		return syscall.Flock(int(lock.Fd()), syscall.LOCK_EX|syscall.LOCK_NB) == nil, nil
	}); err != nil {
		t.Fatalf("the real-nodes lock: %v", err)
	}
	place, err := cgroupPlacement()
	if err != nil {
		t.Fatal(err)
	}
	// What an earlier killed run left goes first, as any start does.
	sweepNodeCgroups(place)
	before, err := hoststate.Take()
	if err != nil {
		t.Fatal(err)
	}

	helperLog := filepath.Join(t.TempDir(), "helper.log")
	logFile, err := os.Create(helperLog)
	if err != nil {
		t.Fatal(err)
	}
	defer logFile.Close()
	cmd := exec.Command(os.Args[0], "-test.run=^TestRealNodeLeavesNothing$", "-test.v")
	// The cluster's directory is kept when the test fails: its logs.
	dir, err := os.MkdirTemp("", "chartpilot-box-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("the helper's cluster directory (logs) is kept: %s", dir)
		} else {
			_ = os.RemoveAll(dir)
		}
	})
	cmd.Env = append(os.Environ(), realNodeHelperEnv+"="+mode, realNodesLockFDEnv+"=3", "CHARTPILOT_TESTCLUSTER_HELPER_DIR="+filepath.Join(dir, "cluster"))
	cmd.ExtraFiles = []*os.File{lock}
	cmd.Stderr = logFile
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	ready := make(chan boxInfo, 1)
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			fmt.Fprintln(logFile, sc.Text())
			if info, ok := strings.CutPrefix(sc.Text(), "ready "); ok {
				var b boxInfo
				if json.Unmarshal([]byte(info), &b) == nil {
					ready <- b
				}
			}
		}
		exited <- cmd.Wait()
	}()
	var info boxInfo
	select {
	case info = <-ready:
	case err := <-exited:
		t.Fatalf("the helper ended before its node was ready (%v):\n%s", err, tailFile(helperLog, 60))
	case <-time.After(8 * time.Minute):
		_ = cmd.Process.Kill()
		t.Fatalf("the helper's node was not ready after 8 minutes:\n%s", tailFile(helperLog, 60))
	}
	t.Logf("node running: init %d, %s, %s, %s; the Service %s answered from this machine; the node's mounts under %s: %d (%s)",
		info.InitPID, info.PidNS, info.NetNS, info.MntNS, info.ServiceIP, info.Dir, len(info.NodeMounts), strings.Join(info.NodeMounts, ", "))
	if !slices.ContainsFunc(info.NodeMounts, func(m string) bool { return strings.Contains(m, "empty-dir") }) {
		t.Errorf("the pod's emptyDir is not among the node's mounts")
	}

	var killed []int
	switch mode {
	case "kill":
		killed = killTree(cmd.Process.Pid)
		t.Logf("stopped, then killed %d processes of the run at once", len(killed))
	case "stop", "panic":
		if _, err := io.WriteString(stdin, mode+"\n"); err != nil {
			t.Fatal(err)
		}
	}
	select {
	case err := <-exited:
		if mode == "stop" && err != nil {
			t.Errorf("the helper's Stop: %v\n%s", err, tailFile(helperLog, 40))
		}
		if mode == "panic" && err == nil {
			t.Errorf("the helper did not panic:\n%s", tailFile(helperLog, 40))
		}
	case <-time.After(3 * time.Minute):
		_ = cmd.Process.Kill()
		t.Fatalf("the helper did not end 3 minutes after %s:\n%s", mode, tailFile(helperLog, 40))
	}

	// The kernel ends a node's namespaces a moment after its last process.
	var left []string
	err = wait.PollUntilContextTimeout(context.Background(), 200*time.Millisecond, 2*time.Minute, true, func(context.Context) (bool, error) {
		left = leftOf(info, killed)
		return len(left) == 0, nil
	})
	if err != nil {
		t.Errorf("after %s, left of the run: %s", mode, strings.Join(left, "; "))
	}
	if mode != "stop" {
		dirs := place.nodeCgroups()
		for _, d := range dirs {
			if pids := cgroupProcs(d); len(pids) > 0 {
				t.Errorf("cgroup %s still holds processes %v after %s", d, pids, mode)
			}
		}
		t.Logf("the kernel kept %d empty cgroup directories of the node (%s); the next start's sweep removes them", len(dirs), strings.Join(dirs, ", "))
		sweepNodeCgroups(place)
	}
	after, err := hoststate.Take()
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("compared before and after (%s); kernel tunables and forwarding after: %s", after.Summary(), strings.Join(after["sysctl"], " "))
	var diff []string
	for _, d := range hoststate.Diff(before, after) {
		// The kubelet statistics' addresses of other packages' clusters
		// (198.18.255.0/24 on loopback) come and go with them.
		if !strings.Contains(d, "198.18.255.") {
			diff = append(diff, d)
		}
	}
	if len(diff) > 0 {
		t.Errorf("after %s the machine differs from before the start:\n%s", mode, strings.Join(diff, "\n"))
	}
	for _, m := range after["mounts"] {
		if strings.Contains(m, info.Dir) {
			t.Errorf("after %s, a mount under the run's directory: %s", mode, m)
		}
	}
}

// leftOf lists what of the run is still on this machine: processes of the
// node's namespaces, processes that were killed, and the link to the node.
func leftOf(info boxInfo, killed []int) []string {
	var left []string
	procs, _ := filepath.Glob("/proc/[0-9]*")
	for _, p := range procs {
		pid, _ := strconv.Atoi(filepath.Base(p))
		for _, ns := range []string{"pid", "net", "mnt"} {
			l, err := os.Readlink(filepath.Join(p, "ns", ns))
			if err == nil && (l == info.PidNS || l == info.NetNS || l == info.MntNS) {
				left = append(left, fmt.Sprintf("process %d in the node's %s", pid, l))
				break
			}
		}
	}
	for _, pid := range killed {
		if processAlive(pid) {
			left = append(left, fmt.Sprintf("process %d", pid))
		}
	}
	if _, err := os.Stat("/sys/class/net/" + hostLink); err == nil {
		left = append(left, "link "+hostLink)
	}
	return left
}

// killTree stops every process of the tree below root (root included)
// until no new one appears, then kills them all, as a supervisor ends a
// run; it returns their PIDs.
func killTree(root int) []int {
	stopped := map[int]bool{}
	for {
		grew := false
		for _, pid := range descendants(root) {
			if !stopped[pid] {
				_ = syscall.Kill(pid, syscall.SIGSTOP)
				stopped[pid], grew = true, true
			}
		}
		if !grew {
			break
		}
	}
	var pids []int
	for pid := range stopped {
		_ = syscall.Kill(pid, syscall.SIGKILL)
		pids = append(pids, pid)
	}
	return pids
}

// descendants lists root and every process below it (by parent PID).
func descendants(root int) []int {
	parent := map[int][]int{}
	procs, _ := filepath.Glob("/proc/[0-9]*/stat")
	for _, p := range procs {
		b, err := os.ReadFile(p)
		if err != nil {
			continue
		}
		s := string(b)
		i := strings.LastIndexByte(s, ')')
		f := strings.Fields(s[i+1:])
		pid, _ := strconv.Atoi(strings.Split(p, "/")[2])
		if len(f) > 1 {
			ppid, _ := strconv.Atoi(f[1])
			parent[ppid] = append(parent[ppid], pid)
		}
	}
	out := []int{root}
	for i := 0; i < len(out); i++ {
		out = append(out, parent[out[i]]...)
	}
	return out
}

// cgroupProcs lists the processes in cgroup dir and below.
func cgroupProcs(dir string) []string {
	var pids []string
	_ = filepath.WalkDir(dir, func(path string, d os.DirEntry, err error) error {
		if err == nil && d.Name() == "cgroup.procs" {
			b, _ := os.ReadFile(path)
			pids = append(pids, strings.Fields(string(b))...)
		}
		return nil
	})
	return pids
}

// realNodeHelper is the child of TestRealNodeLeavesNothing: it starts the
// cluster, runs the pod and its Service, reports "ready {boxInfo}", then
// waits for its end: SIGKILL (kill), or a line on stdin (stop, panic).
func realNodeHelper(mode string) {
	fail := func(format string, args ...any) {
		fmt.Printf("helper: "+format+"\n", args...)
		os.Exit(3)
	}
	ctx := context.Background()
	c, err := Start(ctx, Options{Tier: TierFull, Nodes: 1, RealNodes: 1, Dir: os.Getenv("CHARTPILOT_TESTCLUSTER_HELPER_DIR"), Log: os.Stderr})
	if err != nil {
		fail("start: %v", err)
	}
	cs, err := kubernetes.NewForConfig(c.Config)
	if err != nil {
		fail("%v", err)
	}
	ip, err := boxPod(ctx, c, cs)
	if err != nil {
		fail("%v", err)
	}
	info := boxInfo{Dir: c.Dir, InitPID: c.realNodes[0].init.cmd.Process.Pid, ServiceIP: ip}
	ns := func(kind string) string {
		l, _ := os.Readlink(fmt.Sprintf("/proc/%d/ns/%s", info.InitPID, kind))
		return l
	}
	info.PidNS, info.NetNS, info.MntNS = ns("pid"), ns("net"), ns("mnt")
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/mountinfo", info.InitPID))
	if err != nil {
		fail("%v", err)
	}
	for _, l := range strings.Split(string(b), "\n") {
		if f := strings.Fields(l); len(f) > 4 && strings.HasPrefix(f[4], c.Dir) {
			info.NodeMounts = append(info.NodeMounts, strings.TrimPrefix(f[4], c.Dir+"/"))
		}
	}
	out, _ := json.Marshal(info)
	fmt.Printf("ready %s\n", out)
	line, _ := bufio.NewReader(os.Stdin).ReadString('\n')
	switch strings.TrimSpace(line) {
	case "stop":
		if err := c.Stop(); err != nil {
			fail("stop: %v", err)
		}
		fmt.Println("stopped")
	case "panic":
		panic("deliberate panic with a real node running")
	default:
		// Killed before it reads a line, in the kill case.
		select {}
	}
}

// boxPod runs podutil's server on the real node with an emptyDir in memory
// and its service-account token (both mounts of the node), behind a
// Service, and returns the Service's address once it answers from here.
func boxPod(ctx context.Context, c *Cluster, cs kubernetes.Interface) (string, error) {
	if _, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "box"}}, metav1.CreateOptions{}); err != nil {
		return "", err
	}
	labels := map[string]string{"app": "box"}
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "box", Namespace: "box", Labels: labels},
		Spec: corev1.PodSpec{
			NodeSelector: map[string]string{RealNodeLabel: "true"},
			Tolerations:  []corev1.Toleration{{Key: RealNodeTaint, Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoSchedule}},
			Containers: []corev1.Container{{
				Name: "web", Image: c.PodUtilImage, Args: []string{"serve", ":8080"},
				ReadinessProbe: &corev1.Probe{ProbeHandler: corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Path: "/", Port: intstr.FromInt32(8080)}}, PeriodSeconds: 1},
				VolumeMounts:   []corev1.VolumeMount{{Name: "scratch", MountPath: "/scratch"}},
			}},
			Volumes: []corev1.Volume{{Name: "scratch", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{Medium: corev1.StorageMediumMemory}}}},
		},
	}
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "box", Namespace: "box"},
		Spec:       corev1.ServiceSpec{Selector: labels, Ports: []corev1.ServicePort{{Port: 80, TargetPort: intstr.FromInt32(8080)}}},
	}
	// ServiceAccount admission needs the namespace's default account,
	// which the controller manager makes a moment after the namespace.
	var last error
	if err := wait.PollUntilContextTimeout(ctx, time.Second, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
		_, last = cs.CoreV1().Pods("box").Create(ctx, pod, metav1.CreateOptions{})
		return last == nil, nil
	}); err != nil {
		return "", fmt.Errorf("creating the pod: %v", last)
	}
	created, err := cs.CoreV1().Services("box").Create(ctx, svc, metav1.CreateOptions{})
	if err != nil {
		return "", err
	}
	url := "http://" + created.Spec.ClusterIP + ":80/"
	err = wait.PollUntilContextTimeout(ctx, time.Second, 4*time.Minute, true, func(ctx context.Context) (bool, error) {
		client := http.Client{Timeout: 2 * time.Second}
		resp, err := client.Get(url)
		if err != nil {
			last = err
			return false, nil
		}
		_ = resp.Body.Close()
		last = fmt.Errorf("%s: %s", url, resp.Status)
		return resp.StatusCode == http.StatusOK, nil
	})
	if err != nil {
		return "", fmt.Errorf("the Service: %v (last: %v)", err, last)
	}
	return created.Spec.ClusterIP, nil
}
