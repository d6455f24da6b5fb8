package release

import (
	"context"
	"fmt"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ctrl "sigs.k8s.io/controller-runtime"

	"github.com/chartpilot/chartpilot/internal/api/v1alpha1"
)

// unlockStep is the Unlock action.
type unlockStep struct{}

var _ = registerStep(actUnlock, unlockStep{})

func (s unlockStep) full(ctx context.Context, r *Reconciler, f *fullPass) (ctrl.Result, bool, error) {
	if err := commit(ctx); err != nil {
		return ctrl.Result{}, false, err
	}
	res, err := s.run(r, f.p, f.d, f.o)
	return res, false, err
}

// run is the Unlock action: a revision left pending-* by a process that
// died mid-action is dropped (its record deleted), so that the next pass
// runs the action again as a revision of the same number, taking over the
// objects the interrupted one made (they carry the release's ownership).
// The history keeps one revision per inputs; nothing is uninstalled.
// nextAction chooses it only when the revision's holder is gone (lockLive).
func (unlockStep) run(r *Reconciler, p *pass, d *desired, o Observation) (ctrl.Result, error) {
	action := strings.TrimPrefix(string(o.Latest.Status), "pending-")
	if err := r.Helm.As(d.identity).DeleteRevision(p.key.Namespace, p.key.Name, o.Latest.Revision); err != nil {
		return ctrl.Result{}, fmt.Errorf("unlocking release: %w", err)
	}
	msg := fmt.Sprintf("revision %d was left %s by an interrupted %s; dropped it to do the %s again", o.Latest.Revision, o.Latest.Status, action, action)
	r.event(p, corev1.EventTypeNormal, "Unlocked", msg)
	reporter{r}.recordHistory(p, d.digest, "Unlock", o.Latest, true, msg)
	setCondition(p.status, p.obj, v1alpha1.ConditionReconciling, metav1.ConditionTrue, "Unlocked", msg)
	return ctrl.Result{RequeueAfter: 100 * time.Millisecond}, nil
}
