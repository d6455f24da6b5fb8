package testcluster

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"github.com/chartpilot/chartpilot/internal/testing/testcluster/nodebox"
)

// What the real nodes share: the API server reached from the nodes and
// their pods, Services (a kube-proxy per node) and the cluster DNS
// (CoreDNS, on node 0).

// startAPIProxy lets the nodes and their pods reach the API server: the
// kubernetes Service's endpoint is HostIP (--advertise-address) at the API
// server's port, and this forwards it to the API server on loopback.
func (c *Cluster) startAPIProxy() error {
	u, err := url.Parse(c.Config.Host)
	if err != nil {
		return err
	}
	ln, err := net.Listen("tcp", net.JoinHostPort(HostIP, u.Port()))
	if err != nil {
		return fmt.Errorf("the API server's address for pods: %w", err)
	}
	c.apiProxy = &apiProxy{ln: ln, conns: map[net.Conn]bool{}}
	go c.apiProxy.serve(u.Host)
	return nil
}

// apiProxy forwards pods' connections to the API server; closing it ends
// them all, so that the API server is not left waiting on a dead pod's
// watch when it stops.
type apiProxy struct {
	ln    net.Listener
	mu    sync.Mutex
	conns map[net.Conn]bool
}

func (p *apiProxy) track(c net.Conn, on bool) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.conns == nil {
		_ = c.Close()
		return false
	}
	if on {
		p.conns[c] = true
	} else {
		delete(p.conns, c)
	}
	return true
}

func (p *apiProxy) serve(target string) {
	for {
		conn, err := p.ln.Accept()
		if err != nil {
			return
		}
		go func() {
			if !p.track(conn, true) {
				return
			}
			defer p.track(conn, false)
			defer conn.Close()
			up, err := net.DialTimeout("tcp", target, 10*time.Second)
			if err != nil {
				return
			}
			if !p.track(up, true) {
				return
			}
			defer p.track(up, false)
			defer up.Close()
			done := make(chan struct{}, 2)
			go func() { _, _ = io.Copy(up, conn); done <- struct{}{} }()
			go func() { _, _ = io.Copy(conn, up); done <- struct{}{} }()
			<-done
		}()
	}
}

// Close stops accepting and ends every forwarded connection.
func (p *apiProxy) Close() error {
	err := p.ln.Close()
	p.mu.Lock()
	defer p.mu.Unlock()
	for c := range p.conns {
		_ = c.Close()
	}
	p.conns = nil
	return err
}

// kubeProxy is node n's kube-proxy (iptables): Services in the node's
// network namespace, for its pods and for what comes from this machine.
func (n *realNode) kubeProxy(c *Cluster, bin string) (nodebox.Proc, error) {
	dir := filepath.Join(n.dir, "kube-proxy")
	kubeconfig, err := c.nodeKubeconfig(dir, envtest.User{Name: "system:kube-proxy", Groups: []string{"system:masters"}})
	if err != nil {
		return nodebox.Proc{}, err
	}
	config := fmt.Sprintf(`apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
clientConnection: {kubeconfig: %[1]s}
mode: iptables
clusterCIDR: 198.18.0.0/16
hostnameOverride: %[2]s
bindAddress: %[3]s
healthzBindAddress: %[3]s:%[4]d
metricsBindAddress: %[3]s:%[5]d
nodePortAddresses: [%[6]s]
conntrack: {maxPerCore: 0, min: 0}
iptables: {localhostNodePorts: false}
`, kubeconfig, n.name, RealNodeIP(n.i), kubeProxyHealthzPort, kubeProxyMetrics, realNodesRange)
	cfgPath := filepath.Join(dir, "config.yaml")
	if err := os.WriteFile(cfgPath, []byte(config), 0o644); err != nil {
		return nodebox.Proc{}, err
	}
	return nodebox.Proc{Name: "kube-proxy", Path: filepath.Join(bin, "kube-proxy"), Args: []string{"--config=" + cfgPath, "--v=1"}}, nil
}

// realNodesAPIServer configures the API server for pods that run: a
// serving certificate for the kubernetes Service's address and names
// (pods dial those) and HostIP (the nodes do), that Service's endpoint at
// HostIP (the API proxy), ServiceAccount admission (pods get their tokens), and logs, exec
// and the node proxy to the kubelets' node IPs.
func (c *Cluster) realNodesAPIServer(api *envtest.APIServer) error {
	dir := filepath.Join(c.Dir, "apiserver")
	ips := []net.IP{net.ParseIP("127.0.0.1"), net.ParseIP(kubernetesServiceIP), net.ParseIP(HostIP)}
	names := []string{"localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc", "kubernetes.default.svc.cluster.local"}
	ca, err := apiServerCerts(dir, ips, names)
	if err != nil {
		return fmt.Errorf("the API server's certificates: %w", err)
	}
	api.CertDir = dir
	api.SecureServing.CA = ca
	c.caFile = filepath.Join(dir, "ca.crt")
	api.Configure().Set("advertise-address", HostIP)
	api.Configure().Disable("disable-admission-plugins")
	api.Configure().Set("kubelet-preferred-address-types", "InternalIP")
	return nil
}

// coreDNS serves cluster.local (CoreDNS's kubernetes plugin) at node 0's
// address, port 53: the kubelets' clusterDNS. Nothing else is resolved:
// no query leaves the nodes.
func (c *Cluster) coreDNS(n *realNode, bin string) (nodebox.Proc, error) {
	dir := filepath.Join(n.dir, "coredns")
	kubeconfig, err := c.nodeKubeconfig(dir, envtest.User{Name: "system:coredns", Groups: []string{"system:masters"}})
	if err != nil {
		return nodebox.Proc{}, err
	}
	corefile := fmt.Sprintf(`.:53 {
	bind %[1]s
	errors
	ready %[1]s:%[2]d
	kubernetes cluster.local in-addr.arpa ip6.arpa {
		kubeconfig %[3]s
		pods insecure
	}
}
`, RealNodeIP(n.i), coreDNSReadyPort, kubeconfig)
	path := filepath.Join(dir, "Corefile")
	if err := os.WriteFile(path, []byte(corefile), 0o644); err != nil {
		return nodebox.Proc{}, err
	}
	return nodebox.Proc{Name: "coredns", Path: filepath.Join(bin, "coredns"), Args: []string{"-conf", path}}, nil
}

// waitAnswers waits up to two minutes for url to answer 200 OK, failing
// as soon as p exits.
func waitAnswers(p *process, url string) error {
	return wait.PollUntilContextTimeout(context.Background(), 200*time.Millisecond, 2*time.Minute, true, func(context.Context) (bool, error) {
		if done, err := p.exited(); done {
			return false, fmt.Errorf("%s exited (%v):\n%s", p.name, err, tailFile(p.logPath, 15))
		}
		resp, err := http.Get(url)
		if err != nil {
			return false, nil
		}
		_ = resp.Body.Close()
		return resp.StatusCode == http.StatusOK, nil
	})
}
