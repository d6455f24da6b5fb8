package release

import (
	"context"
	"fmt"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ctrl "sigs.k8s.io/controller-runtime"

	"github.com/chartpilot/chartpilot/internal/api/v1alpha1"
	"github.com/chartpilot/chartpilot/internal/helm"
)

// install is the Install action.
func (r *Reconciler) install(ctx context.Context, p *pass, d *desired) (ctrl.Result, error) {
	setCondition(p.status, p.obj, v1alpha1.ConditionReconciling, metav1.ConditionTrue, "Installing", "installing chart "+d.chart.Name+" "+d.chart.Version)
	rel, err := timed("install", func() (*helm.Release, error) {
		return r.Helm.As(d.identity).Install(ctx, d.chart, r.actionOptions(p, d, "Install by chartpilot"))
	})
	if err != nil {
		if helm.IsRecordConflict(err) {
			return ctrl.Result{}, fmt.Errorf("install: %w", err) // retried soon, not a failure of these inputs
		}
		if rel == nil || rel.Revision == 0 || tooLarge(err) {
			// Nothing was stored: the chart did not render or the values
			// were rejected. Retrying the same inputs cannot help.
			res := r.failed(p, d, "Install", "InstallFailed", err, nil)
			r.stall(p, renderStallReason(err), "Install failed before anything was applied: "+oneLine(err.Error()))
			return res, nil
		}
		return r.failed(p, d, "Install", "InstallFailed", err, rel), nil
	}
	r.succeeded(p, d, "Install", "InstallSucceeded", fmt.Sprintf("installed %s %s as revision %d", rel.ChartName, rel.ChartVersion, rel.Revision), rel)
	r.afterDeploy(ctx, p, d, rel)
	return r.awaitHealth(p), nil
}

// awaitHealth leaves a fresh revision Reconciling (not Ready) until the
// health gate has seen its workloads ready.
func (r *Reconciler) awaitHealth(p *pass) ctrl.Result {
	r.mem.with(p.key, func(m *memo) { m.awaiting = true })
	setCondition(p.status, p.obj, v1alpha1.ConditionReconciling, metav1.ConditionTrue, "Progressing", "deployed; waiting for the workloads to become ready")
	return ctrl.Result{RequeueAfter: healthPoll}
}
