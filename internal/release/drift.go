package release

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"
	ctrl "sigs.k8s.io/controller-runtime"

	"github.com/chartpilot/chartpilot/internal/api/v1alpha1"
	"github.com/chartpilot/chartpilot/internal/helm"
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

// correctDrift is the CorrectDrift action: every object of the deployed
// manifest is compared with the cluster; deleted objects are created again
// and changed fields set back, without a new Helm revision.
func (r *Reconciler) correctDrift(ctx context.Context, p *pass, o Observation) (ctrl.Result, error) {
	drifted, err := r.findDrift(ctx, p.key.Namespace, o.Latest.Manifest)
	if err != nil {
		return ctrl.Result{}, fmt.Errorf("checking drift: %w", err)
	}
	if len(drifted) == 0 {
		driftChecks.WithLabelValues(r.Watch.GVK.Kind, "none").Inc()
		if c := apimeta.FindStatusCondition(p.status.Conditions, v1alpha1.ConditionDrifted); c != nil && c.Status == metav1.ConditionTrue {
			setCondition(p.status, p.obj, v1alpha1.ConditionDrifted, metav1.ConditionFalse, "NoDrift", "every object matches the release")
		}
		r.markInSync(p, o.Latest)
		return ctrl.Result{RequeueAfter: r.Watch.ReconcilePeriod}, nil
	}
	names := make([]string, 0, len(drifted))
	for _, d := range drifted {
		names = append(names, d.String())
	}
	setCondition(p.status, p.obj, v1alpha1.ConditionDrifted, metav1.ConditionTrue, "DriftDetected", "changed outside the release: "+strings.Join(names, ", "))
	var failures []string
	for _, d := range drifted {
		if err := r.restore(ctx, p.key.Namespace, d); err != nil {
			failures = append(failures, fmt.Sprintf("%s: %s", d, oneLine(err.Error())))
			continue
		}
		r.Recorder.Event(p.obj, corev1.EventTypeNormal, "DriftCorrected", "restored "+d.String())
		p.log.Info("Corrected drift", "object", d.String())
	}
	if len(failures) > 0 {
		driftChecks.WithLabelValues(r.Watch.GVK.Kind, "failed").Inc()
		msg := "could not restore " + strings.Join(failures, "; ")
		r.Recorder.Event(p.obj, corev1.EventTypeWarning, "DriftCorrectionFailed", msg)
		setCondition(p.status, p.obj, v1alpha1.ConditionDrifted, metav1.ConditionTrue, "DriftCorrectionFailed", msg)
		r.recordHistory(p, "CorrectDrift", o.Latest, false, msg)
		summarise(p.status, p.obj)
		r.flagDrift(p.key)
		return ctrl.Result{RequeueAfter: backoffBase}, nil
	}
	driftChecks.WithLabelValues(r.Watch.GVK.Kind, "corrected").Inc()
	msg := "restored " + strings.Join(names, ", ")
	setCondition(p.status, p.obj, v1alpha1.ConditionDrifted, metav1.ConditionFalse, "DriftCorrected", msg)
	r.recordHistory(p, "CorrectDrift", o.Latest, true, msg)
	r.markInSync(p, o.Latest)
	return ctrl.Result{RequeueAfter: r.Watch.ReconcilePeriod}, nil
}

// resourceFor maps an object to its dynamic client, defaulting the namespace.
func (r *Reconciler) resourceFor(namespace string, obj *unstructured.Unstructured) (dynamic.ResourceInterface, error) {
	m, err := r.Helm.RESTMapper().RESTMapping(obj.GroupVersionKind().GroupKind(), obj.GroupVersionKind().Version)
	if err != nil {
		return nil, err
	}
	if m.Scope.Name() != apimeta.RESTScopeNameNamespace {
		return r.Dynamic.Resource(m.Resource), nil
	}
	ns := obj.GetNamespace()
	if ns == "" {
		ns = namespace
		obj.SetNamespace(ns)
	}
	return r.Dynamic.Resource(m.Resource).Namespace(ns), nil
}

// findDrift lists the objects of manifest that are missing or differ.
func (r *Reconciler) findDrift(ctx context.Context, namespace, manifest string) ([]driftedObject, error) {
	objs, err := helm.ParseManifest(manifest)
	if err != nil {
		return nil, err
	}
	var out []driftedObject
	for _, want := range objs {
		ri, err := r.resourceFor(namespace, want)
		if err != nil {
			return nil, fmt.Errorf("%s %s: %w", want.GetKind(), want.GetName(), err)
		}
		live, err := ri.Get(ctx, want.GetName(), metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			out = append(out, driftedObject{desired: want, missing: true})
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("reading %s %s: %w", want.GetKind(), want.GetName(), err)
		}
		if field, differs := objectDiffers(want.Object, live.Object); differs {
			out = append(out, driftedObject{desired: want, field: field})
		}
	}
	return out, nil
}

// objectDiffers compares what the chart sets with the live object. Fields the
// chart does not set, status, and server-managed metadata are not drift.
func objectDiffers(want, live map[string]any) (string, bool) {
	for k, wv := range want {
		switch k {
		case "status", "apiVersion", "kind":
			continue
		case "metadata":
			wm, _ := wv.(map[string]any)
			lm, _ := live["metadata"].(map[string]any)
			for _, f := range []string{"labels", "annotations"} {
				if w, ok := wm[f]; ok {
					if path, d := subsetDiffers(w, lm[f], "metadata."+f); d {
						return path, true
					}
				}
			}
			continue
		}
		if path, d := subsetDiffers(wv, live[k], k); d {
			return path, true
		}
	}
	return "", false
}

// subsetDiffers reports whether want is not contained in live: every map key
// of want must match in live; lists must match element by element; scalars
// must be equal (numbers by value, quantities by amount).
func subsetDiffers(want, live any, path string) (string, bool) {
	switch w := want.(type) {
	case map[string]any:
		l, ok := live.(map[string]any)
		if !ok {
			if len(w) == 0 && live == nil {
				return "", false
			}
			return path, true
		}
		for k, wv := range w {
			if p, d := subsetDiffers(wv, l[k], path+"."+k); d {
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
		for i := range w {
			if p, d := subsetDiffers(w[i], l[i], fmt.Sprintf("%s[%d]", path, i)); d {
				return p, true
			}
		}
		return "", false
	case nil:
		return "", false
	default:
		if scalarEqual(want, live) {
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

// restore creates a deleted object or sets the chart's fields back on a changed one.
func (r *Reconciler) restore(ctx context.Context, namespace string, d driftedObject) error {
	ri, err := r.resourceFor(namespace, d.desired)
	if err != nil {
		return err
	}
	obj := d.desired.DeepCopy()
	delete(obj.Object, "status")
	if d.missing {
		_, err := ri.Create(ctx, obj, metav1.CreateOptions{FieldManager: "chartpilot"})
		if apierrors.IsAlreadyExists(err) {
			return nil // someone (a controller) recreated it; the next event checks it
		}
		return err
	}
	body, err := json.Marshal(obj.Object)
	if err != nil {
		return err
	}
	_, err = ri.Patch(ctx, obj.GetName(), types.MergePatchType, body, metav1.PatchOptions{FieldManager: "chartpilot"})
	return err
}
