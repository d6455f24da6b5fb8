package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/chartpilot/chartpilot/internal/rbac"
	"github.com/chartpilot/chartpilot/internal/watches"
)

var (
	managerOnce sync.Once
	managerCfg  *rest.Config
	managerErr  error
)

// managerConfig is a client config of ServiceAccount chartpilot-system/manager,
// bound to the ClusterRole that `chartpilot rbac` derives from watches.yaml
// (with impersonation of the tests' "deployer"): the end-to-end tests run
// the operator under the least privilege it declares, not as cluster-admin.
func managerConfig(ws []watches.Watch) (*rest.Config, error) {
	managerOnce.Do(func() { managerCfg, managerErr = makeManagerConfig(ws) })
	return managerCfg, managerErr
}

func makeManagerConfig(ws []watches.Watch) (*rest.Config, error) {
	ctx := context.Background()
	cs, err := kubernetes.NewForConfig(cluster.Config)
	if err != nil {
		return nil, err
	}
	exists := func(err error) error {
		if apierrors.IsAlreadyExists(err) {
			return nil
		}
		return err
	}
	const ns, name = "chartpilot-system", "manager"
	if err := exists(func() error {
		_, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{})
		return err
	}()); err != nil {
		return nil, err
	}
	if _, err := cs.CoreV1().ServiceAccounts(ns).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{}); exists(err) != nil {
		return nil, err
	}
	var crds [][]byte
	err = filepath.WalkDir(filepath.Join("..", "..", "config", "crd"), func(path string, d os.DirEntry, err error) error {
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
	plurals, err := rbac.Plurals(crds...)
	if err != nil {
		return nil, err
	}
	rules, err := rbac.Rules(rbac.Options{Watches: ws, Impersonate: []string{"deployer"}, KubeVersion: "v1.37.2", Plurals: plurals})
	if err != nil {
		return nil, err
	}
	role := &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: "chartpilot-e2e-manager"}, Rules: rules}
	if _, err := cs.RbacV1().ClusterRoles().Create(ctx, role, metav1.CreateOptions{}); exists(err) != nil {
		return nil, err
	}
	binding := &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "chartpilot-e2e-manager"},
		RoleRef:    rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "ClusterRole", Name: role.Name},
		Subjects:   []rbacv1.Subject{{Kind: "ServiceAccount", Name: name, Namespace: ns}},
	}
	if _, err := cs.RbacV1().ClusterRoleBindings().Create(ctx, binding, metav1.CreateOptions{}); exists(err) != nil {
		return nil, err
	}
	hours := int64(6 * 3600)
	tok, err := cs.CoreV1().ServiceAccounts(ns).CreateToken(ctx, name, &authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: &hours}}, metav1.CreateOptions{})
	if err != nil {
		return nil, fmt.Errorf("token of %s/%s: %w", ns, name, err)
	}
	cfg := rest.AnonymousClientConfig(cluster.Config)
	cfg.BearerToken = tok.Status.Token
	return cfg, nil
}
