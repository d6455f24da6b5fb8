package rbac

import (
	"context"
	"fmt"
	"slices"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

// DefaultDeployer is the ServiceAccount (and deployer ClusterRole) name of
// a default install: `chartpilot run --default-service-account`, the
// chart's defaultServiceAccount, config/default.
const DefaultDeployer = "chartpilot-deployer"

// CreateDeployer makes the identity resources of namespace run as:
// ServiceAccount name, bound in namespace only (a RoleBinding of the same
// name) to ClusterRole clusterRole. What exists already is left as it is;
// a RoleBinding of that name bound to anything else is an error, not
// changed. It returns one line per object: created or unchanged.
func CreateDeployer(ctx context.Context, cs kubernetes.Interface, namespace, name, clusterRole string) ([]string, error) {
	if _, err := cs.RbacV1().ClusterRoles().Get(ctx, clusterRole, metav1.GetOptions{}); apierrors.IsNotFound(err) {
		return nil, fmt.Errorf("ClusterRole %s does not exist: install chartpilot (its chart or config/default makes it) or name another with --cluster-role", clusterRole)
	} else if err != nil && !apierrors.IsForbidden(err) {
		return nil, fmt.Errorf("reading ClusterRole %s: %w", clusterRole, err)
	}
	labels := map[string]string{"app.kubernetes.io/managed-by": "chartpilot", "app.kubernetes.io/component": "deployer"}
	var out []string
	sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: namespace, Labels: labels},
		AutomountServiceAccountToken: new(bool)}
	_, err := cs.CoreV1().ServiceAccounts(namespace).Create(ctx, sa, metav1.CreateOptions{})
	switch {
	case err == nil:
		out = append(out, fmt.Sprintf("serviceaccount/%s created in %s", name, namespace))
	case apierrors.IsAlreadyExists(err):
		out = append(out, fmt.Sprintf("serviceaccount/%s unchanged in %s", name, namespace))
	default:
		return out, fmt.Errorf("creating ServiceAccount %s/%s: %w", namespace, name, err)
	}
	ref := rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: clusterRole}
	rb := &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: namespace, Labels: labels}, RoleRef: ref,
		Subjects: []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: name, Namespace: namespace}}}
	_, err = cs.RbacV1().RoleBindings(namespace).Create(ctx, rb, metav1.CreateOptions{})
	switch {
	case err == nil:
		return append(out, fmt.Sprintf("rolebinding/%s created in %s (ClusterRole %s)", name, namespace, clusterRole)), nil
	case !apierrors.IsAlreadyExists(err):
		return out, fmt.Errorf("creating RoleBinding %s/%s: %w", namespace, name, err)
	}
	have, err := cs.RbacV1().RoleBindings(namespace).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return out, fmt.Errorf("reading RoleBinding %s/%s: %w", namespace, name, err)
	}
	if have.RoleRef != ref || !slices.Contains(have.Subjects, rb.Subjects[0]) {
		return out, fmt.Errorf("RoleBinding %s/%s exists and does not bind ServiceAccount %s to ClusterRole %s: delete it or choose another --service-account", namespace, name, name, clusterRole)
	}
	return append(out, fmt.Sprintf("rolebinding/%s unchanged in %s", name, namespace)), nil
}
