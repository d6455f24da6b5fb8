package testcluster

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
)

// Restart stops a control-plane component — "kube-apiserver" or "etcd" —
// as an upgrade or a crash of it would (SIGTERM, SIGKILL after 15 s),
// leaves it down for down, starts it again with the same command line
// (same ports, certificates and data), and returns once the API server
// answers ready again. Clients see refused connections, then errors from
// an API server without its storage, while it is down.
func (c *Cluster) Restart(component string, down time.Duration) error {
	return c.restart(component, down, nil)
}

// RestartAPIServer restarts the API server as Restart does, with
// --runtime-config set to runtimeConfig (empty: the minor's defaults), as
// an upgrade that stops or starts serving API versions would.
func (c *Cluster) RestartAPIServer(runtimeConfig string) error {
	return c.restart("kube-apiserver", 0, func(args []string) []string {
		out := []string{}
		for _, a := range args {
			if !strings.HasPrefix(a, "--runtime-config=") {
				out = append(out, a)
			}
		}
		if runtimeConfig != "" {
			out = append(out, "--runtime-config="+runtimeConfig)
		}
		return out
	})
}

// Kubernetes is the minor of the cluster's control plane.
func (c *Cluster) Kubernetes() string { return c.opts.Kubernetes }

func (c *Cluster) restart(component string, down time.Duration, edit func([]string) []string) error {
	if component != "kube-apiserver" && component != "etcd" {
		return fmt.Errorf("restart: %q is not a restartable component (kube-apiserver, etcd)", component)
	}
	c.restartMu.Lock()
	defer c.restartMu.Unlock()
	var args []string
	if p := c.restarted[component]; p != nil {
		args = p.cmd.Args
		p.stop(15 * time.Second)
	} else {
		pid, cmdline, err := childNamed(component)
		if err != nil {
			return err
		}
		args = cmdline
		if err := stopPID(pid, 15*time.Second); err != nil {
			return err
		}
	}
	if edit != nil {
		args = append(args[:1:1], edit(args[1:])...)
	}
	time.Sleep(down)
	c.restarts++
	p, err := startProcess(fmt.Sprintf("%s-%d", component, c.restarts), args[0], args[1:], c.LogDir)
	if err != nil {
		return err
	}
	c.watchdog.register(p.cmd.Process.Pid)
	if c.restarted == nil {
		c.restarted = map[string]*process{}
	}
	c.restarted[component] = p
	// Stopped before the envtest components, like the other processes.
	c.procs = append(c.procs, p)
	return c.waitReady(2 * time.Minute)
}

// waitReady waits until the API server's /readyz answers ok.
func (c *Cluster) waitReady(timeout time.Duration) error {
	cs, err := kubernetes.NewForConfig(c.Config)
	if err != nil {
		return err
	}
	deadline := time.Now().Add(timeout)
	var last error
	for time.Now().Before(deadline) {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		_, last = cs.Discovery().RESTClient().Get().AbsPath("/readyz").DoRaw(ctx)
		cancel()
		if last == nil {
			return nil
		}
		time.Sleep(200 * time.Millisecond)
	}
	return fmt.Errorf("API server not ready %s after a restart: %w", timeout, last)
}

// childNamed finds the direct child process running the named binary.
func childNamed(name string) (int, []string, error) {
	for _, pid := range childPIDs() {
		raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
		if err != nil {
			continue
		}
		args := strings.Split(strings.TrimRight(string(raw), "\x00"), "\x00")
		if len(args) > 0 && filepath.Base(args[0]) == name {
			return pid, args, nil
		}
	}
	return 0, nil, fmt.Errorf("restart: no %s process found", name)
}

// stopPID sends SIGTERM and waits for the process to go (its parent reaps
// it), with SIGKILL after grace.
func stopPID(pid int, grace time.Duration) error {
	gone := func() bool {
		raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil {
			return true
		}
		// The state follows the parenthesised command name.
		s := string(raw)
		i := strings.LastIndexByte(s, ')')
		return i > 0 && len(s) > i+2 && (s[i+2] == 'Z' || s[i+2] == 'X')
	}
	if err := syscall.Kill(pid, syscall.SIGTERM); err != nil {
		return fmt.Errorf("restart: stopping pid %d: %w", pid, err)
	}
	deadline := time.Now().Add(grace)
	for !gone() {
		if time.Now().After(deadline) {
			_ = syscall.Kill(pid, syscall.SIGKILL)
			deadline = time.Now().Add(grace)
		}
		time.Sleep(50 * time.Millisecond)
	}
	return nil
}

// Cordon marks every node unschedulable (on) or schedulable again: with
// pods deleted meanwhile, workloads lose their pods until it is undone.
func (c *Cluster) Cordon(ctx context.Context, on bool) error {
	cs, err := kubernetes.NewForConfig(c.Config)
	if err != nil {
		return err
	}
	nodes, err := cs.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		return err
	}
	for _, n := range nodes.Items {
		if _, err := cs.CoreV1().Nodes().Patch(ctx, n.Name, types.MergePatchType, []byte(fmt.Sprintf(`{"spec":{"unschedulable":%v}}`, on)), metav1.PatchOptions{}); err != nil {
			return fmt.Errorf("cordon %s=%v: %w", n.Name, on, err)
		}
	}
	return nil
}
