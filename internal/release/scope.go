package release

import (
	"errors"

	apimeta "k8s.io/apimachinery/pkg/api/meta"

	"github.com/chartpilot/chartpilot/internal/helm"
)

// scope is where the objects of the resource's release may be.
func (r *Reconciler) scope(namespace string) helm.Scope {
	return helm.Scope{Namespace: namespace, ClusterKinds: r.Watch.AllowClusterScoped}
}

// checkScope returns a *helm.ScopeError for the first object of the
// manifests (stored release records, which anyone who may write Secrets in
// the namespace can edit) that lies outside the release's scope. Nothing is
// read or written for such a release: every action would act on that object.
func (r *Reconciler) checkScope(namespace string, manifests ...string) error {
	scope := r.scope(namespace)
	for _, m := range manifests {
		objs, err := parseManifest(m)
		if err != nil {
			return err
		}
		for _, o := range objs {
			gvk := o.GroupVersionKind()
			mapping, err := r.Helm.RESTMapper().RESTMapping(gvk.GroupKind(), gvk.Version)
			if err != nil {
				continue // an unknown kind cannot be acted on either
			}
			if err := scope.Check(gvk, o.GetName(), o.GetNamespace(), mapping.Scope.Name() == apimeta.RESTScopeNameNamespace); err != nil {
				return err
			}
		}
	}
	return nil
}

// renderStallReason is the Stalled reason of an action that failed before
// anything was applied.
func renderStallReason(err error) string {
	var se *helm.ScopeError
	if errors.As(err, &se) {
		return "ObjectOutOfScope"
	}
	var tl *helm.RecordTooLargeError
	if errors.As(err, &tl) {
		return "ReleaseTooLarge"
	}
	return "RenderFailed"
}

// tooLarge reports whether an action failed because its release record
// would not fit in a Secret (nothing was stored or applied).
func tooLarge(err error) bool {
	var tl *helm.RecordTooLargeError
	return errors.As(err, &tl)
}

// stallOutOfScope stalls the resource when err says its release holds an
// object outside its scope (an edited release record): nothing is read or
// changed outside the namespace.
func (r *Reconciler) stallOutOfScope(p *pass, err error) bool {
	var se *helm.ScopeError
	if !errors.As(err, &se) {
		return false
	}
	reporter{r}.stall(p, "ObjectOutOfScope", "the stored release names an object outside its scope: "+se.Error())
	return true
}

// stallUntrusted stalls the resource when its stored release cannot be
// acted on: an object outside its scope, a record over the size limit or
// one that does not decode. No action follows.
func (r *Reconciler) stallUntrusted(p *pass, err error) bool {
	if err == nil || r.stallOutOfScope(p, err) {
		return err != nil
	}
	var re *helm.RecordError
	if !errors.As(err, &re) {
		return false // reaching the API server failed: retried
	}
	switch {
	case re.TooLarge:
		reporter{r}.stall(p, "ReleaseRecordTooLarge", re.Error()+"; nothing was changed: delete that Secret if it is not a release chartpilot made")
	case re.Invalid:
		reporter{r}.stall(p, "ReleaseRecordInvalid", oneLine(re.Error())+"; nothing was changed")
	default:
		reporter{r}.stall(p, "UntrustedReleaseRecord", re.Error()+"; nothing was changed")
	}
	return true
}

// manifestsOf are the stored manifests an action may act on: the newest
// revision's and the rollback target's.
func manifestsOf(o Observation) []string {
	out := []string{}
	if o.Latest != nil {
		out = append(out, o.Latest.Manifest)
	}
	if o.LastGood != nil && o.LastGood != o.Latest {
		out = append(out, o.LastGood.Manifest)
	}
	return out
}
