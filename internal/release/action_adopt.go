package release

import (
	"context"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ctrl "sigs.k8s.io/controller-runtime"

	"github.com/chartpilot/chartpilot/internal/api/v1alpha1"
	"github.com/chartpilot/chartpilot/internal/helm"
)

// firstUntrusted is the first revision whose record was read without a
// valid MAC or with a chunk missing or changed (nil if every one read is
// trusted).
func firstUntrusted(history []*helm.Release) *helm.Release {
	for _, h := range history {
		if !h.Trusted && !h.Unread {
			return h
		}
	}
	return nil
}

// distrust says why a revision's record is not trusted.
func distrust(rec *helm.Release) string {
	if rec.Distrust != "" {
		return rec.Distrust
	}
	return fmt.Sprintf("release record %s was not written by chartpilot or was changed since (no valid MAC)", rec.Record)
}

// untrustedRecords handles a release with records chartpilot did not write
// (a release made with the helm CLI, records from before records were
// signed, or an edited one). Nothing is ever done from such a record: the
// resource stalls; with chartpilot.dev/adopt it is re-installed from the
// chart and values: the records are deleted (the objects stay, and the
// install takes them over), then the next pass installs.
func (r *Reconciler) untrustedRecords(ctx context.Context, p *pass, d *desired, o Observation, untrusted *helm.Release) (ctrl.Result, error) {
	record, why := untrusted.Record, distrust(untrusted)
	if o.State == StateUnmanaged || o.State == StateConflict {
		r.stallForeign(p, o)
		return ctrl.Result{}, nil
	}
	if !r.mayAdopt(ctx, p, nil) {
		reporter{r}.stall(p, "UntrustedReleaseRecord", fmt.Sprintf("%s: nothing was done from it; set annotation %s: \"true\" to re-install from the chart and values (the objects are kept)", why, v1alpha1.AnnotationAdopt))
		return ctrl.Result{}, nil
	}
	if err := commit(ctx); err != nil {
		return ctrl.Result{}, err
	}
	if err := r.Helm.As(d.identity).DeleteRecords(p.key.Namespace, p.key.Name); err != nil {
		return ctrl.Result{}, err
	}
	msg := fmt.Sprintf("deleted the release records of %s that chartpilot did not write (%s, ...); installing afresh from the chart and values", p.key.Name, record)
	r.event(p, corev1.EventTypeNormal, "Adopted", msg)
	reporter{r}.recordHistory(p, d.digest, "Adopt", nil, true, msg)
	setCondition(p.status, p.obj, v1alpha1.ConditionReconciling, metav1.ConditionTrue, "Adopting", msg)
	return ctrl.Result{RequeueAfter: 100 * time.Millisecond}, nil
}
