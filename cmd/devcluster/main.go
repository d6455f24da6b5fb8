// Command devcluster starts a local Kubernetes control plane (the full tier of
// internal/testing/testcluster: etcd, kube-apiserver, controller manager, scheduler,
// kwok nodes and a volume provisioner) for demos and manual testing.
//
//	go run ./cmd/devcluster --dir .devcluster
//
// With --real-nodes N (as root) it adds nodes whose pods run, each in
// namespaces of its own that end with this process, and prints
// "registry=127.0.0.1:PORT" (where they pull images from), "host=ADDR"
// (this machine's address on the nodes' network, where pods reach its
// servers) and one "node=NAME" line per real node first.
//
// It prints one line "ready kubeconfig=<path>" once usable, and runs until
// interrupted (SIGINT or SIGTERM), then stops every process it started.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"

	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"github.com/chartpilot/chartpilot/internal/cliutil"
	"github.com/chartpilot/chartpilot/internal/testing/testcluster"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintf(os.Stderr, "devcluster: %v\n", err)
		os.Exit(1)
	}
}

func run() error {
	dir := flag.String("dir", ".devcluster", "working directory: kubeconfig, logs/, volumes/")
	tier := flag.String("tier", string(testcluster.TierFull), "api (etcd + kube-apiserver) or full (+ controllers, scheduler, kwok nodes, provisioner)")
	nodes := flag.Int("nodes", 3, "number of fake kwok nodes (full tier)")
	realNodes := flag.Int("real-nodes", 0, "number of nodes that run containers (full tier, as root): containerd, runc, a kubelet and CNI each, pulling from a registry on loopback; pods there need the real-node label and taint")
	port := flag.Int("port", 0, "kube-apiserver port on 127.0.0.1 (default: a free port)")
	binDir := flag.String("bin-dir", "", "directory of the control-plane binaries (default: bin/ of this repository, or $CHARTPILOT_BIN_DIR)")
	verbose := flag.Bool("v", false, "print start-up steps")
	webhooks := flag.String("webhooks", "", "a file of webhook configurations (config/webhook/manifests.yaml) installed pointing at 127.0.0.1, with certificates made for it: the line \"webhook port=... cert-dir=...\" says where to serve them")
	crds := flag.Bool("crds", true, "install the chartpilot CRDs (config/crd) at start; false leaves them to kubectl apply, with no warning about a missing last-applied-configuration")
	flag.Parse()

	if *port != 0 {
		if err := cliutil.CheckPortFree(fmt.Sprintf("127.0.0.1:%d", *port), "--port"); err != nil {
			return err
		}
	}
	absDir, err := filepath.Abs(*dir)
	if err != nil {
		return err
	}
	opts := testcluster.Options{
		Tier:          testcluster.Tier(*tier),
		Dir:           absDir,
		BinDir:        *binDir,
		Nodes:         *nodes,
		RealNodes:     *realNodes,
		APIServerPort: *port,
	}
	if !*crds {
		opts.CRDDirs = []string{} // not nil: no default directories either
	}
	if *verbose {
		opts.Log = os.Stderr
	}
	if *webhooks != "" {
		if _, err := os.Stat(*webhooks); err != nil {
			return fmt.Errorf("--webhooks: %w", err)
		}
		opts.WebhookInstallOptions = envtest.WebhookInstallOptions{Paths: []string{*webhooks}}
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	startCtx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	defer cancel()
	c, err := testcluster.Start(startCtx, opts)
	if err != nil {
		return err
	}
	if *webhooks != "" {
		wh := c.Env.WebhookInstallOptions
		fmt.Printf("webhook port=%d cert-dir=%s\n", wh.LocalServingPort, wh.LocalServingCertDir)
	}
	if c.Registry != nil {
		fmt.Printf("registry=%s\n", c.Registry.Host)
		fmt.Printf("host=%s\n", testcluster.HostIP)
		for i := range *realNodes {
			fmt.Printf("node=%s\n", testcluster.RealNodeName(i))
		}
	}
	fmt.Printf("ready kubeconfig=%s\n", c.KubeconfigPath)
	<-ctx.Done()
	fmt.Fprintln(os.Stderr, "devcluster: stopping")
	return c.Stop()
}
