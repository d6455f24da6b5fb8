package release

import (
	"context"
	"strings"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/chartpilot/chartpilot/internal/api/v1alpha1"
	"github.com/chartpilot/chartpilot/internal/helm"
)

// actionOptions are the Helm inputs of install and upgrade.
func (r *Reconciler) actionOptions(p *pass, d *desired, description string) helm.ActionOptions {
	labels := r.Holder.labels(r.now())
	for k, v := range map[string]string{
		v1alpha1.LabelOwnerUID:     string(p.obj.GetUID()),
		v1alpha1.LabelOwnerKind:    r.ownerKind(),
		v1alpha1.LabelDigest:       d.digest,
		v1alpha1.LabelForceToken:   labelSafe(d.force),
		v1alpha1.LabelRequestedAt:  p.requested,
		v1alpha1.LabelChartVersion: labelSafe(d.chart.Version),
		v1alpha1.LabelAppMajor:     labelSafe(d.appMajor),
	} {
		labels[k] = v
	}
	return helm.ActionOptions{
		Namespace:    p.key.Namespace,
		Name:         p.key.Name,
		Values:       d.vals,
		Labels:       labels,
		Decorate:     r.decorator(p.obj),
		Timeout:      r.Watch.Timeout,
		MaxHistory:   r.Watch.MaxHistory,
		Description:  description,
		ClusterKinds: r.Watch.AllowClusterScoped,
	}
}

// labelSafe makes an annotation value usable as a label value (or empty).
func labelSafe(s string) string {
	out := make([]rune, 0, len(s))
	for _, c := range s {
		if (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' || c == '_' || c == '.' {
			out = append(out, c)
		}
	}
	if len(out) > 63 {
		out = out[len(out)-63:]
	}
	return strings.Trim(string(out), "-_.")
}

// decorator labels every object of the release so that dependent informers
// can select exactly chartpilot's objects, records the owner in an
// annotation (the only way for cluster-scoped and cross-namespace objects),
// and adds an owner reference where Kubernetes allows one.
func (r *Reconciler) decorator(owner *unstructured.Unstructured) helm.Decorator {
	noBlock := false
	ownerRef := metav1.OwnerReference{
		APIVersion:         owner.GetAPIVersion(),
		Kind:               owner.GetKind(),
		Name:               owner.GetName(),
		UID:                owner.GetUID(),
		BlockOwnerDeletion: &noBlock,
	}
	ownerAnn := r.ownerKind() + "/" + owner.GetNamespace() + "/" + owner.GetName()
	return func(obj *unstructured.Unstructured) error {
		labels := obj.GetLabels()
		if labels == nil {
			labels = map[string]string{}
		}
		labels[v1alpha1.LabelRelease] = owner.GetName()
		obj.SetLabels(labels)
		ann := obj.GetAnnotations()
		if ann == nil {
			ann = map[string]string{}
		}
		ann[v1alpha1.AnnotationOwner] = ownerAnn
		obj.SetAnnotations(ann)
		ns := obj.GetNamespace()
		sameNS := ns == "" || ns == owner.GetNamespace()
		// Objects Helm keeps on uninstall (data volumes) never get an owner
		// reference: garbage collection would delete them with the owner.
		keep := strings.Contains(ann["helm.sh/resource-policy"], "keep")
		if !sameNS || keep {
			return nil
		}
		if namespaced, err := r.Helm.IsNamespaced(obj.GroupVersionKind()); err != nil || !namespaced {
			return nil
		}
		refs := obj.GetOwnerReferences()
		for _, ref := range refs {
			if ref.UID == ownerRef.UID {
				return nil
			}
		}
		obj.SetOwnerReferences(append(refs, ownerRef))
		return nil
	}
}

// afterDeploy runs the PostRelease hooks and watches the kinds of the new
// release's objects. A hook's failure is its condition: the release is
// deployed and stays so.
func (r *Reconciler) afterDeploy(ctx context.Context, p *pass, d *desired, rel *helm.Release) {
	for _, h := range r.Hooks {
		if h.PostRelease == nil {
			continue
		}
		if err := h.PostRelease.PostRelease(ctx, d.hobj); err != nil {
			reporter{r}.hookRefused(p, h, err)
		}
	}
	r.watchObjects(ctx, p, rel)
}

// watchObjects watches the kinds of a release's objects (drift and health
// events), when the watch asks for dependent resources.
func (r *Reconciler) watchObjects(ctx context.Context, p *pass, rel *helm.Release) {
	if r.deps == nil || rel == nil {
		return
	}
	if err := r.deps.ensure(ctx, r, rel.Manifest); err != nil {
		p.log.Error(err, "Failed to watch the release's objects")
	}
}
