// Package testcluster starts and stops a real local Kubernetes control plane
// for tests, benchmarks and demos.
//
// Two tiers:
//   - TierAPI: etcd + kube-apiserver (controller-runtime envtest), seconds to start;
//   - TierFull: plus kube-controller-manager, kube-scheduler, kwok faking
//     nodes and pod lifecycles, and a dynamic volume provisioner behind the
//     default StorageClass "standard", so StatefulSets get bound PVCs and
//     Ready pods, Jobs complete and garbage collection runs; with
//     Options.RealNodes, also nodes whose pods run (containerd, runc, a
//     kubelet, CNI) and a registry they pull from (nodes.go).
//
// All binaries come from bin/ (built by `make tools` from hack/tools). Every
// process the cluster starts is stopped by Stop, and killed by a watchdog if
// the calling process dies first.
package testcluster

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
)

// Tier selects how much of a cluster to start.
type Tier string

const (
	// TierAPI is etcd and kube-apiserver only.
	TierAPI Tier = "api"
	// TierFull adds controller manager, scheduler, kwok nodes and a provisioner.
	TierFull Tier = "full"
)

// ServiceClusterIPRange is wide enough for benchmarks with hundreds of
// Services; envtest's default /24 is full at the 255th. The addresses are
// virtual: nothing is ever sent to them.
const ServiceClusterIPRange = "10.96.0.0/16"

// DefaultStorageClass is the name of the default StorageClass of the full tier.
const DefaultStorageClass = "standard"

// Options configure Start. The zero value starts TierAPI in a temporary directory.
type Options struct {
	// Tier defaults to TierAPI.
	Tier Tier
	// Dir holds the kubeconfig, logs/ and volumes/. Default: a new temporary
	// directory, removed by Stop unless the cluster failed.
	Dir string
	// BinDir holds the control-plane binaries. Default: $CHARTPILOT_BIN_DIR,
	// else bin/ at the root of the chartpilot module containing the working
	// directory.
	BinDir string
	// Kubernetes is the minor of the control plane ("1.35"): empty or
	// Newest runs the newest (bin/), an older minor of the version matrix
	// runs kube-apiserver, kube-controller-manager and kube-scheduler from
	// bin/kubernetes-<minor>/ (etcd, kwok and kubectl stay the same).
	// Default: $CHARTPILOT_KUBERNETES.
	Kubernetes string
	// RuntimeConfig is the API server's --runtime-config (API versions
	// turned on or off), e.g. "storage.k8s.io/v1beta1=true".
	RuntimeConfig string
	// Nodes is the number of kwok nodes of the full tier (default 3).
	Nodes int
	// RealNodes is the number of nodes that run containers (full tier, as
	// root; see RealNodeName). Their Services take RealNodesServiceRange.
	RealNodes int
	// CRDDirs are installed after the API server is up. Default:
	// config/crd/bases and config/crd/passthrough of the chartpilot module.
	CRDDirs []string
	// APIServerPort fixes the API server's port (default: a free port).
	APIServerPort int
	// WebhookInstallOptions are passed to envtest (admission webhooks served
	// by the test process).
	WebhookInstallOptions envtest.WebhookInstallOptions
	// Log receives one line per start-up step; nil discards.
	Log io.Writer
	// AuditUsers, when set, makes the API server write an audit log
	// (Cluster.AuditLogPath, JSON lines at level Metadata) of every request
	// these users make, and of nothing else (see User).
	AuditUsers []string
}

// Cluster is a running local control plane.
type Cluster struct {
	// Config is an admin (system:masters) client configuration.
	Config *rest.Config
	// KubeconfigPath is a kubeconfig file for the admin user.
	KubeconfigPath string
	// Dir is the working directory; LogDir holds one log file per component.
	Dir, LogDir string
	// Env is the underlying envtest environment (webhook install options, CRDs).
	Env *envtest.Environment
	// AuditLogPath is the API server's audit log (Options.AuditUsers).
	AuditLogPath string
	// Registry is the registry the real nodes pull from (Options.RealNodes).
	Registry *Registry
	// PodUtilImage is an image of the registry: `serve ADDR` answers HTTP
	// with the pod's host name; it runs as 65532 on a read-only root.
	PodUtilImage string

	opts      Options
	tempDir   bool
	procs     []*process
	watchdog  *watchdog
	cancel    context.CancelFunc
	bg        sync.WaitGroup
	stopOnce  sync.Once
	stopError error
	// restarted: components Restart started again (they replace envtest's).
	restartMu   sync.Mutex
	restarted   map[string]*process
	restarts    int
	realNodes   []*realNode
	nodesLock   *os.File
	cgroupPlace *cgroupPlace
	apiProxy    *apiProxy
	// caFile is the API server's serving CA (real nodes: pods verify it).
	caFile string
	// The kubelet statistics' address (statsAddress).
	statsMu     sync.Mutex
	statsIP     net.IP
	statsLock   *os.File
	statsScript string
}

// Newest is the minor of the control plane in bin/; OlderMinors are the
// other minors of the version matrix, each in bin/kubernetes-<minor>/.
const Newest = "1.37"

// OlderMinors are the older minors the e2e tests also run against.
var OlderMinors = []string{"1.35", "1.36"}

// KubernetesMinor is the minor tests start by default: $CHARTPILOT_KUBERNETES,
// else Newest.
func KubernetesMinor() string {
	if v := os.Getenv("CHARTPILOT_KUBERNETES"); v != "" {
		return v
	}
	return Newest
}

// controlPlane are the binaries of the version matrix.
var controlPlane = map[string]bool{"kube-apiserver": true, "kube-controller-manager": true, "kube-scheduler": true}

// binPath is where the named binary of opts' Kubernetes minor is.
func (o *Options) binPath(name string) string {
	if controlPlane[name] && o.Kubernetes != Newest {
		return filepath.Join(o.BinDir, "kubernetes-"+o.Kubernetes, name)
	}
	return filepath.Join(o.BinDir, name)
}

// Binaries returns the binaries a tier needs.
func Binaries(tier Tier) []string {
	bins := []string{"etcd", "kube-apiserver"}
	if tier == TierFull {
		bins = append(bins, "kube-controller-manager", "kube-scheduler", "kwok")
	}
	return bins
}

// CheckBinaries returns a clear error naming the fix when a binary of the
// tier is missing from binDir.
func CheckBinaries(binDir string, tier Tier) error {
	return checkBinaries(&Options{BinDir: binDir, Kubernetes: Newest}, tier)
}

func checkBinaries(opts *Options, tier Tier) error {
	binDir := opts.BinDir
	var missing []string
	for _, b := range Binaries(tier) {
		if st, err := os.Stat(opts.binPath(b)); err != nil || st.IsDir() || st.Mode()&0o111 == 0 {
			rel, _ := filepath.Rel(binDir, opts.binPath(b))
			missing = append(missing, rel)
		}
	}
	if tier == TierFull {
		if _, err := os.Stat(filepath.Join(binDir, "kwok-stages", "node-initialize.yaml")); err != nil {
			missing = append(missing, "kwok-stages/")
		}
	}
	if len(missing) > 0 {
		return fmt.Errorf("control-plane binaries missing from %s (%s): run make tools", binDir, strings.Join(missing, ", "))
	}
	return nil
}

// ModuleRoot finds the root of the chartpilot module from the working directory.
func ModuleRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		b, err := os.ReadFile(filepath.Join(dir, "go.mod"))
		if err == nil && strings.HasPrefix(string(b), "module github.com/chartpilot/chartpilot\n") {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("not inside the chartpilot module: set CHARTPILOT_BIN_DIR to the directory holding the control-plane binaries")
		}
		dir = parent
	}
}

func (o *Options) defaults() error {
	if o.Tier == "" {
		o.Tier = TierAPI
	}
	if o.Tier != TierAPI && o.Tier != TierFull {
		return fmt.Errorf("unknown tier %q: use %q or %q", o.Tier, TierAPI, TierFull)
	}
	if o.RealNodes > 0 && o.Tier != TierFull {
		return fmt.Errorf("real nodes need the %q tier", TierFull)
	}
	if o.Kubernetes == "" {
		o.Kubernetes = KubernetesMinor()
	}
	if o.Kubernetes != Newest && !slices.Contains(OlderMinors, o.Kubernetes) {
		return fmt.Errorf("kubernetes minor %q is not in the version matrix: use %s or one of %s", o.Kubernetes, Newest, strings.Join(OlderMinors, ", "))
	}
	if o.RealNodes > 0 && o.Kubernetes != Newest {
		// A kubelet must not be newer than its API server.
		return fmt.Errorf("real nodes run the newest kubelet, which needs the newest control plane (%s), not %s", Newest, o.Kubernetes)
	}
	if o.Nodes <= 0 {
		o.Nodes = 3
	}
	if o.Log == nil {
		o.Log = io.Discard
	}
	root, rootErr := ModuleRoot()
	if o.BinDir == "" {
		o.BinDir = os.Getenv("CHARTPILOT_BIN_DIR")
	}
	if o.BinDir == "" {
		if rootErr != nil {
			return rootErr
		}
		o.BinDir = filepath.Join(root, "bin")
	}
	abs, err := filepath.Abs(o.BinDir)
	if err != nil {
		return err
	}
	o.BinDir = abs
	if o.CRDDirs == nil && rootErr == nil {
		for _, d := range []string{"bases", "passthrough"} {
			dir := filepath.Join(root, "config", "crd", d)
			if st, err := os.Stat(dir); err == nil && st.IsDir() {
				o.CRDDirs = append(o.CRDDirs, dir)
			}
		}
	}
	return nil
}

// Start starts a cluster of opts.Tier and returns when it is usable: for the
// full tier, when every node is Ready and the default StorageClass exists.
func Start(ctx context.Context, opts Options) (_ *Cluster, retErr error) {
	if err := opts.defaults(); err != nil {
		return nil, err
	}
	if err := checkBinaries(&opts, opts.Tier); err != nil {
		return nil, err
	}
	if opts.RealNodes > 0 {
		if err := checkFiles(opts.BinDir, realNodeBinaries); err != nil {
			return nil, err
		}
	}
	c := &Cluster{opts: opts, Dir: opts.Dir}
	if c.Dir == "" {
		d, err := os.MkdirTemp("", "chartpilot-cluster-")
		if err != nil {
			return nil, err
		}
		c.Dir, c.tempDir = d, true
	}
	if err := os.MkdirAll(c.Dir, 0o755); err != nil {
		return nil, fmt.Errorf("creating cluster directory: %w", err)
	}
	c.LogDir = filepath.Join(c.Dir, "logs")
	if err := os.MkdirAll(c.LogDir, 0o755); err != nil {
		return nil, fmt.Errorf("creating log directory: %w", err)
	}
	wd, err := startWatchdog()
	if err != nil {
		return nil, err
	}
	c.watchdog = wd
	if c.tempDir {
		wd.trimOnExit(c.Dir)
	}
	defer func() {
		if retErr != nil {
			retErr = fmt.Errorf("%w (component logs in %s)", retErr, c.LogDir)
			c.tempDir = false // keep the logs the error points at
			_ = c.Stop()
		}
	}()
	bgCtx, cancel := context.WithCancel(context.Background())
	c.cancel = cancel

	if err := c.startAPI(opts); err != nil {
		return nil, err
	}
	fmt.Fprintf(opts.Log, "api server ready at %s\n", c.Config.Host)
	if opts.Tier == TierFull {
		if err := c.startFull(ctx, bgCtx, opts); err != nil {
			return nil, err
		}
	}
	return c, nil
}

func (c *Cluster) startAPI(opts Options) error {
	etcdLog, err := os.Create(filepath.Join(c.LogDir, "etcd.log"))
	if err != nil {
		return err
	}
	apiLog, err := os.Create(filepath.Join(c.LogDir, "kube-apiserver.log"))
	if err != nil {
		return err
	}
	env := &envtest.Environment{
		BinaryAssetsDirectory:    opts.BinDir,
		CRDDirectoryPaths:        opts.CRDDirs,
		ErrorIfCRDPathMissing:    len(opts.CRDDirs) > 0,
		WebhookInstallOptions:    opts.WebhookInstallOptions,
		ControlPlaneStartTimeout: 2 * time.Minute,
		ControlPlaneStopTimeout:  time.Minute,
	}
	env.ControlPlane.Etcd = &envtest.Etcd{Out: etcdLog, Err: etcdLog, DataDir: filepath.Join(c.Dir, "etcd")}
	api := &envtest.APIServer{Out: apiLog, Err: apiLog, Path: opts.binPath("kube-apiserver")}
	if opts.APIServerPort != 0 {
		api.Address = "127.0.0.1"
		api.Port = strconv.Itoa(opts.APIServerPort)
	}
	api.Configure().Set("service-cluster-ip-range", serviceRange(opts))
	if opts.RuntimeConfig != "" {
		api.Configure().Set("runtime-config", opts.RuntimeConfig)
	}
	if opts.RealNodes > 0 {
		if err := c.realNodesAPIServer(api); err != nil {
			return err
		}
	}
	if len(opts.AuditUsers) > 0 {
		policy := filepath.Join(c.Dir, "audit-policy.yaml")
		users, _ := json.Marshal(opts.AuditUsers)
		if err := os.WriteFile(policy, []byte(fmt.Sprintf(`apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: [RequestReceived]
rules:
  - level: Metadata
    users: %s
  - level: None
`, users)), 0o644); err != nil {
			return err
		}
		c.AuditLogPath = filepath.Join(c.LogDir, "audit.log")
		api.Configure().Set("audit-policy-file", policy)
		api.Configure().Set("audit-log-path", c.AuditLogPath)
		api.Configure().Set("audit-log-format", "json")
		api.Configure().Set("audit-log-maxsize", "0")
	}
	env.ControlPlane.APIServer = api
	c.Env = env
	cfg, err := env.Start()
	c.watchdog.registerChildren()
	if err != nil {
		return fmt.Errorf("starting etcd and kube-apiserver: %w", err)
	}
	// Generous client limits: tests and benchmarks create hundreds of objects.
	cfg.QPS, cfg.Burst = 200, 400
	c.Config = cfg

	admin, err := env.ControlPlane.AddUser(envtest.User{Name: "chartpilot-admin", Groups: []string{"system:masters"}}, nil)
	if err != nil {
		return fmt.Errorf("creating admin user: %w", err)
	}
	kc, err := admin.KubeConfig()
	if err != nil {
		return fmt.Errorf("writing admin kubeconfig: %w", err)
	}
	c.KubeconfigPath = filepath.Join(c.Dir, "kubeconfig")
	if err := os.WriteFile(c.KubeconfigPath, kc, 0o600); err != nil {
		return fmt.Errorf("writing kubeconfig: %w", err)
	}
	return nil
}

func (c *Cluster) startFull(ctx, bgCtx context.Context, opts Options) error {
	bin := opts.binPath
	// kube-controller-manager and kube-scheduler share their client,
	// authentication and serving flags.
	component := func(name string, extra ...string) error {
		port, err := freePort()
		if err != nil {
			return err
		}
		args := append([]string{
			"--kubeconfig=" + c.KubeconfigPath,
			"--authentication-kubeconfig=" + c.KubeconfigPath,
			"--authorization-kubeconfig=" + c.KubeconfigPath,
			"--leader-elect=false",
			"--bind-address=127.0.0.1",
			"--secure-port=" + strconv.Itoa(port),
			"--kube-api-qps=200",
			"--kube-api-burst=400",
			"-v=1",
		}, extra...)
		p, err := startProcess(name, bin(name), args, c.LogDir)
		if err != nil {
			return err
		}
		c.addProc(p)
		return nil
	}
	kcm := []string{
		// The token controller needs the service account signing key, which
		// envtest keeps to itself; ServiceAccount admission is off in envtest.
		"--controllers=*,-serviceaccount-token-controller",
		"--service-cluster-ip-range=" + serviceRange(opts),
		"--concurrent-deployment-syncs=10",
		"--concurrent-replicaset-syncs=10",
		"--concurrent-statefulset-syncs=10",
		"--concurrent-gc-syncs=20",
	}
	if c.caFile != "" {
		// Each namespace's kube-root-ca.crt, which pods verify the API server with.
		kcm = append(kcm, "--root-ca-file="+c.caFile)
	}
	if err := component("kube-controller-manager", kcm...); err != nil {
		return err
	}
	if err := component("kube-scheduler"); err != nil {
		return err
	}

	kwokPort, err := freePort()
	if err != nil {
		return err
	}
	kwokArgs := []string{
		"--kubeconfig=" + c.KubeconfigPath,
		// Only its own nodes: the real ones run their own pods.
		"--manage-nodes-with-label-selector=type=kwok",
		// kwok then renews node Leases like a kubelet; with the heartbeat
		// stage the node lifecycle controller never marks nodes unreachable.
		"--node-lease-duration-seconds=40",
		"--server-address=127.0.0.1:" + strconv.Itoa(kwokPort),
		"--cidr=10.244.0.0/16",
		"--node-ip=10.0.0.1",
	}
	stages, err := filepath.Glob(filepath.Join(opts.BinDir, "kwok-stages", "*.yaml"))
	if err != nil {
		return err
	}
	for _, s := range stages {
		kwokArgs = append(kwokArgs, "--config="+s)
	}
	kw, err := startProcess("kwok", bin("kwok"), kwokArgs, c.LogDir)
	if err != nil {
		return err
	}
	c.addProc(kw)

	cs, err := kubernetes.NewForConfig(c.Config)
	if err != nil {
		return err
	}
	if err := c.startProvisioner(bgCtx, cs); err != nil {
		return err
	}
	if err := createNodes(ctx, cs, opts.Nodes); err != nil {
		return err
	}
	fmt.Fprintf(opts.Log, "waiting for %d nodes to become Ready\n", opts.Nodes)
	if err := c.waitNodesReady(ctx, cs, opts.Nodes); err != nil {
		return err
	}
	if opts.RealNodes > 0 {
		return c.startRealNodes(ctx, opts)
	}
	return nil
}

// serviceRange is the Service range of the cluster: virtual addresses
// nothing is sent to, unless real nodes route them.
func serviceRange(opts Options) string {
	if opts.RealNodes > 0 {
		return RealNodesServiceRange
	}
	return ServiceClusterIPRange
}

func (c *Cluster) addProc(p *process) {
	c.procs = append(c.procs, p)
	c.watchdog.register(p.cmd.Process.Pid)
}

// checkProcs returns an error naming a component that exited early.
func (c *Cluster) checkProcs() error {
	for _, p := range c.procs {
		if done, err := p.exited(); done {
			return fmt.Errorf("%s exited early (%w); last lines of %s:\n%s", p.name, err, p.logPath, tailFile(p.logPath, 15))
		}
	}
	return nil
}

// NodeName returns the name of the i-th fake node.
func NodeName(i int) string { return fmt.Sprintf("kwok-node-%d", i) }

func createNodes(ctx context.Context, cs kubernetes.Interface, n int) error {
	capacity := corev1.ResourceList{
		corev1.ResourceCPU:              resourceMust("32"),
		corev1.ResourceMemory:           resourceMust("256Gi"),
		corev1.ResourcePods:             resourceMust("1000"),
		corev1.ResourceEphemeralStorage: resourceMust("1Ti"),
	}
	for i := range n {
		node := &corev1.Node{
			ObjectMeta: metav1.ObjectMeta{
				Name: NodeName(i),
				Annotations: map[string]string{
					"kwok.x-k8s.io/node":                                     "fake",
					"node.alpha.kubernetes.io/ttl":                           "0",
					"volumes.kubernetes.io/controller-managed-attach-detach": "true",
				},
				Labels: map[string]string{
					"kubernetes.io/hostname": NodeName(i),
					"kubernetes.io/os":       "linux",
					"kubernetes.io/arch":     "amd64",
					"kubernetes.io/role":     "agent",
					"type":                   "kwok",
				},
			},
			Status: corev1.NodeStatus{
				Capacity:    capacity,
				Allocatable: capacity,
				NodeInfo: corev1.NodeSystemInfo{
					KubeletVersion:  "fake",
					OperatingSystem: "linux",
					Architecture:    "amd64",
				},
			},
		}
		if _, err := cs.CoreV1().Nodes().Create(ctx, node, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
			return fmt.Errorf("creating node %s: %w", node.Name, err)
		}
	}
	return nil
}

func (c *Cluster) waitNodesReady(ctx context.Context, cs kubernetes.Interface, n int) error {
	var last string
	err := wait.PollUntilContextTimeout(ctx, 250*time.Millisecond, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
		if err := c.checkProcs(); err != nil {
			return false, err
		}
		nodes, err := cs.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
		if err != nil {
			last = err.Error()
			return false, nil //nolint:nilerr // an API error while polling means "not yet"
		}
		ready := 0
		for _, nd := range nodes.Items {
			for _, cond := range nd.Status.Conditions {
				if cond.Type == corev1.NodeReady && cond.Status == corev1.ConditionTrue {
					ready++
				}
			}
		}
		last = fmt.Sprintf("%d of %d nodes Ready", ready, n)
		return ready >= n, nil
	})
	if err != nil {
		return fmt.Errorf("waiting for nodes: %s: %w", last, err)
	}
	return nil
}

// Stop stops every component and, when the cluster used a temporary
// directory and did not fail, removes it. It is safe to call twice.
func (c *Cluster) Stop() error {
	c.stopOnce.Do(func() {
		if c.cancel != nil {
			c.cancel()
		}
		c.bg.Wait()
		for i := len(c.procs) - 1; i >= 0; i-- {
			grace := 15 * time.Second
			if c.procs[i].grace > 0 {
				grace = c.procs[i].grace
			}
			c.procs[i].stop(grace)
		}
		c.stopRealNodes()
		c.releaseStatsAddress()
		if c.Env != nil {
			if err := c.Env.Stop(); err != nil && c.Config != nil {
				c.stopError = err
			}
		}
		if c.watchdog != nil {
			// Kills whatever a failed stop left behind, then exits.
			c.watchdog.close()
		}
		if c.tempDir && c.stopError == nil {
			_ = os.RemoveAll(c.Dir)
		}
	})
	return c.stopError
}

// KeepDir keeps the working directory's logs after Stop, e.g. for a failed
// test (the rest of it, etcd's data, images and volumes, is removed).
func (c *Cluster) KeepDir() { c.tempDir = false }
