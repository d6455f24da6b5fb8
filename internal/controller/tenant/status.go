package tenant

import (
	"context"
	"fmt"
	"slices"
	"sort"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"

	"k8s.io/apimachinery/pkg/api/equality"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/chartpilot/chartpilot/hooks/tenancy"
	"github.com/chartpilot/chartpilot/internal/api/v1alpha1"
)

// maxViolations bounds status.violations.
const maxViolations = 20

// StatusReconciler keeps each Tenant's status: namespaces matched, overlap
// with other tenants, resources, storage used, violations.
type StatusReconciler struct {
	Client  client.Client
	Tenancy *tenancy.Tenancy
	// Kinds are the watched kinds; a change of one of their resources
	// refreshes the status of the tenant of its namespace.
	Kinds []schema.GroupVersionKind
}

// SetupWithManager builds the controller.
func (r *StatusReconciler) SetupWithManager(mgr ctrl.Manager, skipNameValidation bool) error {
	b := ctrl.NewControllerManagedBy(mgr).Named("tenant-status").For(&v1alpha1.Tenant{})
	b.WithOptions(controllerOptions(skipNameValidation))
	for _, gvk := range r.Kinds {
		u := &unstructured.Unstructured{}
		u.SetGroupVersionKind(gvk)
		b = b.Watches(u, handler.EnqueueRequestsFromMapFunc(r.tenantsOfNamespace))
	}
	return b.Complete(r)
}

// tenantsOfNamespace maps a resource to the tenants that claim its namespace.
func (r *StatusReconciler) tenantsOfNamespace(ctx context.Context, o client.Object) []reconcile.Request {
	list := &v1alpha1.TenantList{}
	if err := r.Client.List(ctx, list); err != nil {
		return nil
	}
	nsLabels, _ := r.Tenancy.NamespaceLabels(ctx, o.GetNamespace())
	var out []reconcile.Request
	for i := range list.Items {
		if tenancy.Claims(&list.Items[i], o.GetNamespace(), nsLabels) {
			out = append(out, reconcile.Request{NamespacedName: types.NamespacedName{Name: list.Items[i].Name}})
		}
	}
	return out
}

// Reconcile recomputes one tenant's status and writes it when it changed.
func (r *StatusReconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	tenant := &v1alpha1.Tenant{}
	if err := r.Client.Get(ctx, req.NamespacedName, tenant); err != nil {
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	namespaces, err := r.Tenancy.NamespacesOf(ctx, tenant)
	if err != nil {
		return ctrl.Result{}, err
	}
	st := v1alpha1.TenantStatus{ObservedGeneration: tenant.Generation, Namespaces: namespaces, Conditions: slices.Clone(tenant.Status.Conditions)}

	// Overlap with other tenants.
	all := &v1alpha1.TenantList{}
	if err := r.Client.List(ctx, all); err != nil {
		return ctrl.Result{}, err
	}
	var overlaps []string
	for i := range all.Items {
		other := &all.Items[i]
		if other.Name == tenant.Name {
			continue
		}
		theirs, err := r.Tenancy.NamespacesOf(ctx, other)
		if err != nil {
			return ctrl.Result{}, err
		}
		for _, ns := range namespaces {
			if slices.Contains(theirs, ns) {
				overlaps = append(overlaps, fmt.Sprintf("%s (also claimed by tenant %s)", ns, other.Name))
			}
		}
	}
	sort.Strings(overlaps)
	cond := metav1.Condition{Type: "Ready", Status: metav1.ConditionTrue, Reason: "Valid", Message: fmt.Sprintf("claims %d namespace(s)", len(namespaces)), ObservedGeneration: tenant.Generation}
	if len(overlaps) > 0 {
		cond.Status, cond.Reason = metav1.ConditionFalse, "Overlap"
		cond.Message = fmt.Sprintf("namespaces claimed by another tenant: %v; resources there are not reconciled until one tenant claims each", overlaps)
	}
	apimeta.SetStatusCondition(&st.Conditions, cond)

	resources, err := r.Tenancy.Resources(ctx, namespaces)
	if err != nil {
		return ctrl.Result{}, err
	}
	st.Resources = len(resources)
	// Claims are read (from the API server) only for a tenant whose total
	// is limited; otherwise storageUsed is the resources' specs.
	var claims []corev1.PersistentVolumeClaim
	if tenant.Spec.Limits.MaxTotalStorage != nil {
		if claims, err = r.Tenancy.ClaimsIn(ctx, namespaces); err != nil {
			return ctrl.Result{}, err
		}
	}
	used, _ := tenancy.TenantStorage(resources, claims, nil)
	for _, o := range resources {
		if reason, msg, ok := tenancy.Evaluate(tenant, o); !ok && len(st.Violations) < maxViolations {
			st.Violations = append(st.Violations, fmt.Sprintf("%s %s/%s: %s (%s)", o.Resource.GetKind(), o.Resource.GetNamespace(), o.Resource.GetName(), msg, reason))
		}
	}
	if tenant.Spec.Limits.MaxTotalStorage != nil && used > tenant.Spec.Limits.MaxTotalStorage.Value() && len(st.Violations) < maxViolations {
		st.Violations = append(st.Violations, fmt.Sprintf("storage used %s is over limits.maxTotalStorage %s", quantity(used), tenant.Spec.Limits.MaxTotalStorage.String()))
	}
	st.StorageUsed = quantity(used)
	if equality.Semantic.DeepEqual(st, tenant.Status) {
		return ctrl.Result{}, nil
	}
	patch := client.MergeFromWithOptions(tenant.DeepCopy(), client.MergeFromWithOptimisticLock{})
	tenant.Status = st
	return ctrl.Result{}, r.Client.Status().Patch(ctx, tenant, patch)
}

func controllerOptions(skipNameValidation bool) controller.Options {
	return controller.Options{SkipNameValidation: &skipNameValidation}
}

// quantity is n bytes as a Kubernetes quantity (binary suffixes).
func quantity(n int64) string { return resource.NewQuantity(n, resource.BinarySI).String() }
