package e2e

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"

	"github.com/chartpilot/chartpilot/internal/operator"
	"github.com/chartpilot/chartpilot/internal/watches"
)

// operatorProcessEnv makes the test binary run an operator (and its
// webhook server) instead of tests: the value is a kubeconfig; the webhook
// serves on operatorWebhookEnv ("host:port:certdir").
const (
	operatorProcessEnv = "CHARTPILOT_E2E_OPERATOR_KUBECONFIG"
	operatorWebhookEnv = "CHARTPILOT_E2E_OPERATOR_WEBHOOK"
	// operatorNamespaceEnv is the namespace the operator runs in (where its
	// ServiceAccount may write Secrets: the release records' key).
	operatorNamespaceEnv = "CHARTPILOT_E2E_OPERATOR_NAMESPACE"
	// operatorWatchesEnv, when set, is the watches.yaml (its text) the
	// operator runs with instead of the repository's.
	operatorWatchesEnv = "CHARTPILOT_E2E_OPERATOR_WATCHES"
)

// runOperatorProcess is the operator of a test that kills it.
func runOperatorProcess(kubeconfig string) int {
	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	// The repository's watches.yaml only: the operator chart's RBAC (which
	// some of these processes run under) knows nothing of the test kinds.
	ws, err := watches.Load(filepath.Join("..", "..", "watches.yaml"))
	if text := os.Getenv(operatorWatchesEnv); text != "" {
		ws, err = watches.Parse([]byte(text), ".", os.LookupEnv)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	parts := strings.SplitN(os.Getenv(operatorWebhookEnv), ":", 3)
	if len(parts) != 3 {
		fmt.Fprintln(os.Stderr, operatorWebhookEnv+" must be host:port:certdir")
		return 1
	}
	port, _ := strconv.Atoi(parts[1])
	in, err := defaultInstall()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	mgr, err := operator.New(operator.Options{
		Config: cfg, Watches: ws, MetricsAddr: "0", ProbeAddr: "0", DefaultServiceAccount: in.defaultServiceAccount,
		LeaderElectionNamespace: os.Getenv(operatorNamespaceEnv),
		Webhook:                 &operator.WebhookOptions{Host: parts[0], Port: port, CertDir: parts[2]},
	})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	if err := mgr.Start(ctx); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	return 0
}

// writeKubeconfig writes a kubeconfig for cfg (a bearer token or client
// certificate, and the server's CA).
func writeKubeconfig(cfg *rest.Config, path string) error {
	kc := clientcmdapi.NewConfig()
	kc.Clusters["c"] = &clientcmdapi.Cluster{Server: cfg.Host, CertificateAuthorityData: cfg.CAData, CertificateAuthority: cfg.CAFile}
	kc.AuthInfos["u"] = &clientcmdapi.AuthInfo{Token: cfg.BearerToken, ClientCertificateData: cfg.CertData, ClientKeyData: cfg.KeyData, ClientCertificate: cfg.CertFile, ClientKey: cfg.KeyFile}
	kc.Contexts["c"] = &clientcmdapi.Context{Cluster: "c", AuthInfo: "u"}
	kc.CurrentContext = "c"
	return clientcmd.WriteToFile(*kc, path)
}

// startOperatorProcess runs an operator with the manager's identity in a
// child process (killed with the test) and waits for its webhook.
func (e *env) startOperatorProcess(env ...string) *exec.Cmd {
	e.t.Helper()
	cfg, err := managerConfig()
	if err != nil {
		e.t.Fatal(err)
	}
	return e.startOperatorProcessAs(cfg, managerNamespace, env...)
}

// startOperatorProcessAs runs an operator with cfg's credentials in a child
// process (killed with the test) and waits for its webhook; env is added
// to its environment.
func (e *env) startOperatorProcessAs(cfg *rest.Config, namespace string, env ...string) *exec.Cmd {
	e.t.Helper()
	kubeconfig := filepath.Join(e.t.TempDir(), "kubeconfig")
	if err := writeKubeconfig(cfg, kubeconfig); err != nil {
		e.t.Fatal(err)
	}
	wh := cluster.Env.WebhookInstallOptions
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), operatorProcessEnv+"="+kubeconfig, operatorNamespaceEnv+"="+namespace,
		fmt.Sprintf("%s=%s:%d:%s", operatorWebhookEnv, wh.LocalServingHost, wh.LocalServingPort, wh.LocalServingCertDir))
	cmd.Env = append(cmd.Env, env...)
	logf, err := os.CreateTemp("", "chartpilot-e2e-operator-*.log")
	if err != nil {
		e.t.Fatal(err)
	}
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		e.t.Fatal(err)
	}
	e.t.Logf("operator process %d, logs in %s", cmd.Process.Pid, logf.Name())
	e.t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		_ = logf.Close()
	})
	waitWebhook(e.t)
	return cmd
}

// TestStorageGrowthSurvivesCrash: the operator is SIGKILLed after it
// expanded the claims and while the StatefulSet is being deleted (a
// finalizer of the test holds the deletion); after a restart the resize
// completes with the same pods and claims.
func TestStorageGrowthSurvivesCrash(t *testing.T) {
	e := setup(t)
	e.stop() // this test runs its operators as processes
	op := e.startOperatorProcess()
	ctx := context.Background()
	e.apply(postgresGVR, "Postgres", "crash", map[string]any{
		"version": "17", "replicas": 2,
		"storage": map[string]any{"size": "1Gi"},
	})
	e.waitFor("crash Ready with 2 ready replicas", 3*time.Minute, func() (bool, string) {
		ok, obs := ready(e.get(postgresGVR, "crash"))
		s, err := e.cs.AppsV1().StatefulSets(e.ns).Get(ctx, "crash", metav1.GetOptions{})
		if err != nil {
			return false, obs + "; " + err.Error()
		}
		return ok && s.Status.ReadyReplicas == 2, fmt.Sprintf("%s readyReplicas=%d", obs, s.Status.ReadyReplicas)
	})
	before, pods := revisionOf(e.get(postgresGVR, "crash")), e.podUIDs("crash")
	const hold = "e2e.chartpilot.dev/hold"
	if _, err := e.cs.AppsV1().StatefulSets(e.ns).Patch(ctx, "crash", types.MergePatchType, []byte(`{"metadata":{"finalizers":["`+hold+`"]}}`), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := e.patch(postgresGVR, "crash", `{"spec":{"storage":{"size":"2Gi"}}}`); err != nil {
		t.Fatal(err)
	}
	e.waitFor("claims expanded and the StatefulSet being deleted", 2*time.Minute, func() (bool, string) {
		sizes := e.claimSizes("data-crash-")
		s, err := e.cs.AppsV1().StatefulSets(e.ns).Get(ctx, "crash", metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		expanded := len(sizes) == 2
		for _, sz := range sizes {
			expanded = expanded && strings.HasPrefix(sz, "2Gi/")
		}
		return expanded && s.DeletionTimestamp != nil, fmt.Sprintf("claims %v, StatefulSet deleting: %v", sizes, s.DeletionTimestamp != nil)
	})
	if err := op.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = op.Wait()
	if _, err := e.cs.AppsV1().StatefulSets(e.ns).Patch(ctx, "crash", types.JSONPatchType, []byte(`[{"op":"remove","path":"/metadata/finalizers"}]`), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	e.startOperatorProcess()
	e.waitFor("the resize finished by the new operator", 4*time.Minute, func() (bool, string) {
		u := e.get(postgresGVR, "crash")
		ok, obs := ready(u)
		sizes := e.claimSizes("data-crash-")
		c := condition(u, "StorageResizing")
		tpl := e.templateSize("crash")
		resized := c != nil && c.Status == metav1.ConditionFalse
		return ok && resized && allSized(sizes, 2, "2Gi") && tpl == "2Gi" && revisionOf(u) == before+1,
			fmt.Sprintf("%s; claims %v; template %s; StorageResizing %v; revision %d", obs, sizes, tpl, c, revisionOf(u))
	})
	e.waitFor("the StatefulSet ready with its pods", 2*time.Minute, func() (bool, string) {
		s, err := e.cs.AppsV1().StatefulSets(e.ns).Get(ctx, "crash", metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		return s.Status.ReadyReplicas == 2, fmt.Sprintf("readyReplicas=%d", s.Status.ReadyReplicas)
	})
	if after := e.podUIDs("crash"); fmt.Sprint(after) != fmt.Sprint(pods) {
		t.Errorf("pods %v after the crash and resize, %v before: a pod was deleted", after, pods)
	}
}
