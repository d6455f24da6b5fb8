package e2e

import (
	"bytes"
	"context"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/chartpilot/chartpilot/internal/rbac"
)

// kubectl runs the pinned kubectl of bin/ against the local cluster.
func kubectl(t *testing.T, stdin []byte, args ...string) []byte {
	t.Helper()
	cmd := exec.Command(filepath.Join("..", "..", "bin", "kubectl"), append([]string{"--kubeconfig", cluster.KubeconfigPath}, args...)...)
	cmd.Stdin = bytes.NewReader(stdin)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("kubectl %s: %v\n%s%s", strings.Join(args, " "), err, out, stderr.Bytes())
	}
	return out
}

// TestKustomizeAppliesServerSide: config/default renders with kubectl
// kustomize and every object it holds is accepted by the API server
// (server-side apply, dry run).
func TestKustomizeAppliesServerSide(t *testing.T) {
	cluster.Skip(t)
	cs, err := kubernetes.NewForConfig(cluster.Config)
	if err != nil {
		t.Fatal(err)
	}
	// A dry run creates nothing, so the namespaced objects need their
	// namespace to exist already.
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "chartpilot-system"}}
	if _, err := cs.CoreV1().Namespaces().Create(context.Background(), ns, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	manifest := kubectl(t, nil, "kustomize", filepath.Join("..", "..", "config", "default"))
	objects := strings.Count("\n"+string(manifest), "\nkind: ")
	if objects < 10 {
		t.Fatalf("config/default renders %d objects:\n%s", objects, manifest)
	}
	out := kubectl(t, manifest, "apply", "--server-side", "--force-conflicts", "--field-manager=chartpilot-install-test", "--dry-run=server", "-f", "-")
	applied := strings.Count(string(out), "serverside-applied (server dry run)")
	if applied != objects {
		t.Errorf("%d of %d objects accepted:\n%s", applied, objects, out)
	}
	for _, want := range []string{"deployment.apps/chartpilot-manager", "clusterrole.rbac.authorization.k8s.io/chartpilot-manager", "validatingwebhookconfiguration.admissionregistration.k8s.io/",
		"clusterrole.rbac.authorization.k8s.io/" + rbac.DefaultDeployer, "role.rbac.authorization.k8s.io/chartpilot-manager"} {
		if !strings.Contains(string(out), want) {
			t.Errorf("%s not applied:\n%s", want, out)
		}
	}
	// Locked down: each resource's writes run as the deployer of its
	// namespace, which the manager may impersonate (by name only).
	for _, want := range []string{"--default-service-account=" + rbac.DefaultDeployer, "  verbs:\n  - impersonate\n", "  - " + rbac.DefaultDeployer + "\n"} {
		if !strings.Contains(string(manifest), want) {
			t.Errorf("config/default has no %q", want)
		}
	}
}
