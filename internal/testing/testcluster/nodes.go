package testcluster

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"github.com/chartpilot/chartpilot/internal/testing/testcluster/nodebox"
)

// Real nodes run containers: containerd, runc and a kubelet per node, CNI
// bridge networking, images from a registry of this process. Each node is
// a box (package nodebox): an init that is PID 1 of its own PID, mount,
// network, UTS, IPC and cgroup namespaces, a plain child of this process
// with a parent-death signal, so that whatever ends this process ends the
// node, its pods and everything they set up, with no tear-down to run.
//
// Addresses are of 198.18.0.0/15 only (set aside for network tests). Node
// i has 198.18.i.1 on its bridge (its node IP) and its pods 198.18.i.0/24;
// Services take RealNodesServiceRange. Node 0 is joined to this machine by
// one veth pair (HostIP on this side), and every other node to node 0 by
// one of its own; this machine routes the /15 to node 0, which keeps a
// blackhole route for what no node or pod has. The pair and the route go
// with node 0's network namespace. Nothing of the nodes is in this
// machine's own network namespace but that link: their bridges, routes,
// iptables rules (kube-proxy's, the kubelet's) and forwarding settings are
// theirs.
const (
	// RealNodeLabel marks the real nodes (value "true"); RealNodeTaint
	// (NoSchedule, same key) keeps pods that do not tolerate it off them.
	RealNodeLabel = "chartpilot.dev/real-node"
	RealNodeTaint = RealNodeLabel
	// RealNodesServiceRange is the Service range of a cluster with real
	// nodes; each node's kube-proxy routes it.
	RealNodesServiceRange = "198.19.0.0/16"
	// HostIP is this machine's address on the real nodes' network, while
	// they run: pods reach this machine's servers there (the API server,
	// the registry, a test's own servers).
	HostIP = "198.18.254.1"
	// kubernetesServiceIP is the kubernetes Service's address in it.
	kubernetesServiceIP = "198.19.0.1"
	// realNodesRange is the range of the nodes, pods and Services.
	realNodesRange = "198.18.0.0/15"
	// realNodesLock is held by the one cluster with real nodes on this
	// machine: the link to node 0 and HostIP are this machine's.
	realNodesLock = "/run/lock/chartpilot-real-nodes.lock"
	// realNodesLockFDEnv names a file descriptor on which the parent
	// process already holds realNodesLock (a test that compares the
	// machine before and after a cluster).
	realNodesLockFDEnv = "CHARTPILOT_REAL_NODES_LOCK_FD"
	// hostLink is this machine's end of the link to node 0.
	hostLink = "cpnode0"
	// Ports of the node's programs on its node IP (each node has a
	// network of its own).
	kubeletPort, kubeletHealthzPort        = 10250, 10248
	kubeProxyHealthzPort, kubeProxyMetrics = 10256, 10249
	coreDNSReadyPort                       = 8181
)

// RealNodeName is the name of the i-th real node.
func RealNodeName(i int) string { return fmt.Sprintf("real-node-%d", i) }

// RealNodeIP is the address of the i-th real node (its bridge's).
func RealNodeIP(i int) string { return fmt.Sprintf("198.18.%d.1", i) }

// linkIP is an address of the link of node i (i > 0: to node 0; i = 0: to
// this machine): the node's end, or the other (node 0's, or HostIP).
func linkIP(i int, nodeEnd bool) string {
	if nodeEnd {
		return fmt.Sprintf("198.18.254.%d", 4*i+2)
	}
	return fmt.Sprintf("198.18.254.%d", 4*i+1)
}

// pauseRepo is the repository of the pod sandbox image in the registry.
const pauseRepo = "chartpilot/pause"

// realNode is one node: its directory, its init and its cgroups.
type realNode struct {
	i         int
	name, dir string
	init      *process
	// start is the init's stdin: a line on it says the link is made.
	start io.WriteCloser
	// cgroups are the node's cgroup directories on this machine.
	cgroups []string
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
	placement, err := cgroupPlacement()
	if err != nil {
		return err
	}
	c.cgroupPlace = placement
	// What a run that was killed left: the only thing the kernel keeps
	// of a node is its (empty) cgroup directories.
	sweepNodeCgroups(placement)
	if err := c.nodePrograms(); err != nil {
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
		n := &realNode{i: i, name: RealNodeName(i), dir: filepath.Join(c.Dir, "nodes", RealNodeName(i))}
		c.realNodes = append(c.realNodes, n)
		if err := c.startNodeInit(opts, n, pause); err != nil {
			return fmt.Errorf("real node %s: %w", n.name, err)
		}
	}
	if err := c.linkNodes(); err != nil {
		return err
	}
	regAddr, err := reg.serveAlso(HostIP)
	if err != nil {
		return err
	}
	if err := c.startAPIProxy(); err != nil {
		return err
	}
	for _, n := range c.realNodes {
		if err := n.registryHosts(reg.Host, regAddr); err != nil {
			return err
		}
		if _, err := io.WriteString(n.start, "go\n"); err != nil {
			return fmt.Errorf("real node %s: %w (its log: %s)", n.name, err, tailFile(n.init.logPath, 15))
		}
	}
	cs, err := kubernetes.NewForConfig(c.Config)
	if err != nil {
		return err
	}
	fmt.Fprintf(opts.Log, "waiting for %d real nodes to become Ready\n", opts.RealNodes)
	if err := c.waitNodesReady(ctx, cs, opts.Nodes+opts.RealNodes); err != nil {
		return err
	}
	for _, n := range c.realNodes {
		if err := waitAnswers(n.init, fmt.Sprintf("http://%s/healthz", joinPort(RealNodeIP(n.i), kubeProxyHealthzPort))); err != nil {
			return fmt.Errorf("kube-proxy of %s: %w", n.name, err)
		}
	}
	if err := waitAnswers(c.realNodes[0].init, fmt.Sprintf("http://%s/ready", joinPort(RealNodeIP(0), coreDNSReadyPort))); err != nil {
		return fmt.Errorf("CoreDNS: %w", err)
	}
	return nil
}

func joinPort(ip string, port int) string { return ip + ":" + strconv.Itoa(port) }

// lockRealNodes waits for (and keeps) the machine's real-nodes lock, or
// takes the one the parent process holds for this one.
func (c *Cluster) lockRealNodes(ctx context.Context) error {
	if fd := os.Getenv(realNodesLockFDEnv); fd != "" {
		n, err := strconv.Atoi(fd)
		if err != nil {
			return fmt.Errorf("%s=%q: not a file descriptor", realNodesLockFDEnv, fd)
		}
		f := os.NewFile(uintptr(n), realNodesLock)
		if f == nil || syscall.Flock(n, syscall.LOCK_EX|syscall.LOCK_NB) != nil {
			return fmt.Errorf("%s=%s: the parent's real-nodes lock is not held on it", realNodesLockFDEnv, fd)
		}
		c.nodesLock = f
		return nil
	}
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

// nodePrograms builds the program of the nodes' images (pause, and a
// server that tells a running container from a simulated one) and the
// nodes' init.
func (c *Cluster) nodePrograms() error {
	root, err := ModuleRoot()
	if err != nil {
		return err
	}
	for name, pkg := range map[string]string{"podutil": "./internal/testing/testcluster/podutil", "nodeinit": "./internal/testing/testcluster/nodeinit"} {
		cmd := exec.Command("go", "build", "-trimpath", "-ldflags=-s -w", "-o", filepath.Join(c.Dir, name), pkg)
		cmd.Dir = root
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux", "GOARCH=amd64")
		if out, err := cmd.CombinedOutput(); err != nil {
			return fmt.Errorf("building %s: %v\n%s", name, err, out)
		}
	}
	return nil
}

// startNodeInit writes node n's configuration and starts its init in
// namespaces of its own; the init waits for its link (linkNodes).
func (c *Cluster) startNodeInit(opts Options, n *realNode, pause string) error {
	bin := opts.BinDir
	for _, d := range []string{"containerd", "cni/net.d", "cni/ipam", "kubelet", "logs", "tmp"} {
		if err := os.MkdirAll(filepath.Join(n.dir, d), 0o755); err != nil {
			return err
		}
	}
	cgroups, err := c.cgroupPlace.makeNodeCgroups(n.name)
	if err != nil {
		return err
	}
	n.cgroups = cgroups
	if err := n.cniConfig(); err != nil {
		return err
	}
	containerd, sock, err := n.containerd(c, bin, pause)
	if err != nil {
		return err
	}
	kubelet, err := n.kubelet(c, bin, sock)
	if err != nil {
		return err
	}
	kubeProxy, err := n.kubeProxy(c, bin)
	if err != nil {
		return err
	}
	procs := []nodebox.Proc{containerd, kubelet, kubeProxy}
	if n.i == 0 {
		dns, err := c.coreDNS(n, bin)
		if err != nil {
			return err
		}
		procs = append(procs, dns)
	}
	env := []string{"PATH=" + bin + ":" + filepath.Join(bin, "cni") + ":/usr/sbin:/usr/bin:/sbin:/bin", "TMPDIR=" + filepath.Join(n.dir, "tmp")}
	for i := range procs {
		procs[i].Env = append(procs[i].Env, env...)
	}
	cfg := nodebox.Config{
		Name: n.name, Dir: n.dir, Cgroups: cgroups, CgroupV2: c.cgroupPlace.v2,
		Tmpfs:      nodeTmpfs(c.Dir, c.LogDir, bin),
		IP:         n.ipCommands(len(c.realNodes)),
		NetSysctls: map[string]string{"net/ipv4/ip_forward": "1", "net/bridge/bridge-nf-call-iptables": "1"},
		Procs:      procs,
		LogDir:     c.LogDir,
	}
	b, err := json.MarshalIndent(cfg, "", "  ")
	if err != nil {
		return err
	}
	cfgPath := filepath.Join(n.dir, "node.json")
	if err := os.WriteFile(cfgPath, b, 0o644); err != nil {
		return err
	}
	cmd := exec.Command(filepath.Join(c.Dir, "nodeinit"), cfgPath)
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return err
	}
	// A plain child: this process's group, SIGKILL when this process goes.
	cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: nodebox.Cloneflags, Pdeathsig: syscall.SIGKILL}
	p, err := startCmd(n.name, cmd, c.LogDir)
	if err != nil {
		return err
	}
	// The init stops the node's programs (10 s), then kills the rest.
	p.grace = 30 * time.Second
	n.init, n.start = p, stdin
	c.addProc(p)
	return nil
}

// nodeTmpfs are the directories a node covers with a tmpfs of its own:
// fixed paths its programs write to (containerd's and runc's state, the
// kubelet's /var/log/containers, CNI's cache), but none that holds the
// cluster's own directories or binaries.
func nodeTmpfs(dirs ...string) []string {
	var out []string
	for _, d := range []string{"/run", "/var/log", "/var/lib"} {
		if !slices.ContainsFunc(dirs, func(own string) bool { return strings.HasPrefix(own+"/", d+"/") }) {
			out = append(out, d)
		}
	}
	return out
}

// ipCommands configure node n's network namespace: its end of the link,
// its bridge, and its routes (node 0: to the other nodes' pods and the
// blackhole; the others: everything through node 0).
func (n *realNode) ipCommands(nodes int) [][]string {
	cmds := [][]string{
		{"link", "set", "lo", "up"},
		{"addr", "add", linkIP(n.i, true) + "/30", "dev", "eth0"},
		{"link", "set", "eth0", "up"},
		{"link", "add", "cpbr", "type", "bridge"},
		{"addr", "add", RealNodeIP(n.i) + "/24", "dev", "cpbr"},
		{"link", "set", "cpbr", "up"},
	}
	if n.i > 0 {
		return append(cmds, []string{"route", "add", realNodesRange, "via", linkIP(n.i, false)})
	}
	cmds = append(cmds, []string{"route", "add", "blackhole", realNodesRange})
	for j := 1; j < nodes; j++ {
		dev := fmt.Sprintf("cpnode%d", j)
		cmds = append(cmds,
			[]string{"addr", "add", linkIP(j, false) + "/30", "dev", dev},
			[]string{"link", "set", dev, "up"},
			[]string{"route", "add", fmt.Sprintf("198.18.%d.0/24", j), "via", linkIP(j, true)})
	}
	return cmds
}

// linkNodes makes the veth pairs: this machine to node 0 (HostIP, and the
// route of the range through it), node 0 to each other node.
func (c *Cluster) linkNodes() error {
	pid := func(i int) string { return strconv.Itoa(c.realNodes[i].init.cmd.Process.Pid) }
	cmds := [][]string{
		{"link", "add", hostLink, "type", "veth", "peer", "name", "eth0", "netns", pid(0)},
		{"addr", "add", HostIP + "/30", "dev", hostLink},
		{"link", "set", hostLink, "up"},
		{"route", "replace", realNodesRange, "via", linkIP(0, true), "dev", hostLink},
	}
	for j := 1; j < len(c.realNodes); j++ {
		cmds = append(cmds, []string{"link", "add", "name", fmt.Sprintf("cpnode%d", j), "netns", pid(0), "type", "veth", "peer", "name", "eth0", "netns", pid(j)})
	}
	for _, args := range cmds {
		if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
			return fmt.Errorf("ip %s: %v: %s", strings.Join(args, " "), err, out)
		}
	}
	return nil
}

// cniConfig writes the node's CNI configuration: its bridge, its pods'
// range, and a route to the /15 only.
func (n *realNode) cniConfig() error {
	conf, _ := json.Marshal(map[string]any{
		"cniVersion": "1.0.0", "name": "chartpilot",
		"plugins": []any{
			map[string]any{"type": "bridge", "bridge": "cpbr", "isGateway": true, "ipMasq": false, "hairpinMode": true,
				"ipam": map[string]any{"type": "host-local", "dataDir": filepath.Join(n.dir, "cni", "ipam"),
					"ranges": []any{[]any{map[string]any{"subnet": fmt.Sprintf("198.18.%d.0/24", n.i), "gateway": RealNodeIP(n.i)}}},
					"routes": []any{map[string]any{"dst": realNodesRange}}}},
			map[string]any{"type": "portmap", "capabilities": map[string]any{"portMappings": true}},
		},
	})
	return os.WriteFile(filepath.Join(n.dir, "cni", "net.d", "10-chartpilot.conflist"), conf, 0o644)
}

// registryHosts points the node's containerd at the registry: images are
// named by host (127.0.0.1:PORT), and pulled from its address on the
// nodes' network.
func (n *realNode) registryHosts(host, addr string) error {
	dir := filepath.Join(n.dir, "containerd", "certs.d", host)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, "hosts.toml"), []byte(fmt.Sprintf("server = \"http://%[1]s\"\n\n[host.\"http://%[1]s\"]\n  capabilities = [\"pull\", \"resolve\"]\n", addr)), 0o644)
}

func (n *realNode) containerd(c *Cluster, bin, pause string) (nodebox.Proc, string, error) {
	d := filepath.Join(n.dir, "containerd")
	sock := filepath.Join(d, "containerd.sock")
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
		return nodebox.Proc{}, "", err
	}
	return nodebox.Proc{Name: "containerd", Path: filepath.Join(bin, "containerd"), Args: []string{"--config", cfgPath}}, sock, nil
}

func (n *realNode) kubelet(c *Cluster, bin, sock string) (nodebox.Proc, error) {
	kd := filepath.Join(n.dir, "kubelet")
	kubeconfig, err := c.nodeKubeconfig(kd, envtest.User{Name: "system:node:" + n.name, Groups: []string{"system:nodes", "system:masters"}})
	if err != nil {
		return nodebox.Proc{}, err
	}
	resolv := filepath.Join(kd, "resolv.conf")
	if err := os.WriteFile(resolv, []byte("search cluster.local\noptions ndots:5\n"), 0o644); err != nil {
		return nodebox.Proc{}, err
	}
	// cgroupRoot "/" is the node's own cgroup (its cgroup namespace's
	// root), below the cgroup of the process that started the cluster.
	// The kernel tunables the kubelet would otherwise write are answered
	// by the node (nodebox.KernelTunables): it only checks them.
	config := fmt.Sprintf(`apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
failCgroupV1: false
cgroupDriver: cgroupfs
cgroupRoot: /
protectKernelDefaults: true
failSwapOn: false
address: %[1]s
port: %[2]d
readOnlyPort: 0
healthzBindAddress: %[1]s
healthzPort: %[3]d
containerRuntimeEndpoint: unix://%[4]s
podLogsDir: %[5]s
resolvConf: %[6]s
clusterDomain: cluster.local
clusterDNS: [%[7]s]
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
`, RealNodeIP(n.i), kubeletPort, kubeletHealthzPort, sock, filepath.Join(n.dir, "logs"), resolv, RealNodeIP(0), RealNodeTaint)
	cfgPath := filepath.Join(kd, "config.yaml")
	if err := os.WriteFile(cfgPath, []byte(config), 0o644); err != nil {
		return nodebox.Proc{}, err
	}
	return nodebox.Proc{Name: "kubelet", Path: filepath.Join(bin, "kubelet"), WaitFile: sock, Args: []string{
		"--config=" + cfgPath, "--kubeconfig=" + kubeconfig, "--root-dir=" + kd, "--cert-dir=" + filepath.Join(kd, "pki"),
		"--hostname-override=" + n.name, "--node-ip=" + RealNodeIP(n.i),
		"--node-labels=" + RealNodeLabel + "=true", "--v=1",
	}}, nil
}

// nodeKubeconfig writes dir/kubeconfig for a program of a node: an admin
// of the cluster, known to the audit log as user, reaching the API server
// at HostIP (the node has no way to this machine's loopback).
func (c *Cluster) nodeKubeconfig(dir string, user envtest.User) (string, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	u, err := c.Env.ControlPlane.AddUser(user, nil)
	if err != nil {
		return "", err
	}
	kc, err := u.KubeConfig()
	if err != nil {
		return "", err
	}
	api, err := url.Parse(c.Config.Host)
	if err != nil {
		return "", err
	}
	kc = []byte(strings.ReplaceAll(string(kc), "https://"+api.Host, "https://"+net.JoinHostPort(HostIP, api.Port())))
	path := filepath.Join(dir, "kubeconfig")
	return path, os.WriteFile(path, kc, 0o600)
}

// stopRealNodes ends what is left of the real nodes once their inits were
// stopped with the other processes: the API proxy, the registry and the
// nodes' cgroup directories.
func (c *Cluster) stopRealNodes() {
	if c.apiProxy != nil {
		_ = c.apiProxy.Close()
	}
	for _, n := range c.realNodes {
		for _, d := range n.cgroups {
			// A process of the node may still be on its way out.
			left := 0
			for try := 0; try < 50; try++ {
				if left = nodebox.RemoveCgroups(d, nil); left == 0 {
					break
				}
				time.Sleep(100 * time.Millisecond)
			}
			if left > 0 {
				fmt.Fprintf(os.Stderr, "real node %s: %d cgroups of %s could not be removed (the next start removes them)\n", n.name, left, d)
			}
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
