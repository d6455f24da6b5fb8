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
)

// What the real nodes share: the API server reached from pods, Services
// (kube-proxy) and the cluster DNS (CoreDNS).

// startAPIProxy lets pods reach the API server: the kubernetes Service's
// endpoint is node 0's address (--advertise-address) at the API server's
// port, and this forwards it to the API server on loopback.
func (c *Cluster) startAPIProxy() error {
	u, err := url.Parse(c.Config.Host)
	if err != nil {
		return err
	}
	ln, err := net.Listen("tcp", net.JoinHostPort(RealNodeIP(0), u.Port()))
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

// startKubeProxy runs one kube-proxy (iptables) for the real nodes: they
// share this machine's network, so one set of rules serves them all.
func (c *Cluster) startKubeProxy(bin string) error {
	dir := filepath.Join(c.Dir, "nodes", "kube-proxy")
	kubeconfig, err := c.componentKubeconfig(dir, "system:kube-proxy")
	if err != nil {
		return err
	}
	healthz, err := freePort()
	if err != nil {
		return err
	}
	metrics, err := freePort()
	if err != nil {
		return err
	}
	config := fmt.Sprintf(`apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
clientConnection: {kubeconfig: %[1]s}
mode: iptables
clusterCIDR: 198.18.0.0/16
hostnameOverride: %[2]s
bindAddress: %[3]s
healthzBindAddress: 127.0.0.1:%[4]d
metricsBindAddress: 127.0.0.1:%[5]d
nodePortAddresses: [%[6]s]
conntrack: {maxPerCore: 0, min: 0}
iptables: {localhostNodePorts: false}
`, kubeconfig, RealNodeName(0), RealNodeIP(0), healthz, metrics, realNodesRange)
	cfgPath := filepath.Join(dir, "config.yaml")
	if err := os.WriteFile(cfgPath, []byte(config), 0o644); err != nil {
		return err
	}
	p, err := startProcess("kube-proxy", filepath.Join(bin, "kube-proxy"), []string{"--config=" + cfgPath, "--v=1"}, c.LogDir)
	if err != nil {
		return err
	}
	c.addProc(p)
	return waitAnswers(p, fmt.Sprintf("http://127.0.0.1:%d/healthz", healthz))
}

// realNodesAPIServer configures the API server for pods that run: a
// serving certificate for the kubernetes Service's address and names
// (pods dial those), that Service's endpoint on node 0's address (the API
// proxy), ServiceAccount admission (pods get their tokens), and logs, exec
// and the node proxy to the kubelets' node IPs.
func (c *Cluster) realNodesAPIServer(api *envtest.APIServer) error {
	dir := filepath.Join(c.Dir, "apiserver")
	ips := []net.IP{net.ParseIP("127.0.0.1"), net.ParseIP(kubernetesServiceIP), net.ParseIP(RealNodeIP(0))}
	names := []string{"localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc", "kubernetes.default.svc.cluster.local"}
	ca, err := apiServerCerts(dir, ips, names)
	if err != nil {
		return fmt.Errorf("the API server's certificates: %w", err)
	}
	api.CertDir = dir
	api.SecureServing.CA = ca
	c.caFile = filepath.Join(dir, "ca.crt")
	api.Configure().Set("advertise-address", RealNodeIP(0))
	api.Configure().Disable("disable-admission-plugins")
	api.Configure().Set("kubelet-preferred-address-types", "InternalIP")
	return nil
}

// startCoreDNS serves cluster.local (CoreDNS's kubernetes plugin) at the
// first node's address, port 53: the kubelets' clusterDNS. Nothing else
// is resolved: no query leaves the machine.
func (c *Cluster) startCoreDNS(bin string) error {
	dir := filepath.Join(c.Dir, "nodes", "coredns")
	kubeconfig, err := c.componentKubeconfig(dir, "system:coredns")
	if err != nil {
		return err
	}
	ready, err := freePort()
	if err != nil {
		return err
	}
	corefile := fmt.Sprintf(`.:53 {
	bind %[1]s
	errors
	ready 127.0.0.1:%[2]d
	kubernetes cluster.local in-addr.arpa ip6.arpa {
		kubeconfig %[3]s
		pods insecure
	}
}
`, RealNodeIP(0), ready, kubeconfig)
	path := filepath.Join(dir, "Corefile")
	if err := os.WriteFile(path, []byte(corefile), 0o644); err != nil {
		return err
	}
	p, err := startProcess("coredns", filepath.Join(bin, "coredns"), []string{"-conf", path}, c.LogDir)
	if err != nil {
		return err
	}
	c.addProc(p)
	return waitAnswers(p, fmt.Sprintf("http://127.0.0.1:%d/ready", ready))
}

// componentKubeconfig writes dir/kubeconfig for a node component (an
// admin of the test cluster, known to the audit log as user).
func (c *Cluster) componentKubeconfig(dir, user string) (string, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	u, err := c.Env.ControlPlane.AddUser(envtest.User{Name: user, Groups: []string{"system:masters"}}, nil)
	if err != nil {
		return "", err
	}
	kc, err := u.KubeConfig()
	if err != nil {
		return "", err
	}
	path := filepath.Join(dir, "kubeconfig")
	return path, os.WriteFile(path, kc, 0o600)
}

// waitAnswers waits up to a minute for url to answer 200 OK, failing as
// soon as p exits.
func waitAnswers(p *process, url string) error {
	return wait.PollUntilContextTimeout(context.Background(), 200*time.Millisecond, time.Minute, true, func(context.Context) (bool, error) {
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
