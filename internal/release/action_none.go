package release

import (
	"context"

	ctrl "sigs.k8s.io/controller-runtime"
)

// noneStep is the None action: the release is in sync and healthy; its
// workloads are followed and the resource marked in sync.
type noneStep struct{}

var _ = registerStep(actNone, noneStep{})

func (noneStep) full(ctx context.Context, r *Reconciler, f *fullPass) (ctrl.Result, bool, error) {
	healthGate{r}.followWorkloads(ctx, f.p, f.d, f.o.Latest)
	reporter{r}.markInSync(f.p, f.d, f.o.Latest)
	return ctrl.Result{RequeueAfter: r.Watch.ReconcilePeriod}, false, nil
}

// cached does the same from the caches; the newest revision's body is
// read only when its workloads are to be followed.
func (noneStep) cached(ctx context.Context, r *Reconciler, p *pass, d *desired, v *cacheView) (ctrl.Result, bool, bool) {
	if v.body == nil && (healthGate{r}).workloadsToFollow(p) && !r.cachedBody(ctx, p, d, v) {
		return ctrl.Result{}, false, false
	}
	if v.body == nil {
		rendersSkipped.WithLabelValues(r.Watch.GVK.Kind).Inc()
	}
	healthGate{r}.followWorkloads(ctx, p, d, v.body)
	reporter{r}.markInSync(p, d, v.body)
	return ctrl.Result{RequeueAfter: r.Watch.ReconcilePeriod}, false, true
}
