package release

import (
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"

	"github.com/chartpilot/chartpilot/internal/api/v1alpha1"
)

// finalize is the Uninstall action of a resource being deleted: its
// release is uninstalled, then the finalizer removed. A resource whose
// release was never installed goes at once; a release that is not its own
// is never touched.
func (r *Reconciler) finalize(ctx context.Context, p *pass) (ctrl.Result, error) {
	if !controllerutil.ContainsFinalizer(p.obj, v1alpha1.Finalizer) {
		return ctrl.Result{}, nil
	}
	history, err := r.Helm.History(p.key.Namespace, p.key.Name)
	if err != nil {
		return ctrl.Result{}, err
	}
	switch o := observe(history, string(p.obj.GetUID()), "", p.obj.GetAnnotations()[v1alpha1.AnnotationAdopt] == "true"); o.State {
	case StateAbsent, StateUnmanaged, StateConflict:
		// Nothing of ours to remove; never touch someone else's release.
	default:
		_, err := timed("uninstall", func() (struct{}, error) {
			return struct{}{}, r.Helm.Uninstall(p.key.Namespace, p.key.Name, r.Watch.Timeout)
		})
		if err != nil {
			msg := "Uninstall failed: " + oneLine(err.Error())
			r.Recorder.Event(p.obj, corev1.EventTypeWarning, "UninstallFailed", msg)
			setCondition(p.status, p.obj, v1alpha1.ConditionReconciling, metav1.ConditionTrue, "UninstallFailed", msg)
			return ctrl.Result{RequeueAfter: backoffBase}, nil
		}
		r.Recorder.Event(p.obj, corev1.EventTypeNormal, "Uninstalled", fmt.Sprintf("uninstalled release %s", p.key.Name))
	}
	patch := client.MergeFromWithOptions(p.obj.DeepCopy(), client.MergeFromWithOptimisticLock{})
	controllerutil.RemoveFinalizer(p.obj, v1alpha1.Finalizer)
	if err := r.Client.Patch(ctx, p.obj, patch); err != nil {
		return ctrl.Result{}, fmt.Errorf("removing finalizer: %w", err)
	}
	r.forget(p.key)
	return ctrl.Result{}, nil
}
