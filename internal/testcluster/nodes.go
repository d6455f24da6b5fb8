package testcluster

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
)

// Real nodes run containers: containerd, runc and a kubelet per node, CNI
// bridge networking, images from a registry on loopback. They use
// addresses of 198.18.0.0/15 only (set aside for network tests): node i
// has 198.18.i.1 on its bridge and its pods 198.18.i.0/24, Services take
// RealNodesServiceRange, and a blackhole route for the whole /15 keeps any
// packet no rule catches on this machine. Pods get a route to the /15
// only, so they reach nothing else either.
const (
	// RealNodeLabel marks the real nodes (value "true"); RealNodeTaint
	// (NoSchedule, same key) keeps pods that do not tolerate it off them.
	RealNodeLabel = "chartpilot.dev/real-node"
	RealNodeTaint = RealNodeLabel
	// RealNodesServiceRange is the Service range of a cluster with real
	// nodes; kube-proxy routes it on this machine.
	RealNodesServiceRange = "198.19.0.0/16"
	// kubernetesServiceIP is the kubernetes Service's address in it.
	kubernetesServiceIP = "198.19.0.1"
	// realNodesRange is routed nowhere but to the nodes' bridges.
	realNodesRange = "198.18.0.0/15"
	// realNodesLock is held by the one cluster with real nodes on this
	// machine: they share the host's network and iptables.
	realNodesLock = "/run/lock/chartpilot-real-nodes.lock"
)

// RealNodeName is the name of the i-th real node.
func RealNodeName(i int) string { return fmt.Sprintf("real-node-%d", i) }

// RealNodeIP is the address of the i-th real node (its bridge's).
func RealNodeIP(i int) string { return fmt.Sprintf("198.18.%d.1", i) }

// pauseRepo is the repository of the pod sandbox image in the registry.
const pauseRepo = "chartpilot/pause"

// realNode is one node's processes and places.
type realNode struct {
	name, dir, bridge, cgroupRoot string
}

// realNodeBinaries are the binaries the real nodes need.
var realNodeBinaries = []string{"containerd", "containerd-shim-runc-v2", "ctr", "runc", "kubelet", "kube-proxy", "coredns",
	"cni/bridge", "cni/host-local", "cni/loopback", "cni/portmap"}

// startRealNodes starts opts.RealNodes real nodes and waits for them to be
// Ready. The full tier's control plane runs already.
func (c *Cluster) startRealNodes(ctx context.Context, opts Options) error {
	if os.Geteuid() != 0 {
		return errNotRoot
	}
	if err := c.lockRealNodes(ctx); err != nil {
		return err
	}
	if err := c.podUtil(); err != nil {
		return err
	}
	reg, err := startRegistry(filepath.Join(c.Dir, "registry"), openLog(c.LogDir, "registry"))
	if err != nil {
		return err
	}
	c.Registry = reg
	data, err := os.ReadFile(filepath.Join(c.Dir, "podutil"))
	if err != nil {
		return err
	}
	pause, err := reg.PushFiles(pauseRepo, "1", []File{{Path: "/pause", Mode: 0o755, Data: data}}, "65535", []string{"/pause"})
	if err != nil {
		return err
	}
	c.PodUtilImage, err = reg.PushFiles("chartpilot/podutil", "1", []File{{Path: "/usr/local/bin/podutil", Mode: 0o755, Data: data}}, "65532", []string{"/usr/local/bin/podutil"})
	if err != nil {
		return err
	}
	for i := range opts.RealNodes {
		c.realNodes = append(c.realNodes, &realNode{name: RealNodeName(i), dir: filepath.Join(c.Dir, "nodes", RealNodeName(i)), bridge: fmt.Sprintf("cpbr%d", i), cgroupRoot: "chartpilot-" + RealNodeName(i)})
	}
	c.nodesTeardown = filepath.Join(c.Dir, "nodes", "teardown.sh")
	if err := os.MkdirAll(filepath.Dir(c.nodesTeardown), 0o755); err != nil {
		return err
	}
	if err := os.WriteFile(c.nodesTeardown, []byte(c.teardownScript(opts.BinDir)), 0o755); err != nil {
		return err
	}
	// What a crashed earlier run left, then this run's own tear-down when
	// this process dies.
	_ = exec.Command("/bin/sh", c.nodesTeardown).Run()
	c.watchdog.cleanup(c.nodesTeardown)
	for path, v := range map[string]string{"/proc/sys/net/ipv4/ip_forward": "1", "/proc/sys/net/bridge/bridge-nf-call-iptables": "1"} {
		if err := os.WriteFile(path, []byte(v), 0o644); err != nil {
			return fmt.Errorf("%s: %w (kube-proxy's Services need it)", path, err)
		}
	}
	for i, n := range c.realNodes {
		if err := c.startRealNode(ctx, opts, i, n, pause); err != nil {
			return fmt.Errorf("real node %s: %w", n.name, err)
		}
	}
	if err := c.startAPIProxy(); err != nil {
		return err
	}
	if err := c.startKubeProxy(opts.BinDir); err != nil {
		return err
	}
	if err := c.startCoreDNS(opts.BinDir); err != nil {
		return err
	}
	cs, err := kubernetes.NewForConfig(c.Config)
	if err != nil {
		return err
	}
	fmt.Fprintf(opts.Log, "waiting for %d real nodes to become Ready\n", opts.RealNodes)
	return c.waitNodesReady(ctx, cs, opts.Nodes+opts.RealNodes)
}

// lockRealNodes waits for (and keeps) the machine's real-nodes lock.
func (c *Cluster) lockRealNodes(ctx context.Context) error {
	if err := os.MkdirAll(filepath.Dir(realNodesLock), 0o755); err != nil {
		return err
	}
	f, err := os.OpenFile(realNodesLock, os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return err
	}
	err = wait.PollUntilContextTimeout(ctx, time.Second, 30*time.Minute, true, func(context.Context) (bool, error) {
		return syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB) == nil, nil
	})
	if err != nil {
		_ = f.Close()
		return fmt.Errorf("another cluster with real nodes runs on this machine (%s): %w", realNodesLock, err)
	}
	c.nodesLock = f
	return nil
}

// podUtil builds the program of the nodes' images (pause, and a server
// that tells a running container from a simulated one).
func (c *Cluster) podUtil() error {
	root, err := ModuleRoot()
	if err != nil {
		return err
	}
	cmd := exec.Command("go", "build", "-trimpath", "-ldflags=-s -w", "-o", filepath.Join(c.Dir, "podutil"), "./internal/testcluster/podutil")
	cmd.Dir = root
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux", "GOARCH=amd64")
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("building podutil: %v\n%s", err, out)
	}
	return nil
}

func (c *Cluster) startRealNode(ctx context.Context, opts Options, i int, n *realNode, pause string) error {
	bin := opts.BinDir
	for _, d := range []string{"containerd", "cni/net.d", "cni/ipam", "kubelet", "logs"} {
		if err := os.MkdirAll(filepath.Join(n.dir, d), 0o755); err != nil {
			return err
		}
	}
	if err := n.network(i); err != nil {
		return err
	}
	sock, err := n.startContainerd(c, bin, pause)
	if err != nil {
		return err
	}
	return n.startKubelet(ctx, c, bin, i, sock)
}

// teardownScript tears the real nodes down: kube-proxy's rules, each
// node's pods' processes, containerd's shims, every mount under the node's
// directory, its cgroups and bridge, and the routes of the range.
func (c *Cluster) teardownScript(bin string) string {
	var b strings.Builder
	b.WriteString("#!/bin/sh\n# Tears down the real nodes of the cluster in " + c.Dir + ".\n")
	fmt.Fprintf(&b, "%q --cleanup >/dev/null 2>&1\n", filepath.Join(bin, "kube-proxy"))
	for _, n := range c.realNodes {
		sock := filepath.Join(n.dir, "containerd", "containerd.sock")
		fmt.Fprintf(&b, `# %[1]s
for f in $(find /sys/fs/cgroup/*/%[2]s -name cgroup.procs 2>/dev/null); do
	for p in $(cat "$f"); do kill -9 "$p" 2>/dev/null; done
done
for f in /proc/[0-9]*/cmdline; do
	if grep -q -a -F -- "%[3]s" "$f" 2>/dev/null; then p=${f#/proc/}; kill -9 "${p%%/cmdline}" 2>/dev/null; fi
done
sleep 0.2
awk -v d="%[4]s/" 'index($5, d) == 1 { print $5 }' /proc/self/mountinfo | sort -r | while read -r m; do umount -l "$m" 2>/dev/null; done
for c in /sys/fs/cgroup/*/%[2]s; do
	[ -d "$c" ] && find "$c" -depth -type d -exec rmdir {} \; 2>/dev/null
done
ip link del %[5]s 2>/dev/null
`, n.name, n.cgroupRoot, sock, n.dir, n.bridge)
	}
	// The kubelets' own chains (KUBE-FIREWALL, the canaries).
	b.WriteString(`for ipt in iptables ip6tables; do
	for t in filter nat mangle; do
		$ipt -t $t -D INPUT -j KUBE-FIREWALL 2>/dev/null
		$ipt -t $t -D OUTPUT -j KUBE-FIREWALL 2>/dev/null
		for c in KUBE-FIREWALL KUBE-KUBELET-CANARY KUBE-IPTABLES-HINT; do $ipt -t $t -F $c 2>/dev/null; $ipt -t $t -X $c 2>/dev/null; done
	done
done
`)
	fmt.Fprintf(&b, "ip route del %s 2>/dev/null\nip route del blackhole %s 2>/dev/null\nexit 0\n", RealNodesServiceRange, realNodesRange)
	return b.String()
}

// network makes the node's bridge with its address, and the blackhole
// route of the whole range.
func (n *realNode) network(i int) error {
	for _, args := range [][]string{
		{"link", "add", n.bridge, "type", "bridge"},
		{"addr", "add", RealNodeIP(i) + "/24", "dev", n.bridge},
		{"link", "set", n.bridge, "up"},
	} {
		if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
			return fmt.Errorf("ip %s: %v: %s", strings.Join(args, " "), err, out)
		}
	}
	if out, err := exec.Command("ip", "route", "replace", "blackhole", realNodesRange).CombinedOutput(); err != nil {
		return fmt.Errorf("blackhole route for %s: %v: %s", realNodesRange, err, out)
	}
	if i == 0 {
		// Services: kube-proxy's rules turn their addresses into pods'
		// (and the API server's); the route only gets packets to them.
		if out, err := exec.Command("ip", "route", "replace", RealNodesServiceRange, "dev", n.bridge, "src", RealNodeIP(0)).CombinedOutput(); err != nil {
			return fmt.Errorf("route for %s: %v: %s", RealNodesServiceRange, err, out)
		}
	}
	conf, _ := json.Marshal(map[string]any{
		"cniVersion": "1.0.0", "name": "chartpilot",
		"plugins": []any{
			map[string]any{"type": "bridge", "bridge": n.bridge, "isGateway": true, "ipMasq": false, "hairpinMode": true,
				"ipam": map[string]any{"type": "host-local", "dataDir": filepath.Join(n.dir, "cni", "ipam"),
					"ranges": []any{[]any{map[string]any{"subnet": fmt.Sprintf("198.18.%d.0/24", i), "gateway": RealNodeIP(i)}}},
					"routes": []any{map[string]any{"dst": realNodesRange}}}},
			map[string]any{"type": "portmap", "capabilities": map[string]any{"portMappings": true}},
		},
	})
	return os.WriteFile(filepath.Join(n.dir, "cni", "net.d", "10-chartpilot.conflist"), conf, 0o644)
}

func (n *realNode) startContainerd(c *Cluster, bin, pause string) (string, error) {
	d := filepath.Join(n.dir, "containerd")
	sock := filepath.Join(d, "containerd.sock")
	host := c.Registry.Host
	hosts := filepath.Join(d, "certs.d", host)
	if err := os.MkdirAll(hosts, 0o755); err != nil {
		return "", err
	}
	if err := os.WriteFile(filepath.Join(hosts, "hosts.toml"), []byte(fmt.Sprintf("server = \"http://%[1]s\"\n\n[host.\"http://%[1]s\"]\n  capabilities = [\"pull\", \"resolve\"]\n", host)), 0o644); err != nil {
		return "", err
	}
	config := fmt.Sprintf(`version = 3
root = %[1]q
state = %[2]q
disabled_plugins = ["io.containerd.nri.v1.nri"]

[grpc]
  address = %[3]q
[ttrpc]
  address = %[4]q

[plugins]
  [plugins."io.containerd.internal.v1.opt"]
    path = %[5]q
  [plugins."io.containerd.cri.v1.images"]
    snapshotter = "overlayfs"
    [plugins."io.containerd.cri.v1.images".pinned_images]
      sandbox = %[6]q
    [plugins."io.containerd.cri.v1.images".registry]
      config_path = %[7]q
  [plugins."io.containerd.cri.v1.runtime"]
    restrict_oom_score_adj = true
    netns_mounts_under_state_dir = true
    [plugins."io.containerd.cri.v1.runtime".containerd]
      default_runtime_name = "runc"
      [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc]
        runtime_type = "io.containerd.runc.v2"
        [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc.options]
          BinaryName = %[8]q
          SystemdCgroup = false
    [plugins."io.containerd.cri.v1.runtime".cni]
      bin_dirs = [%[9]q]
      conf_dir = %[10]q
  [plugins."io.containerd.grpc.v1.cri"]
    stream_server_address = "127.0.0.1"
    stream_server_port = "0"
`, filepath.Join(d, "root"), filepath.Join(d, "state"), sock, sock+".ttrpc", filepath.Join(d, "opt"), pause,
		filepath.Join(d, "certs.d"), filepath.Join(bin, "runc"), filepath.Join(bin, "cni"), filepath.Join(n.dir, "cni", "net.d"))
	cfgPath := filepath.Join(d, "config.toml")
	if err := os.WriteFile(cfgPath, []byte(config), 0o644); err != nil {
		return "", err
	}
	p, err := startProcessEnv(n.name+"-containerd", filepath.Join(bin, "containerd"), []string{"--config", cfgPath}, c.LogDir,
		[]string{"PATH=" + bin + ":" + filepath.Join(bin, "cni") + ":/usr/sbin:/usr/bin:/sbin:/bin"})
	if err != nil {
		return "", err
	}
	c.addProc(p)
	err = wait.PollUntilContextTimeout(context.Background(), 100*time.Millisecond, time.Minute, true, func(context.Context) (bool, error) {
		if done, err := p.exited(); done {
			return false, fmt.Errorf("containerd exited (%v):\n%s", err, tailFile(p.logPath, 15))
		}
		_, err := os.Stat(sock)
		return err == nil, nil
	})
	return sock, err
}

func (n *realNode) startKubelet(ctx context.Context, c *Cluster, bin string, i int, sock string) error {
	u, err := c.Env.ControlPlane.AddUser(envtest.User{Name: "system:node:" + n.name, Groups: []string{"system:nodes", "system:masters"}}, nil)
	if err != nil {
		return err
	}
	kc, err := u.KubeConfig()
	if err != nil {
		return err
	}
	kd := filepath.Join(n.dir, "kubelet")
	kubeconfig := filepath.Join(kd, "kubeconfig")
	if err := os.WriteFile(kubeconfig, kc, 0o600); err != nil {
		return err
	}
	if err := n.makeCgroupRoot(); err != nil {
		return err
	}
	resolv := filepath.Join(kd, "resolv.conf")
	if err := os.WriteFile(resolv, []byte("search cluster.local\noptions ndots:5\n"), 0o644); err != nil {
		return err
	}
	port, err := freePort()
	if err != nil {
		return err
	}
	healthz, err := freePort()
	if err != nil {
		return err
	}
	config := fmt.Sprintf(`apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
failCgroupV1: false
cgroupDriver: cgroupfs
cgroupRoot: /%[1]s
failSwapOn: false
address: %[2]s
port: %[3]d
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: %[4]d
containerRuntimeEndpoint: unix://%[5]s
podLogsDir: %[6]s
resolvConf: %[7]s
clusterDomain: cluster.local
clusterDNS: [%[2]s]
authentication:
  anonymous: {enabled: true}
  webhook: {enabled: false}
authorization:
  mode: AlwaysAllow
registerWithTaints:
  - {key: %[8]s, value: "true", effect: NoSchedule}
serializeImagePulls: false
evictionHard: {memory.available: "1%%", nodefs.available: "1%%", imagefs.available: "1%%"}
imageGCHighThresholdPercent: 100
localStorageCapacityIsolation: true
`, n.cgroupRoot, RealNodeIP(i), port, healthz, sock, filepath.Join(n.dir, "logs"), resolv, RealNodeTaint)
	cfgPath := filepath.Join(kd, "config.yaml")
	if err := os.WriteFile(cfgPath, []byte(config), 0o644); err != nil {
		return err
	}
	p, err := startProcess(n.name+"-kubelet", filepath.Join(bin, "kubelet"), []string{
		"--config=" + cfgPath, "--kubeconfig=" + kubeconfig, "--root-dir=" + kd, "--cert-dir=" + filepath.Join(kd, "pki"),
		"--hostname-override=" + n.name, "--node-ip=" + RealNodeIP(i),
		"--node-labels=" + RealNodeLabel + "=true", "--v=1",
	}, c.LogDir)
	if err != nil {
		return err
	}
	c.addProc(p)
	return nil
}

// makeCgroupRoot makes the node's cgroup in every v1 hierarchy (cpuset's
// with its parent's CPUs and memory nodes), for the kubelet's pods.
func (n *realNode) makeCgroupRoot() error {
	hierarchies, _ := filepath.Glob("/sys/fs/cgroup/*")
	for _, h := range hierarchies {
		if st, err := os.Stat(filepath.Join(h, "cgroup.procs")); err != nil || st.IsDir() {
			continue
		}
		d := filepath.Join(h, n.cgroupRoot)
		if err := os.MkdirAll(d, 0o755); err != nil {
			return fmt.Errorf("cgroup %s: %w", d, err)
		}
		if filepath.Base(h) == "cpuset" {
			for _, f := range []string{"cpuset.cpus", "cpuset.mems"} {
				b, err := os.ReadFile(filepath.Join(h, f))
				if err != nil {
					return err
				}
				if err := os.WriteFile(filepath.Join(d, f), b, 0o644); err != nil {
					return fmt.Errorf("cgroup %s: %w", d, err)
				}
			}
		}
	}
	return nil
}

// stopRealNodes tears the real nodes down (after their kubelets and
// containerds were stopped with the other processes).
func (c *Cluster) stopRealNodes() {
	if c.apiProxy != nil {
		_ = c.apiProxy.Close()
	}
	if c.nodesTeardown != "" {
		if out, err := exec.Command("/bin/sh", c.nodesTeardown).CombinedOutput(); err != nil {
			fmt.Fprintf(os.Stderr, "tearing down the real nodes: %v\n%s", err, out)
		}
	}
	c.Registry.stop()
	if c.nodesLock != nil {
		_ = c.nodesLock.Close()
	}
}

// checkFiles reports the binaries missing from binDir.
func checkFiles(binDir string, names []string) error {
	var missing []string
	for _, b := range names {
		if st, err := os.Stat(filepath.Join(binDir, b)); err != nil || st.IsDir() || st.Mode()&0o111 == 0 {
			missing = append(missing, b)
		}
	}
	if len(missing) > 0 {
		return fmt.Errorf("real nodes' binaries missing from %s (%s): run make tools", binDir, strings.Join(missing, ", "))
	}
	return nil
}
