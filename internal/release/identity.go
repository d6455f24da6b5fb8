package release

import (
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"

	"github.com/chartpilot/chartpilot/internal/hooks"
	"github.com/chartpilot/chartpilot/internal/identity"
)

// identity resolves the user every write made for the resource runs as
// (identity.Resolve, from the users the hooks name). "" is the manager
// itself, which lockdown (a default ServiceAccount set) never allows:
// there, a ServiceAccount that does not exist is a stall (NoIdentity)
// before anything is written.
func (r *Reconciler) identity(ctx context.Context, fromHooks []string, namespace string) (string, *stallError) {
	user, source := identity.Resolve(namespace, fromHooks, r.Watch.ServiceAccountName, r.DefaultServiceAccount)
	if r.DefaultServiceAccount == "" {
		return user, nil
	}
	ns, name, ok := identity.ParseServiceAccount(user)
	if !ok {
		return "", &stallError{"NoIdentity", fmt.Errorf("the operator runs locked down (--default-service-account) and %s names %q, not a ServiceAccount: nothing was written; set serviceAccountName on the Tenant or in watches.yaml", source, user)}
	}
	sa := &metav1.PartialObjectMetadata{}
	sa.SetGroupVersionKind(corev1.SchemeGroupVersion.WithKind("ServiceAccount"))
	key := types.NamespacedName{Namespace: ns, Name: name}
	err := r.Client.Get(ctx, key, sa)
	if apierrors.IsNotFound(err) && r.APIReader != nil {
		err = r.APIReader.Get(ctx, key, sa) // the cache may not have seen it yet
	}
	switch {
	case apierrors.IsNotFound(err):
		return "", &stallError{"NoIdentity", fmt.Errorf("the operator runs locked down (--default-service-account) and ServiceAccount %s/%s (from %s) does not exist: nothing was written; create it with `kubectl chartpilot identity create -n %s --service-account %s` (bound in %s only to the install's deployer ClusterRole), or set serviceAccountName on the Tenant or in watches.yaml", ns, name, source, ns, name, ns)}
	case err != nil:
		return "", &stallError{"NoIdentity", fmt.Errorf("reading ServiceAccount %s/%s: %w", ns, name, err)}
	}
	return user, nil
}

// identityForDeletion resolves the identity of a resource being deleted,
// from the hooks that name one (they need only the resource) and the
// fallbacks of identity.
func (r *Reconciler) identityForDeletion(ctx context.Context, p *pass) (string, *stallError) {
	hobj := hooks.Object{Resource: p.obj}
	var fromHooks []string
	for _, h := range r.Hooks {
		if h.Identity == nil {
			continue
		}
		id, err := h.Identity(ctx, hobj)
		if err != nil {
			return "", &stallError{"NoIdentity", fmt.Errorf("hook %s: %w", h.Name, err)}
		}
		fromHooks = append(fromHooks, id)
	}
	return r.identity(ctx, fromHooks, p.key.Namespace)
}

// dynamicAs is the dynamic client that reads and restores a release's
// objects as identity.
func (r *Reconciler) dynamicAs(identity string) (dynamic.Interface, error) {
	if identity == "" && r.Dynamic != nil {
		return r.Dynamic, nil
	}
	return r.Helm.As(identity).Dynamic()
}
