package release

import (
	"context"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ctrl "sigs.k8s.io/controller-runtime"

	"github.com/chartpilot/chartpilot/internal/api/v1alpha1"
)

// cleanupStep is the Cleanup action.
type cleanupStep struct{}

var _ = registerStep(actCleanup, cleanupStep{})

func (s cleanupStep) full(ctx context.Context, r *Reconciler, f *fullPass) (ctrl.Result, bool, error) {
	res, err := s.run(ctx, r, f.p, f.d, f.o)
	return res, false, err
}

// run uninstalls a release that never deployed (failed,
// interrupted, or caught mid-uninstall), so that Install can start again
// from nothing. nextAction has already waited out the back-off.
func (cleanupStep) run(ctx context.Context, r *Reconciler, p *pass, d *desired, o Observation) (ctrl.Result, error) {
	_, err := timed(ctx, "uninstall", func() (struct{}, error) {
		return struct{}{}, r.Helm.As(d.identity).Uninstall(r.scope(p.key.Namespace), p.key.Name, r.Watch.Timeout)
	})
	if err != nil {
		return ctrl.Result{}, fmt.Errorf("cleaning up failed install: %w", err)
	}
	msg := fmt.Sprintf("removed revision %d (%s) that never deployed, to install again", o.Latest.Revision, o.Latest.Status)
	r.event(p, corev1.EventTypeNormal, "FailedInstallRemoved", msg)
	reporter{r}.recordHistory(p, d.digest, "Uninstall", o.Latest, true, msg)
	setCondition(p.status, p.obj, v1alpha1.ConditionReconciling, metav1.ConditionTrue, "Reinstalling", msg)
	return ctrl.Result{RequeueAfter: 100 * time.Millisecond}, nil
}
