package testcluster

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
)

// PauseKubelet stops real node i's kubelet (SIGSTOP) until resume is
// called: the node's containers run on, but none is started, restarted or
// stopped and no pod status is reported meanwhile, as when a node's agent
// hangs. Resume (SIGCONT) before the node's lease runs out (40 s), or the
// node is marked unreachable.
func (c *Cluster) PauseKubelet(i int) (resume func(), err error) {
	pid, err := c.nodeProgram(i, "kubelet")
	if err != nil {
		return nil, err
	}
	if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
		return nil, fmt.Errorf("stopping the kubelet of %s: %w", RealNodeName(i), err)
	}
	var once sync.Once
	return func() { once.Do(func() { _ = syscall.Kill(pid, syscall.SIGCONT) }) }, nil
}

// KubeletState is the state of real node i's kubelet process as the
// kernel shows it (/proc/PID/stat: R running, S sleeping, T stopped, ...),
// for a test's report of what the node was doing.
func (c *Cluster) KubeletState(i int) string {
	pid, err := c.nodeProgram(i, "kubelet")
	if err != nil {
		return err.Error()
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return err.Error()
	}
	// The command name is in parentheses and may hold spaces; the state
	// follows the last one.
	if i := bytes.LastIndexByte(b, ')'); i >= 0 && i+2 < len(b) {
		return string(b[i+2])
	}
	return "unreadable"
}

// nodeProgram finds the process (its PID here) of real node i's program
// name: a process of the node's PID namespace running that binary.
func (c *Cluster) nodeProgram(i int, name string) (int, error) {
	if i < 0 || i >= len(c.realNodes) {
		return 0, fmt.Errorf("no real node %d in this cluster", i)
	}
	init := c.realNodes[i].init.cmd.Process.Pid
	ns, err := os.Readlink(fmt.Sprintf("/proc/%d/ns/pid", init))
	if err != nil {
		return 0, fmt.Errorf("real node %s: %w", RealNodeName(i), err)
	}
	procs, _ := filepath.Glob("/proc/[0-9]*")
	for _, p := range procs {
		pid, err := strconv.Atoi(filepath.Base(p))
		if err != nil || pid == init {
			continue
		}
		if pns, err := os.Readlink(filepath.Join(p, "ns", "pid")); err != nil || pns != ns {
			continue
		}
		if exe, err := os.Readlink(filepath.Join(p, "exe")); err == nil && filepath.Base(exe) == name {
			return pid, nil
		}
	}
	return 0, fmt.Errorf("no process %s on real node %s", name, RealNodeName(i))
}

// PodLogs returns what each container of pod ns/name wrote on the real
// nodes (the kubelets' pod log files), by container name; a container
// restarted has its runs joined.
func (c *Cluster) PodLogs(ns, name string) map[string]string {
	out := map[string]string{}
	for _, n := range c.realNodes {
		files, _ := filepath.Glob(filepath.Join(n.dir, "logs", ns+"_"+name+"_*", "*", "*.log"))
		for _, f := range files {
			b, err := os.ReadFile(f)
			if err != nil {
				continue
			}
			container := filepath.Base(filepath.Dir(f))
			out[container] += string(b)
		}
	}
	return out
}

// Exec runs command in container of pod ns/pod through the API server and
// the node's kubelet (the pinned kubectl's exec), returning its output.
func (c *Cluster) Exec(ctx context.Context, ns, pod, container string, command ...string) (string, error) {
	args := append([]string{"--kubeconfig", c.KubeconfigPath, "-n", ns, "exec", pod, "-c", container, "--"}, command...)
	cmd := exec.CommandContext(ctx, filepath.Join(c.opts.BinDir, "kubectl"), args...)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return string(out), fmt.Errorf("kubectl exec %s/%s: %w: %s", ns, pod, err, stderr.String())
	}
	return string(out), nil
}
