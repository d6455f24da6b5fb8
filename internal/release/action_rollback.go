package release

import (
	"context"
	"errors"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ctrl "sigs.k8s.io/controller-runtime"

	"github.com/chartpilot/chartpilot/internal/api/v1alpha1"
)

// rollbackStep is the Rollback action.
type rollbackStep struct{}

var _ = registerStep(actRollback, rollbackStep{})

func (s rollbackStep) full(ctx context.Context, r *Reconciler, f *fullPass) (ctrl.Result, bool, error) {
	res, err := s.run(ctx, r, f.p, f.d, f.o)
	return res, false, err
}

// run is the Rollback action after a failed upgrade.
func (rollbackStep) run(ctx context.Context, r *Reconciler, p *pass, d *desired, o Observation) (ctrl.Result, error) {
	target := o.LastGood
	_, err := timed(ctx, "rollback", func() (struct{}, error) {
		return struct{}{}, r.Helm.As(d.identity).Rollback(r.scope(p.key.Namespace), p.key.Name, target.Revision, r.Watch.Timeout, r.Watch.MaxHistory)
	})
	if err != nil {
		if errors.Is(err, errStopping) {
			return ctrl.Result{}, err // nothing begun: the next pass acts
		}
		msg := fmt.Sprintf("Rollback to revision %d failed: %s", target.Revision, oneLine(err.Error()))
		r.event(p, corev1.EventTypeWarning, "RollbackFailed", msg)
		setCondition(p.status, p.obj, v1alpha1.ConditionReleased, metav1.ConditionFalse, "RollbackFailed", msg)
		reporter{r}.recordHistory(p, d.digest, "Rollback", target, false, msg)
		return ctrl.Result{RequeueAfter: r.mem.retryAfter(p.key, "Rollback")}, nil
	}
	r.mem.retried(p.key, "Rollback")
	failure := "the upgrade failed"
	if p.status.LastFailure != nil {
		failure = p.status.LastFailure.Message
	}
	msg := fmt.Sprintf("rolled back to revision %d (chart %s) after: %s", target.Revision, target.ChartVersion, failure)
	if failedVersion := o.Latest.ChartVersion; failedVersion != target.ChartVersion {
		// This chart version is not retried for this resource until its
		// inputs change or a reconcile is requested; canaries halt rollouts by it.
		if p.status.Chart == nil {
			p.status.Chart = &v1alpha1.ChartStatus{Name: o.Latest.ChartName}
		}
		p.status.Chart.FailedVersion = failedVersion
		rolloutUpgrades.WithLabelValues(r.Watch.GVK.Kind, failedVersion, rolloutResultRollback).Inc()
	}
	r.event(p, corev1.EventTypeNormal, "RolledBack", msg)
	p.log.Info("Rolled back", "revision", target.Revision)
	if hist, err := r.Helm.History(p.key.Namespace, p.key.Name); err == nil && len(hist) > 0 {
		reporter{r}.setReleaseInfo(p, hist[len(hist)-1])
	}
	reporter{r}.recordHistory(p, d.digest, "Rollback", target, true, msg)
	// Released stays False: what runs is not what the resource asks for.
	setCondition(p.status, p.obj, v1alpha1.ConditionReleased, metav1.ConditionFalse, "UpgradeFailed", msg)
	return ctrl.Result{RequeueAfter: time.Second}, nil
}
