package release

import (
	"context"
	"fmt"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/dynamic"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/chartpilot/chartpilot/internal/values"
)

// driftedObject is one object of a release that differs from the manifest.
type driftedObject struct {
	desired *unstructured.Unstructured
	missing bool
	field   string
}

func (d driftedObject) String() string {
	ref := d.desired.GetKind() + "/" + d.desired.GetName()
	if d.desired.GetNamespace() != "" {
		ref = d.desired.GetKind() + "/" + d.desired.GetNamespace() + "/" + d.desired.GetName()
	}
	if d.missing {
		return ref + " (deleted)"
	}
	return ref + " (" + d.field + ")"
}

// resourceFor maps an object of a release to a dynamic client that acts as
// identity, defaulting the namespace; an object outside the release's scope
// is a *helm.ScopeError.
func (r *Reconciler) resourceFor(identity, namespace string, obj *unstructured.Unstructured) (dynamic.ResourceInterface, error) {
	m, err := r.Helm.RESTMapper().RESTMapping(obj.GroupVersionKind().GroupKind(), obj.GroupVersionKind().Version)
	if err != nil {
		return nil, err
	}
	namespaced := m.Scope.Name() == apimeta.RESTScopeNameNamespace
	if namespaced && obj.GetNamespace() == "" {
		obj.SetNamespace(namespace)
	}
	if err := r.scope(namespace).Check(m.GroupVersionKind, obj.GetName(), obj.GetNamespace(), namespaced); err != nil {
		return nil, err
	}
	dyn, err := r.dynamicAs(identity)
	if err != nil {
		return nil, err
	}
	if !namespaced {
		return dyn.Resource(m.Resource), nil
	}
	return dyn.Resource(m.Resource).Namespace(obj.GetNamespace()), nil
}

// eachLiveObject reads every object of a manifest and calls f with the
// object the chart wants, the live one (nil when it does not exist), and
// whether (and where first) the live one differs from what the chart sets
// (objectDiffers, against the object as the API server keeps it). Objects
// come from the informer cache of the release's objects; only one the
// cache does not hold (not yet seen, or its release label removed) is read
// from the API server, as the release's identity. Drift correction and the
// health gate both read through it.
func (r *Reconciler) eachLiveObject(ctx context.Context, identity, namespace, manifest string, f func(want, live *unstructured.Unstructured, field string, differs bool)) error {
	m, err := loadManifest(manifest)
	if err != nil {
		return err
	}
	stored := m.storedForms()
	for i, want := range m.objs {
		ri, err := r.resourceFor(identity, namespace, want)
		if err != nil {
			return fmt.Errorf("%s %s: %w", want.GetKind(), want.GetName(), err)
		}
		var live *unstructured.Unstructured
		if r.deps != nil {
			cached := &unstructured.Unstructured{}
			cached.SetGroupVersionKind(want.GroupVersionKind())
			if err := r.deps.cache.Get(ctx, client.ObjectKey{Namespace: want.GetNamespace(), Name: want.GetName()}, cached); err == nil {
				live = cached
			}
		}
		if live == nil {
			got, err := ri.Get(ctx, want.GetName(), metav1.GetOptions{})
			switch {
			case apierrors.IsNotFound(err):
				f(want, nil, "", false)
				continue
			case err != nil:
				return fmt.Errorf("reading %s %s: %w", want.GetKind(), want.GetName(), err)
			}
			live = got
		}
		field, differs := objectDiffers(want.Object, stored[i], live.Object)
		if differs && absentAt(live.Object, field) {
			// A field the chart sets that the live object lacks may be one
			// this API server drops (a feature gate it has off, as an older
			// minor does): its own dry run of the object says.
			if srv, err := m.serverForm(ctx, i, ri); err == nil {
				field, differs = objectDiffers(want.Object, srv, live.Object)
			}
		}
		f(want, live, field, differs)
	}
	return nil
}

// findDrift lists the objects of manifest that are missing or differ.
func (r *Reconciler) findDrift(ctx context.Context, identity, namespace, manifest string) ([]driftedObject, error) {
	var out []driftedObject
	err := r.eachLiveObject(ctx, identity, namespace, manifest, func(want, live *unstructured.Unstructured, field string, differs bool) {
		if live == nil {
			out = append(out, driftedObject{desired: want, missing: true})
			return
		}
		if differs {
			out = append(out, driftedObject{desired: want, field: field})
		}
	})
	return out, err
}

// objectDiffers compares what the chart sets with the live object. Fields the
// chart does not set, status, and server-managed metadata are not drift.
// written is the object as the chart rendered it, stored the same as the
// API server keeps it (asStored): a field the server drops on the way in
// (hostNetwork: false, supplementalGroups: [], null) may be absent from the
// live object, but a live value that differs from what the chart wrote
// still counts (hostNetwork turned on). It is the one comparison of the
// two: the health gate (has the cache seen the revision's write?) and
// drift detection (did someone change it since?) both ask it.
func objectDiffers(written, stored, live map[string]any) (string, bool) {
	for k, wv := range written {
		switch k {
		case "status", "apiVersion", "kind":
			continue
		case "metadata":
			wm, _ := wv.(map[string]any)
			sm, _ := stored["metadata"].(map[string]any)
			lm, _ := live["metadata"].(map[string]any)
			for _, f := range []string{"labels", "annotations"} {
				if w, ok := wm[f]; ok {
					if path, d := subsetDiffers(w, sm[f], lm[f], "metadata."+f); d {
						return path, true
					}
				}
			}
			continue
		}
		if path, d := subsetDiffers(wv, stored[k], live[k], k); d {
			return path, true
		}
	}
	return "", false
}

// subsetDiffers reports whether want (as written, and as stored) is not
// contained in live: every map key of want must match in live; lists must
// match element by element; scalars must be equal (numbers by value,
// quantities by amount). A field the server drops (absent from stored) is
// not compared, but for a false that reads back true.
func subsetDiffers(want, stored, live any, path string) (string, bool) {
	if stored == nil && want != nil {
		// Dropped by the server on the way in: the live value is absent
		// or a default it filled in (schedulerName: "" reads back as
		// default-scheduler). An omitted false has no other default, so
		// a true there was set by someone.
		if b, ok := want.(bool); ok && !b && live != nil && live != false {
			return path, true
		}
		return "", false
	}
	switch w := want.(type) {
	case map[string]any:
		l, ok := live.(map[string]any)
		if !ok {
			if len(w) == 0 && live == nil {
				return "", false
			}
			return path, true
		}
		s, _ := stored.(map[string]any)
		for k, wv := range w {
			if p, d := subsetDiffers(wv, s[k], l[k], path+"."+k); d {
				return p, true
			}
		}
		return "", false
	case []any:
		l, ok := live.([]any)
		if !ok {
			if len(w) == 0 && live == nil {
				return "", false
			}
			return path, true
		}
		if len(l) != len(w) {
			return path, true
		}
		s, _ := stored.([]any)
		for i := range w {
			si := w[i]
			if len(s) == len(w) {
				si = s[i]
			}
			if p, d := subsetDiffers(w[i], si, l[i], fmt.Sprintf("%s[%d]", path, i)); d {
				return p, true
			}
		}
		return "", false
	case nil:
		return "", false
	default:
		if scalarEqual(want, live) || (stored != nil && scalarEqual(stored, live)) {
			return "", false
		}
		return path, true
	}
}

func scalarEqual(a, b any) bool {
	if a == b {
		return true
	}
	if fa, ok := values.Number(a); ok {
		if fb, ok := values.Number(b); ok {
			return fa == fb
		}
	}
	sa, aok := a.(string)
	sb, bok := b.(string)
	if aok && bok {
		qa, errA := resource.ParseQuantity(sa)
		qb, errB := resource.ParseQuantity(sb)
		return errA == nil && errB == nil && qa.Cmp(qb) == 0
	}
	// A quantity written as a number in the chart, a string in the cluster.
	if aok != bok {
		if fa, ok := values.Number(a); ok && bok {
			q, err := resource.ParseQuantity(sb)
			return err == nil && q.AsApproximateFloat64() == fa
		}
		if fb, ok := values.Number(b); ok && aok {
			q, err := resource.ParseQuantity(sa)
			return err == nil && q.AsApproximateFloat64() == fb
		}
	}
	return false
}
