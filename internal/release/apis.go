package release

import (
	"fmt"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"

	"github.com/chartpilot/chartpilot/internal/api/v1alpha1"
	"github.com/chartpilot/chartpilot/internal/helm"
	"github.com/chartpilot/chartpilot/internal/kubeapis"
)

// maxDeprecatedAPIs bounds status.deprecatedAPIs (its schema's maxItems).
const maxDeprecatedAPIs = 32

// apiSeries is one chartpilot_release_deprecated_api_objects series of a
// resource: API version, kind and the minor that removes it.
type apiSeries [3]string

// deprecatedAPIs checks the kinds of rel's manifest (the deployed revision
// status.release shows) against the minors that remove their API versions
// and against what the cluster serves: status.deprecatedAPIs, the
// DeprecatedAPIs condition (True while any is due: not served, deprecated
// on this cluster's minor, or removed by the next), a Warning event when
// what is due changes, and a metric series per kind.
func (r reporter) deprecatedAPIs(p *pass, rel *helm.Release) {
	if rel == nil || rel.Unread || r.Helm == nil || rel.Status != helm.StatusDeployed {
		// Only a deployed revision's manifest is what Helm builds the
		// objects of before its next action (a failed attempt's is not).
		return
	}
	objs, err := parseManifest(rel.Manifest)
	if err != nil {
		return // the scope check reports a manifest that does not parse
	}
	gvks := make([]schema.GroupVersionKind, len(objs))
	for i, o := range objs {
		gvks[i] = o.GroupVersionKind()
	}
	uses := kubeapis.Uses(gvks, r.Helm.Served)
	if len(uses) > maxDeprecatedAPIs {
		uses = uses[:maxDeprecatedAPIs]
	}
	st := make([]v1alpha1.DeprecatedAPI, len(uses))
	for i, u := range uses {
		st[i] = apiStatus(u)
	}
	if len(st) == 0 {
		st = nil
	}
	p.status.DeprecatedAPIs = st
	r.setAPISeries(p.key, uses)

	minor := r.Helm.KubeMinor()
	if minor == 0 {
		return // the cluster's version unread for now: the condition stays as it was
	}
	var due []string
	for _, u := range uses {
		if u.Due(minor) {
			due = append(due, u.Describe())
		}
	}
	prev := apimeta.FindStatusCondition(p.orig.Conditions, v1alpha1.ConditionDeprecatedAPIs)
	if len(due) == 0 {
		apimeta.RemoveStatusCondition(&p.status.Conditions, v1alpha1.ConditionDeprecatedAPIs)
		return
	}
	reason := "DeprecatedAPIs"
	for _, u := range uses {
		if !u.Served {
			reason = "APINotServed"
		}
	}
	msg := fmt.Sprintf("revision %d of the release uses API versions that Kubernetes removes (this cluster is Kubernetes %s): %s", rel.Revision, minor, strings.Join(due, "; "))
	setCondition(p.status, p.obj, v1alpha1.ConditionDeprecatedAPIs, metav1.ConditionTrue, reason, msg)
	if prev == nil || prev.Message != msg {
		r.event(p, corev1.EventTypeWarning, reason, msg)
	}
}

// apiStatus is how status.deprecatedAPIs shows u.
func apiStatus(u kubeapis.Use) v1alpha1.DeprecatedAPI {
	a := v1alpha1.DeprecatedAPI{
		APIVersion: u.APIVersion(), Kind: u.Kind, Objects: int32(min(u.Objects, 1<<30)),
		DeprecatedIn: u.Deprecated.String(), RemovedIn: u.Removed.String(),
		Replacement: u.ReplacementAPIVersion(), Served: u.Served,
	}
	if a.Replacement != "" && u.Replacement.Kind != u.Kind {
		a.ReplacementKind = u.Replacement.Kind
	}
	return a
}

// setAPISeries makes key's chartpilot_release_deprecated_api_objects
// series those of uses, replacing the ones this process set before.
func (r reporter) setAPISeries(key types.NamespacedName, uses []kubeapis.Use) {
	want := make(map[apiSeries]int, len(uses))
	for _, u := range uses {
		want[apiSeries{u.APIVersion(), u.Kind, u.Removed.String()}] = u.Objects
	}
	var had map[apiSeries]int
	r.mem.with(key, func(m *memo) {
		had = m.apiSeries
		if len(want) == 0 {
			m.apiSeries = nil
		} else {
			m.apiSeries = want
		}
	})
	if equality.Semantic.DeepEqual(had, want) || (len(had) == 0 && len(want) == 0) {
		return
	}
	kind := r.Watch.GVK.Kind
	for s := range had {
		if _, ok := want[s]; !ok {
			deprecatedAPIObjects.DeleteLabelValues(kind, key.Namespace, key.Name, s[0], s[1], s[2])
		}
	}
	for s, n := range want {
		deprecatedAPIObjects.WithLabelValues(kind, key.Namespace, key.Name, s[0], s[1], s[2]).Set(float64(n))
	}
}

// namesRemovedAPIs reports whether manifest names a built-in API version
// the cluster no longer serves.
func (r *Reconciler) namesRemovedAPIs(manifest string) bool {
	objs, err := parseManifest(manifest)
	if err != nil {
		return false
	}
	for _, o := range objs {
		gvk := o.GroupVersionKind()
		if _, ok := kubeapis.Lookup(gvk); ok && !r.Helm.Served(gvk) {
			return true
		}
	}
	return false
}
