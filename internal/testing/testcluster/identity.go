package testcluster

import (
	"context"
	"fmt"
	"os"
	"path/filepath"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
)

// ServiceAccountConfig makes ServiceAccount namespace/name (and its
// namespace), binds it to a ClusterRole of its own name with rules, and
// returns a client config that authenticates as it with a token from the
// TokenRequest API: whatever uses it has exactly those rights.
func (c *Cluster) ServiceAccountConfig(namespace, name string, rules []rbacv1.PolicyRule) (*rest.Config, error) {
	ctx := context.Background()
	cs, err := kubernetes.NewForConfig(c.Config)
	if err != nil {
		return nil, err
	}
	exists := func(_ any, err error) error {
		if apierrors.IsAlreadyExists(err) {
			return nil
		}
		return err
	}
	role := namespace + "-" + name
	for _, err := range []error{
		exists(cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: namespace}}, metav1.CreateOptions{})),
		exists(cs.CoreV1().ServiceAccounts(namespace).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{})),
		exists(cs.RbacV1().ClusterRoles().Create(ctx, &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: role}, Rules: rules}, metav1.CreateOptions{})),
		exists(cs.RbacV1().ClusterRoleBindings().Create(ctx, &rbacv1.ClusterRoleBinding{
			ObjectMeta: metav1.ObjectMeta{Name: role},
			RoleRef:    rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "ClusterRole", Name: role},
			Subjects:   []rbacv1.Subject{{Kind: "ServiceAccount", Name: name, Namespace: namespace}},
		}, metav1.CreateOptions{})),
	} {
		if err != nil {
			return nil, fmt.Errorf("ServiceAccount %s/%s: %w", namespace, name, err)
		}
	}
	hours := int64(6 * 3600)
	tok, err := cs.CoreV1().ServiceAccounts(namespace).CreateToken(ctx, name, &authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: &hours}}, metav1.CreateOptions{})
	if err != nil {
		return nil, fmt.Errorf("token of %s/%s: %w", namespace, name, err)
	}
	cfg := rest.AnonymousClientConfig(c.Config)
	cfg.BearerToken = tok.Status.Token
	return cfg, nil
}

// User writes a kubeconfig for a user of the given name and groups
// (authenticated by a client certificate) and returns its path: a process
// run with it shows in the audit log under that name.
func (c *Cluster) User(name string, groups []string) (string, error) {
	u, err := c.Env.ControlPlane.AddUser(envtest.User{Name: name, Groups: groups}, nil)
	if err != nil {
		return "", fmt.Errorf("user %s: %w", name, err)
	}
	kc, err := u.KubeConfig()
	if err != nil {
		return "", fmt.Errorf("kubeconfig of %s: %w", name, err)
	}
	path := filepath.Join(c.Dir, "kubeconfig-"+name)
	return path, os.WriteFile(path, kc, 0o600)
}

// BindRole gives ServiceAccount saNamespace/saName rules in namespace only:
// a Role and RoleBinding named name there (left as they are when they exist).
func (c *Cluster) BindRole(namespace, name, saNamespace, saName string, rules []rbacv1.PolicyRule) error {
	ctx := context.Background()
	cs, err := kubernetes.NewForConfig(c.Config)
	if err != nil {
		return err
	}
	_, err = cs.RbacV1().Roles(namespace).Create(ctx, &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Name: name}, Rules: rules}, metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("Role %s/%s: %w", namespace, name, err)
	}
	_, err = cs.RbacV1().RoleBindings(namespace).Create(ctx, &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: name},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: saName, Namespace: saNamespace}},
	}, metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("RoleBinding %s/%s: %w", namespace, name, err)
	}
	return nil
}
