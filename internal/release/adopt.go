package release

import (
	"context"
	"strings"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"

	"github.com/chartpilot/chartpilot/internal/api/v1alpha1"
	"github.com/chartpilot/chartpilot/internal/helm"
)

// mayAdopt reports whether the resource may take its release over
// (annotation chartpilot.dev/adopt): a release nobody owns, or one whose
// owner is gone, but never one that another resource still owns.
func (r *Reconciler) mayAdopt(ctx context.Context, p *pass, history []*helm.Release) bool {
	if p.obj.GetAnnotations()[v1alpha1.AnnotationAdopt] != "true" {
		return false
	}
	if len(history) == 0 {
		return true
	}
	latest := history[len(history)-1]
	uid := latest.Labels[v1alpha1.LabelOwnerUID]
	if uid == "" || uid == string(p.obj.GetUID()) {
		return true
	}
	return !r.ownerExists(ctx, p.key, latest.Labels[v1alpha1.LabelOwnerKind], uid)
}

// ownerExists reports whether the resource of ownerKind ("Kind.group") that
// owns release key (same namespace and name) still exists with uid. When
// that cannot be told, it is taken to exist.
func (r *Reconciler) ownerExists(ctx context.Context, key types.NamespacedName, ownerKind, uid string) bool {
	kind, group, _ := strings.Cut(ownerKind, ".")
	mapping, err := r.Helm.RESTMapper().RESTMapping(schema.GroupKind{Group: group, Kind: kind})
	if err != nil {
		return !apimeta.IsNoMatchError(err)
	}
	owner := &metav1.PartialObjectMetadata{}
	owner.SetGroupVersionKind(mapping.GroupVersionKind)
	reader := r.APIReader
	if reader == nil {
		reader = r.Client
	}
	if err := reader.Get(ctx, key, owner); err != nil {
		return !apierrors.IsNotFound(err)
	}
	return string(owner.GetUID()) == uid
}
