package release

import (
	"context"
	"fmt"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ctrl "sigs.k8s.io/controller-runtime"

	"github.com/chartpilot/chartpilot/internal/api/v1alpha1"
)

// discardStep is the Discard action.
type discardStep struct{}

var _ = registerStep(actDiscard, discardStep{})

func (s discardStep) full(ctx context.Context, r *Reconciler, f *fullPass) (ctrl.Result, bool, error) {
	res, err := s.run(r, f.p, f.d, f.o)
	return res, false, err
}

// run is the Discard action: the newest revision failed only because
// requests to the API server did (brokenOff), so its record is deleted and
// the action runs again as revision of the same number. The objects it
// made stay: they carry the release's ownership, and the next install or
// upgrade takes them over. Nothing is uninstalled or rolled back, and the
// history keeps one revision per inputs.
func (discardStep) run(r *Reconciler, p *pass, d *desired, o Observation) (ctrl.Result, error) {
	if err := r.Helm.As(d.identity).DeleteRevision(p.key.Namespace, p.key.Name, o.Latest.Revision); err != nil {
		return ctrl.Result{}, fmt.Errorf("discarding revision %d broken off by an API error: %w", o.Latest.Revision, err)
	}
	r.mem.with(p.key, func(m *memo) { m.brokenOff = 0 })
	setCondition(p.status, p.obj, v1alpha1.ConditionReconciling, metav1.ConditionTrue, "APIError",
		fmt.Sprintf("revision %d was broken off by an API error; trying it again", o.Latest.Revision))
	return ctrl.Result{RequeueAfter: 100 * time.Millisecond}, nil
}
