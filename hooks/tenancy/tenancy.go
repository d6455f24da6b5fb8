// Package tenancy is the tenancy hook: Tenant objects (cluster-scoped) claim
// namespaces, give the releases there a values layer, bound them with limits,
// and may make every Helm action run as a tenant ServiceAccount.
//
// A namespace claimed by two tenants is refused (no guessing which applies)
// until the tenants are fixed; both tenants report the overlap.
package tenancy

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"sort"
	"strings"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/workqueue"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/source"

	"github.com/chartpilot/chartpilot/internal/api/v1alpha1"
	"github.com/chartpilot/chartpilot/internal/hooks"
	"github.com/chartpilot/chartpilot/internal/identity"
	"github.com/chartpilot/chartpilot/internal/values"
)

// Name is the hook's name in watches.yaml.
const Name = "tenancy"

// ConditionType is set on every resource the hook checks.
const ConditionType = "TenantPolicy"

// ResourcesFunc lists the managed resources (of every watched kind) in the
// namespaces, with their facts; the tenant-wide limits and status use it.
type ResourcesFunc func(ctx context.Context, namespaces []string) ([]hooks.Object, error)

// Tenancy evaluates tenants from a cached client.
type Tenancy struct {
	Client    client.Reader
	Resources ResourcesFunc
	// Claims reads the PersistentVolumeClaims of a namespace (nil: only
	// the resources' specs count against limits.maxTotalStorage).
	Claims func(ctx context.Context, namespace string) ([]corev1.PersistentVolumeClaim, error)
}

// ClaimsIn reads the claims of namespaces (none without Claims).
func (t *Tenancy) ClaimsIn(ctx context.Context, namespaces []string) ([]corev1.PersistentVolumeClaim, error) {
	if t.Claims == nil {
		return nil, nil
	}
	var out []corev1.PersistentVolumeClaim
	for _, ns := range namespaces {
		cs, err := t.Claims(ctx, ns)
		if err != nil {
			return nil, fmt.Errorf("reading the claims of namespace %s: %w", ns, err)
		}
		out = append(out, cs...)
	}
	return out, nil
}

// Hook returns the tenancy hook.
func (t *Tenancy) Hook() *hooks.Hook {
	return &hooks.Hook{
		Name:          Name,
		ConditionType: ConditionType,
		Validator:     hooks.ValidateFunc(t.validate),
		Values:        hooks.ValuesFunc(t.values),
		ValuesLayer:   hooks.LayerTenant,
		Identity:      t.identity,
		Peers:         t.peers,
		Watcher:       t,
	}
}

// TenantOf returns the tenant claiming namespace ns, nil if none, or a
// Rejection when several claim it. Within one reconcile pass it is looked
// up once (hooks.WithPassMemo).
func (t *Tenancy) TenantOf(ctx context.Context, ns string) (*v1alpha1.Tenant, error) {
	return hooks.Remember(ctx, "tenancy:tenant-of:"+ns, func() (*v1alpha1.Tenant, error) { return t.tenantOf(ctx, ns) })
}

func (t *Tenancy) tenantOf(ctx context.Context, ns string) (*v1alpha1.Tenant, error) {
	list := &v1alpha1.TenantList{}
	if err := t.Client.List(ctx, list); err != nil {
		return nil, fmt.Errorf("listing tenants: %w", err)
	}
	nsLabels, err := t.NamespaceLabels(ctx, ns)
	if err != nil {
		return nil, err
	}
	var matched []*v1alpha1.Tenant
	for i := range list.Items {
		if Claims(&list.Items[i], ns, nsLabels) {
			matched = append(matched, &list.Items[i])
		}
	}
	switch len(matched) {
	case 0:
		return nil, nil
	case 1:
		return matched[0], nil
	default:
		names := make([]string, 0, len(matched))
		for _, m := range matched {
			names = append(names, m.Name)
		}
		sort.Strings(names)
		return nil, hooks.Reject("TenantOverlap", "namespace %s is claimed by tenants %s: fix their namespaces or namespaceSelector so that one claims it", ns, strings.Join(names, " and "))
	}
}

func (t *Tenancy) NamespaceLabels(ctx context.Context, ns string) (labels.Set, error) {
	m := &metav1.PartialObjectMetadata{}
	m.SetGroupVersionKind(corev1.SchemeGroupVersion.WithKind("Namespace"))
	if err := t.Client.Get(ctx, types.NamespacedName{Name: ns}, m); err != nil {
		return nil, client.IgnoreNotFound(err)
	}
	return labels.Set(m.GetLabels()), nil
}

// Claims reports whether tenant claims namespace ns (with labels).
func Claims(tenant *v1alpha1.Tenant, ns string, nsLabels labels.Set) bool {
	if slices.Contains(tenant.Spec.Namespaces, ns) {
		return true
	}
	if tenant.Spec.NamespaceSelector == nil {
		return false
	}
	sel, err := metav1.LabelSelectorAsSelector(tenant.Spec.NamespaceSelector)
	return err == nil && !sel.Empty() && sel.Matches(nsLabels)
}

func (t *Tenancy) validate(ctx context.Context, obj hooks.Object) error {
	tenant, err := t.TenantOf(ctx, obj.Resource.GetNamespace())
	if err != nil || tenant == nil {
		return err
	}
	if reason, msg, ok := Evaluate(tenant, obj); !ok {
		return hooks.Reject(reason, "%s", msg)
	}
	if tenant.Spec.Limits.MaxTotalStorage != nil && t.Resources != nil {
		namespaces, err := t.NamespacesOf(ctx, tenant)
		if err != nil {
			return err
		}
		others, err := t.Resources(ctx, namespaces)
		if err != nil {
			return err
		}
		var rest []hooks.Object
		for _, o := range others {
			if o.Resource.GetUID() == obj.Resource.GetUID() && o.Resource.GetUID() != "" {
				continue
			}
			if o.Resource.GetNamespace() == obj.Resource.GetNamespace() && o.Resource.GetName() == obj.Resource.GetName() && o.Resource.GetKind() == obj.Resource.GetKind() {
				continue
			}
			rest = append(rest, o)
		}
		claims, err := t.ClaimsIn(ctx, namespaces)
		if err != nil {
			return err
		}
		sum, own := TenantStorage(rest, claims, &obj)
		// The resource's own claims beyond what its spec asks for (an old
		// volume kept after a major upgrade) count as well.
		if extra := own - storageOf(obj.Facts); extra > 0 {
			sum += extra
		}
		if reason, msg, ok := checkTotalStorage(tenant, obj, sum); !ok {
			return hooks.Reject(reason, "%s", msg)
		}
	}
	return nil
}

// values is the tenant layer: the tenant's values for this kind, and its
// default storage class where the resource names none.
func (t *Tenancy) values(ctx context.Context, obj hooks.Object) (map[string]any, error) {
	tenant, err := t.TenantOf(ctx, obj.Resource.GetNamespace())
	if err != nil || tenant == nil {
		return nil, err
	}
	return tenantValues(tenant, obj)
}

// tenantValues merges the tenant's values entries that name obj's kind.
func tenantValues(tenant *v1alpha1.Tenant, obj hooks.Object) (map[string]any, error) {
	gvk := obj.Resource.GroupVersionKind()
	var parts []map[string]any
	for i, v := range tenant.Spec.Values {
		if v.Kind != gvk.Kind && v.Kind != gvk.Group+"/"+gvk.Kind {
			continue
		}
		var m map[string]any
		if err := json.Unmarshal(v.Values.Raw, &m); err != nil {
			return nil, hooks.Reject("TenantInvalid", "tenant %s: spec.values[%d].values is not an object of chart values", tenant.Name, i)
		}
		parts = append(parts, m)
	}
	out := values.Compose(parts...)
	if def := tenant.Spec.Limits.DefaultStorageClass; def != "" && obj.Facts.StorageClass == "" && len(obj.Facts.StorageClassPath) > 0 {
		m := out
		path := obj.Facts.StorageClassPath
		for _, k := range path[:len(path)-1] {
			next, ok := m[k].(map[string]any)
			if !ok {
				next = map[string]any{}
				m[k] = next
			}
			m = next
		}
		if _, set := m[path[len(path)-1]]; !set {
			m[path[len(path)-1]] = def
		}
	}
	if len(out) == 0 {
		return nil, nil
	}
	return out, nil
}

// peers are the namespaces of the tenant that claims ns (nil: no tenant).
func (t *Tenancy) peers(ctx context.Context, ns string) ([]string, error) {
	tenant, err := t.TenantOf(ctx, ns)
	if err != nil || tenant == nil {
		return nil, err
	}
	return t.NamespacesOf(ctx, tenant)
}

// identity is the tenant's ServiceAccount in the resource's namespace.
func (t *Tenancy) identity(ctx context.Context, obj hooks.Object) (string, error) {
	tenant, err := t.TenantOf(ctx, obj.Resource.GetNamespace())
	if err != nil || tenant == nil || tenant.Spec.ServiceAccountName == "" {
		return "", err
	}
	return identity.ServiceAccount(obj.Resource.GetNamespace(), tenant.Spec.ServiceAccountName), nil
}

// NamespacesOf lists the namespaces a tenant claims.
func (t *Tenancy) NamespacesOf(ctx context.Context, tenant *v1alpha1.Tenant) ([]string, error) {
	set := map[string]bool{}
	for _, n := range tenant.Spec.Namespaces {
		set[n] = true
	}
	if tenant.Spec.NamespaceSelector != nil {
		sel, err := metav1.LabelSelectorAsSelector(tenant.Spec.NamespaceSelector)
		if err == nil && !sel.Empty() {
			list := &metav1.PartialObjectMetadataList{}
			list.SetGroupVersionKind(corev1.SchemeGroupVersion.WithKind("NamespaceList"))
			if err := t.Client.List(ctx, list, client.MatchingLabelsSelector{Selector: sel}); err != nil {
				return nil, fmt.Errorf("listing namespaces: %w", err)
			}
			for _, n := range list.Items {
				set[n.Name] = true
			}
		}
	}
	out := make([]string, 0, len(set))
	for n := range set {
		out = append(out, n)
	}
	sort.Strings(out)
	return out, nil
}

// Watch re-reconciles the resources of a tenant's namespaces (old and new)
// when the tenant changes, and those of a namespace whose labels change.
func (t *Tenancy) Watch(mgr manager.Manager, c controller.Controller, enqueue hooks.EnqueueFunc) error {
	add := func(ctx context.Context, q workqueue.TypedRateLimitingInterface[reconcile.Request], tenants ...*v1alpha1.Tenant) {
		var namespaces []string
		for _, tn := range tenants {
			ns, err := t.NamespacesOf(ctx, tn)
			if err == nil {
				namespaces = append(namespaces, ns...)
			}
		}
		for _, r := range enqueue(ctx, namespaces) {
			q.Add(r)
		}
	}
	tenantHandler := handler.TypedFuncs[*v1alpha1.Tenant, reconcile.Request]{
		CreateFunc: func(ctx context.Context, e event.TypedCreateEvent[*v1alpha1.Tenant], q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
			add(ctx, q, e.Object)
		},
		UpdateFunc: func(ctx context.Context, e event.TypedUpdateEvent[*v1alpha1.Tenant], q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
			if e.ObjectOld.Generation != e.ObjectNew.Generation {
				add(ctx, q, e.ObjectOld, e.ObjectNew)
			}
		},
		DeleteFunc: func(ctx context.Context, e event.TypedDeleteEvent[*v1alpha1.Tenant], q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
			add(ctx, q, e.Object)
		},
	}
	if err := c.Watch(source.Kind(mgr.GetCache(), &v1alpha1.Tenant{}, tenantHandler)); err != nil {
		return err
	}
	ns := &metav1.PartialObjectMetadata{}
	ns.SetGroupVersionKind(corev1.SchemeGroupVersion.WithKind("Namespace"))
	nsHandler := handler.EnqueueRequestsFromMapFunc(func(ctx context.Context, o client.Object) []reconcile.Request {
		return enqueue(ctx, []string{o.GetName()})
	})
	return c.Watch(source.Kind(mgr.GetCache(), client.Object(ns), nsHandler, predicate.LabelChangedPredicate{}))
}
