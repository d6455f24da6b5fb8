package release

import (
	"context"
	"errors"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"

	"github.com/chartpilot/chartpilot/internal/api/v1alpha1"
	"github.com/chartpilot/chartpilot/internal/helm"
)

// finalize is the Uninstall action of a resource being deleted: its
// release is uninstalled, then the finalizer removed. A resource whose
// release was never installed goes at once; a release that is not its own
// is never touched.
func (r *Reconciler) finalize(ctx context.Context, p *pass) (ctrl.Result, error) {
	if !controllerutil.ContainsFinalizer(p.obj, v1alpha1.Finalizer) {
		return ctrl.Result{}, nil
	}
	// Only the newest record is read: the uninstall deletes its objects,
	// and the older records unread.
	history, err := r.Helm.NewestOfHistory(p.key.Namespace, p.key.Name)
	var re *helm.RecordError
	if err != nil && !errors.As(err, &re) {
		return ctrl.Result{}, err
	}
	switch o := observe(history, string(p.obj.GetUID()), "", r.mayAdopt(ctx, p, history)); {
	case err == nil && (o.State == StateAbsent || o.State == StateUnmanaged || o.State == StateConflict):
		// Nothing of ours to remove; never touch someone else's release.
	default:
		if err == nil {
			err = r.uninstall(ctx, p, o, history)
		}
		if err != nil {
			msg := "Uninstall failed: " + oneLine(err.Error())
			r.event(p, corev1.EventTypeWarning, "UninstallFailed", msg)
			setCondition(p.status, p.obj, v1alpha1.ConditionReconciling, metav1.ConditionTrue, "UninstallFailed", msg)
			return ctrl.Result{RequeueAfter: r.mem.retryAfter(p.key, "Uninstall")}, nil
		}
		r.event(p, corev1.EventTypeNormal, "Uninstalled", fmt.Sprintf("uninstalled release %s", p.key.Name))
	}
	patch := client.MergeFromWithOptions(p.obj.DeepCopy(), client.MergeFromWithOptimisticLock{})
	controllerutil.RemoveFinalizer(p.obj, v1alpha1.Finalizer)
	if err := r.Client.Patch(ctx, p.obj, patch); err != nil {
		return ctrl.Result{}, fmt.Errorf("removing finalizer: %w", err)
	}
	r.forget(p.key)
	return ctrl.Result{}, nil
}

// uninstall removes the resource's release as its identity, unless the
// stored release names objects outside its scope or has records chartpilot
// did not write (then nothing is deleted).
func (r *Reconciler) uninstall(ctx context.Context, p *pass, o Observation, history []*helm.Release) error {
	if err := r.checkScope(p.key.Namespace, manifestsOf(o)...); err != nil {
		return fmt.Errorf("refused, nothing was deleted: %w", err)
	}
	if rec := firstUntrusted(history); rec != nil {
		return fmt.Errorf("refused, nothing was deleted: %s; remove the finalizer %s by hand to let the resource go and leave its objects", distrust(rec), v1alpha1.Finalizer)
	}
	identity, serr := r.identityForDeletion(ctx, p)
	if serr != nil {
		return serr
	}
	if !r.KeepStoredAPIs {
		if err := r.rewriteForUninstall(ctx, p, identity, o.Latest); err != nil {
			return err
		}
	}
	_, err := timed(ctx, "uninstall", func() (struct{}, error) {
		return struct{}{}, r.Helm.As(identity).Purge(r.scope(p.key.Namespace), p.key.Name, r.Watch.Timeout)
	})
	return err
}
