package testcluster

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
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
	name := RealNodeName(i) + "-kubelet"
	for _, p := range c.procs {
		if p.name != name {
			continue
		}
		if err := p.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
			return nil, fmt.Errorf("stopping %s: %w", name, err)
		}
		var once sync.Once
		return func() { once.Do(func() { _ = p.cmd.Process.Signal(syscall.SIGCONT) }) }, nil
	}
	return nil, fmt.Errorf("no process %s in this cluster", name)
}

// KubeletState is the state of real node i's kubelet process as the
// kernel shows it (/proc/PID/stat: R running, S sleeping, T stopped, ...),
// for a test's report of what the node was doing.
func (c *Cluster) KubeletState(i int) string {
	name := RealNodeName(i) + "-kubelet"
	for _, p := range c.procs {
		if p.name != name || p.cmd.Process == nil {
			continue
		}
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", p.cmd.Process.Pid))
		if err != nil {
			return err.Error()
		}
		// The command name is in parentheses and may hold spaces; the
		// state follows the last one.
		if i := bytes.LastIndexByte(b, ')'); i >= 0 && i+2 < len(b) {
			return string(b[i+2])
		}
		return "unreadable"
	}
	return "no process " + name
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
