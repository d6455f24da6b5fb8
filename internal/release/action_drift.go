package release

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"

	"github.com/chartpilot/chartpilot/internal/api/v1alpha1"
)

// correctDriftStep is the CorrectDrift action.
type correctDriftStep struct{}

var _ = registerStep(actCorrectDrift, correctDriftStep{})

func (s correctDriftStep) full(ctx context.Context, r *Reconciler, f *fullPass) (ctrl.Result, bool, error) {
	res, err := s.run(ctx, r, f.p, f.d, f.o)
	return res, false, err
}

// run is the CorrectDrift action: every object of the deployed
// manifest is compared with the cluster; deleted objects are created again
// and changed fields set back, without a new Helm revision.
func (correctDriftStep) run(ctx context.Context, r *Reconciler, p *pass, d *desired, o Observation) (ctrl.Result, error) {
	drifted, err := r.findDrift(ctx, d.identity, p.key.Namespace, o.Latest.Manifest)
	if r.stallOutOfScope(p, err) {
		return ctrl.Result{}, nil
	}
	if err != nil {
		return ctrl.Result{}, fmt.Errorf("checking drift: %w", err)
	}
	if len(drifted) == 0 {
		driftChecks.WithLabelValues(r.Watch.GVK.Kind, "none").Inc()
		if c := apimeta.FindStatusCondition(p.status.Conditions, v1alpha1.ConditionDrifted); c != nil && c.Status == metav1.ConditionTrue {
			setCondition(p.status, p.obj, v1alpha1.ConditionDrifted, metav1.ConditionFalse, "NoDrift", "every object matches the release")
		}
		reporter{r}.markInSync(p, d, o.Latest)
		return ctrl.Result{RequeueAfter: r.Watch.ReconcilePeriod}, nil
	}
	names := make([]string, 0, len(drifted))
	for _, obj := range drifted {
		names = append(names, obj.String())
	}
	setCondition(p.status, p.obj, v1alpha1.ConditionDrifted, metav1.ConditionTrue, "DriftDetected", "changed outside the release: "+strings.Join(names, ", "))
	var failures []string
	for _, obj := range drifted {
		if err := r.restore(ctx, d.identity, p.key.Namespace, obj); err != nil {
			failures = append(failures, fmt.Sprintf("%s: %s", obj, oneLine(err.Error())))
			continue
		}
		r.event(p, corev1.EventTypeNormal, "DriftCorrected", "restored "+obj.String())
		p.log.Info("Corrected drift", "object", obj.String())
	}
	if len(failures) > 0 {
		driftChecks.WithLabelValues(r.Watch.GVK.Kind, "failed").Inc()
		msg := "could not restore " + strings.Join(failures, "; ")
		r.event(p, corev1.EventTypeWarning, "DriftCorrectionFailed", msg)
		setCondition(p.status, p.obj, v1alpha1.ConditionDrifted, metav1.ConditionTrue, "DriftCorrectionFailed", msg)
		reporter{r}.recordHistory(p, d.digest, "CorrectDrift", o.Latest, false, msg)
		r.mem.with(p.key, func(m *memo) { m.driftDue = true })
		return ctrl.Result{RequeueAfter: backoffBase}, nil
	}
	driftChecks.WithLabelValues(r.Watch.GVK.Kind, "corrected").Inc()
	msg := "restored " + strings.Join(names, ", ")
	setCondition(p.status, p.obj, v1alpha1.ConditionDrifted, metav1.ConditionFalse, "DriftCorrected", msg)
	reporter{r}.recordHistory(p, d.digest, "CorrectDrift", o.Latest, true, msg)
	reporter{r}.markInSync(p, d, o.Latest)
	return ctrl.Result{RequeueAfter: r.Watch.ReconcilePeriod}, nil
}

// cached checks for drift from the caches: when nothing changed, the
// check is done and the pass chooses again (nothing).
func (s correctDriftStep) cached(ctx context.Context, r *Reconciler, p *pass, d *desired, v *cacheView) (ctrl.Result, bool, bool) {
	res, clean, done := s.fromCaches(ctx, r, p, d, v)
	if clean {
		v.c.gates.driftDue = false
	}
	return res, clean, done
}

// fromCaches compares the release's objects with the caches: clean
// when nothing changed. A difference is looked at again in a second
// (done), because the cache may show one object of a release's own change
// before another; one that stays, or anything it cannot read, goes to the
// full pass, which corrects it (neither clean nor done).
func (correctDriftStep) fromCaches(ctx context.Context, r *Reconciler, p *pass, d *desired, v *cacheView) (res ctrl.Result, clean, done bool) {
	if !r.cachedBody(ctx, p, d, v) {
		return ctrl.Result{}, false, false
	}
	drifted, err := r.findDrift(ctx, d.identity, p.key.Namespace, v.body.Manifest)
	if err != nil {
		return ctrl.Result{}, false, false
	}
	if len(drifted) > 0 {
		again := false
		r.mem.with(p.key, func(m *memo) {
			again = !m.driftRecheck
			m.driftRecheck, m.driftDue = again, again || m.driftDue
		})
		if again {
			return ctrl.Result{RequeueAfter: time.Second}, false, true
		}
		return ctrl.Result{}, false, false
	}
	r.mem.with(p.key, func(m *memo) { m.driftRecheck = false })
	driftChecks.WithLabelValues(r.Watch.GVK.Kind, "none").Inc()
	if c := apimeta.FindStatusCondition(p.status.Conditions, v1alpha1.ConditionDrifted); c != nil && c.Status == metav1.ConditionTrue {
		setCondition(p.status, p.obj, v1alpha1.ConditionDrifted, metav1.ConditionFalse, "NoDrift", "every object matches the release")
	}
	return ctrl.Result{}, true, false
}

// restore creates a deleted object or sets the chart's fields back on a changed one.
func (r *Reconciler) restore(ctx context.Context, identity, namespace string, d driftedObject) error {
	ri, err := r.resourceFor(identity, namespace, d.desired)
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
