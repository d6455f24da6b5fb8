package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"

	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/chartpilot/chartpilot/internal/helm"
	"github.com/chartpilot/chartpilot/internal/rbac"
	"github.com/chartpilot/chartpilot/internal/watches"
)

// chartInstall is what charts/chartpilot renders with its default values,
// changed only as its values document for one's own watches and Tenants:
// the test chart's kind in rbac.extraRules and rbac.deployerExtraRules
// (from `chartpilot rbac`), the tests' Tenant ServiceAccount "deployer" in
// rbac.impersonate.
type chartInstall struct {
	// managerRules and namespaceRules are the manager's ClusterRole and its
	// Roles in its own namespace.
	managerRules, namespaceRules []rbacv1.PolicyRule
	// deployerRules are the deployer ClusterRole's.
	deployerRules []rbacv1.PolicyRule
	// defaultServiceAccount is the Deployment's --default-service-account.
	defaultServiceAccount string
}

var (
	installOnce sync.Once
	installed   chartInstall
	installErr  error
)

// defaultInstall renders charts/chartpilot once per process (no cluster
// needed: operator processes of the tests read it too).
func defaultInstall() (chartInstall, error) {
	installOnce.Do(func() { installed, installErr = renderDefaultInstall() })
	return installed, installErr
}

func renderDefaultInstall() (chartInstall, error) {
	var in chartInstall
	plurals, err := testPlurals()
	if err != nil {
		return in, err
	}
	test, err := watches.Parse([]byte(publicdbWatch), ".", os.LookupEnv)
	if err != nil {
		return in, err
	}
	o := rbac.Options{Watches: test, Deployer: rbac.DefaultDeployer, KubeVersion: "v1.37.2", Plurals: plurals}
	extra, err := rbac.Rules(o)
	if err != nil {
		return in, err
	}
	deployerExtra, err := rbac.DeployerRules(o)
	if err != nil {
		return in, err
	}
	ch, err := helm.LoadChart(filepath.Join("..", "..", "charts", "chartpilot"))
	if err != nil {
		return in, err
	}
	vals := map[string]any{"rbac": map[string]any{"impersonate": []any{"deployer"}, "extraRules": toValues(extra), "deployerExtraRules": toValues(deployerExtra)}}
	objs, err := helm.Render(ch, vals, "v1.37.2")
	if err != nil {
		return in, err
	}
	for _, obj := range objs {
		name := obj.GetName()
		switch obj.GetKind() {
		case "ClusterRole", "Role":
			var role rbacv1.ClusterRole
			if err := runtime.DefaultUnstructuredConverter.FromUnstructured(obj.Object, &role); err != nil {
				return in, err
			}
			switch {
			case obj.GetKind() == "ClusterRole" && strings.HasSuffix(name, "-manager"):
				in.managerRules = role.Rules
			case obj.GetKind() == "ClusterRole" && strings.HasSuffix(name, "-deployer"):
				in.deployerRules = role.Rules
			case obj.GetKind() == "Role":
				in.namespaceRules = append(in.namespaceRules, role.Rules...)
			}
		case "Deployment":
			for _, a := range containerArgs(obj.Object) {
				if v, ok := strings.CutPrefix(a, "--default-service-account="); ok {
					in.defaultServiceAccount = v
				}
			}
		}
	}
	if in.managerRules == nil || in.deployerRules == nil || in.defaultServiceAccount == "" {
		return in, fmt.Errorf("charts/chartpilot with default values renders no manager ClusterRole, deployer ClusterRole or --default-service-account")
	}
	return in, nil
}

// containerArgs are the args of a Deployment's first container.
func containerArgs(obj map[string]any) []string {
	cs, _, _ := unstructured.NestedSlice(obj, "spec", "template", "spec", "containers")
	if len(cs) == 0 {
		return nil
	}
	c, _ := cs[0].(map[string]any)
	args, _, _ := unstructured.NestedStringSlice(c, "args")
	return args
}

func toValues(rules []rbacv1.PolicyRule) []any {
	out := make([]any, 0, len(rules))
	for _, r := range rules {
		m, err := runtime.DefaultUnstructuredConverter.ToUnstructured(&r)
		if err == nil {
			out = append(out, m)
		}
	}
	return out
}

func makeClusterRole(name string, rules []rbacv1.PolicyRule) error {
	cs, err := kubernetes.NewForConfig(cluster.Config)
	if err != nil {
		return err
	}
	ctx := context.Background()
	_, err = cs.RbacV1().ClusterRoles().Create(ctx, &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: name}, Rules: rules}, metav1.CreateOptions{})
	if apierrors.IsAlreadyExists(err) {
		var have *rbacv1.ClusterRole
		if have, err = cs.RbacV1().ClusterRoles().Get(ctx, name, metav1.GetOptions{}); err == nil {
			have.Rules = rules
			_, err = cs.RbacV1().ClusterRoles().Update(ctx, have, metav1.UpdateOptions{})
		}
	}
	if err != nil {
		return fmt.Errorf("ClusterRole %s: %w", name, err)
	}
	return nil
}

// testPlurals are the plural names of the CRDs the tests install.
func testPlurals() (map[schema.GroupKind]string, error) {
	var crds [][]byte
	for _, dir := range crdPaths {
		err := filepath.WalkDir(dir, func(path string, d os.DirEntry, err error) error {
			if err != nil || d.IsDir() || !strings.HasSuffix(path, ".yaml") {
				return err
			}
			b, err := os.ReadFile(path)
			crds = append(crds, b)
			return err
		})
		if err != nil {
			return nil, err
		}
	}
	return rbac.Plurals(crds...)
}

// managerNamespace is where the manager's ServiceAccount lives and may
// write Secrets (the release records' key).
const managerNamespace = "chartpilot-system"

var (
	managerOnce sync.Once
	managerCfg  *rest.Config
	managerErr  error
)

// managerConfig is a client config of ServiceAccount chartpilot-system/manager
// bound to the roles charts/chartpilot makes with its default values
// (defaultInstall), whose deployer ClusterRole it makes as
// chartpilot-deployer (a release named chartpilot): the end-to-end tests run
// the operator locked down, under the least privilege a default install
// gives it, not as cluster-admin.
func managerConfig() (*rest.Config, error) {
	managerOnce.Do(func() {
		in, err := defaultInstall()
		if err != nil {
			managerErr = err
			return
		}
		if managerErr = makeClusterRole(rbac.DefaultDeployer, in.deployerRules); managerErr != nil {
			return
		}
		if managerCfg, managerErr = cluster.ServiceAccountConfig(managerNamespace, "manager", in.managerRules); managerErr != nil {
			return
		}
		managerErr = cluster.BindRole(managerNamespace, "chartpilot-manager", managerNamespace, "manager", in.namespaceRules)
	})
	return managerCfg, managerErr
}
