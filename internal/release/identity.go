package release

import (
	"context"
	"fmt"
	"strings"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"

	"github.com/chartpilot/chartpilot/hooks"
)

// serviceAccountUser is the user name a ServiceAccount is impersonated as.
func serviceAccountUser(namespace, name string) string {
	return "system:serviceaccount:" + namespace + ":" + name
}

// identity resolves the user every write made for the resource runs as:
// the one a hook names (a Tenant's ServiceAccount), else the watch's
// serviceAccountName, else the operator's default ServiceAccount, each in
// the resource's namespace. "" is the manager itself, which lockdown (a
// default ServiceAccount set) never allows: there, a ServiceAccount that does
// not exist is a stall (NoIdentity) before anything is written.
func (r *Reconciler) identity(ctx context.Context, fromHooks string, namespace string) (string, *stallError) {
	user, source := fromHooks, "the resource's Tenant"
	if user == "" && r.Watch.ServiceAccountName != "" {
		user, source = serviceAccountUser(namespace, r.Watch.ServiceAccountName), "the watch's serviceAccountName"
	}
	if user == "" && r.DefaultServiceAccount != "" {
		user, source = serviceAccountUser(namespace, r.DefaultServiceAccount), "--default-service-account"
	}
	if r.DefaultServiceAccount == "" {
		return user, nil
	}
	ns, name, ok := parseServiceAccountUser(user)
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

// parseServiceAccountUser splits system:serviceaccount:NS:NAME.
func parseServiceAccountUser(user string) (namespace, name string, ok bool) {
	rest, ok := strings.CutPrefix(user, "system:serviceaccount:")
	if !ok {
		return "", "", false
	}
	namespace, name, ok = strings.Cut(rest, ":")
	return namespace, name, ok && namespace != "" && name != ""
}

// identityForDeletion resolves the identity of a resource being deleted,
// from the hooks that name one (they need only the resource) and the
// fallbacks of identity.
func (r *Reconciler) identityForDeletion(ctx context.Context, p *pass) (string, *stallError) {
	hobj := hooks.Object{Resource: p.obj}
	fromHooks := ""
	for _, h := range r.Hooks {
		if h.Identity == nil {
			continue
		}
		id, err := h.Identity(ctx, hobj)
		if err != nil {
			return "", &stallError{"NoIdentity", fmt.Errorf("hook %s: %w", h.Name, err)}
		}
		if id != "" {
			fromHooks = id
		}
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
