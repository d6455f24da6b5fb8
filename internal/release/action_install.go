package release

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ctrl "sigs.k8s.io/controller-runtime"

	"github.com/chartpilot/chartpilot/internal/api/v1alpha1"
	"github.com/chartpilot/chartpilot/internal/apiretry"
	"github.com/chartpilot/chartpilot/internal/helm"
	"github.com/chartpilot/chartpilot/internal/hooks"
)

// installStep is the Install action.
type installStep struct{}

var _ = registerStep(actInstall, installStep{})

func (s installStep) full(ctx context.Context, r *Reconciler, f *fullPass) (ctrl.Result, bool, error) {
	res, err := s.run(ctx, r, f.p, f.d)
	return res, false, err
}

// run is the Install action.
func (installStep) run(ctx context.Context, r *Reconciler, p *pass, d *desired) (ctrl.Result, error) {
	if res, held, err := r.preInstall(ctx, p, d); held || err != nil {
		return res, err
	}
	setCondition(p.status, p.obj, v1alpha1.ConditionReconciling, metav1.ConditionTrue, "Installing", "installing chart "+d.chart.Name+" "+d.chart.Version)
	rel, err := timed(ctx, "install", func() (*helm.Release, error) {
		return r.Helm.As(d.identity).Install(ctx, d.chart, r.actionOptions(p, d, "Install by chartpilot"))
	})
	if err != nil {
		if errors.Is(err, errStopping) {
			return ctrl.Result{}, err // nothing begun: the next pass acts
		}
		if helm.IsRecordConflict(err) {
			return ctrl.Result{}, fmt.Errorf("install: %w", err) // retried soon, not a failure of these inputs
		}
		if apiretry.Transient(err) {
			return reporter{r}.brokenOff(p, "Install", err, rel), nil
		}
		if rel == nil || rel.Revision == 0 || tooLarge(err) {
			// Nothing was stored: the chart did not render or the values
			// were rejected. Retrying the same inputs cannot help.
			res := reporter{r}.failed(p, d, "Install", "InstallFailed", err, nil)
			reporter{r}.stall(p, renderStallReason(err), "Install failed before anything was applied: "+oneLine(err.Error()))
			return res, nil
		}
		return reporter{r}.failed(p, d, "Install", "InstallFailed", err, rel), nil
	}
	reporter{r}.succeeded(p, d, "Install", "InstallSucceeded", fmt.Sprintf("installed %s %s as revision %d", rel.ChartName, rel.ChartVersion, rel.Revision), rel)
	r.afterDeploy(ctx, p, d, rel)
	return r.awaitHealth(p, rel), nil
}

// awaitHealth leaves a fresh revision Reconciling (not Ready) until the
// health gate has seen its workloads ready.
func (r *Reconciler) awaitHealth(p *pass, rel *helm.Release) ctrl.Result {
	r.mem.with(p.key, func(m *memo) { m.awaiting = true })
	p.settling = true
	var names []string
	if objs, err := parseManifest(rel.Manifest); err == nil {
		for _, o := range objs {
			names = append(names, o.GetKind()+"/"+o.GetName())
		}
	}
	setCondition(p.status, p.obj, v1alpha1.ConditionReconciling, metav1.ConditionTrue, "Progressing", "deployed; "+waitingFor(names))
	return ctrl.Result{RequeueAfter: healthPoll}
}

// waitingFor names the objects the health gate waits for (at most 10).
func waitingFor(names []string) string {
	if len(names) > 10 {
		return fmt.Sprintf("waiting for %s and %d more to become ready", strings.Join(names[:10], ", "), len(names)-10)
	}
	return "waiting for " + strings.Join(names, ", ") + " to become ready"
}

// progressing says the release waits for pending. A message that already
// names every one of them is kept: the objects become ready one by one,
// and rewriting the list each time would cost a status write each time.
func progressing(p *pass, pending []string) {
	if c := apimeta.FindStatusCondition(p.status.Conditions, v1alpha1.ConditionReconciling); c != nil && c.Status == metav1.ConditionTrue && c.Reason == "Progressing" {
		named := true
		for _, n := range pending {
			named = named && (strings.Contains(c.Message, n+",") || strings.Contains(c.Message, n+" "))
		}
		if named && len(pending) <= 10 {
			return
		}
	}
	setCondition(p.status, p.obj, v1alpha1.ConditionReconciling, metav1.ConditionTrue, "Progressing", waitingFor(pending))
}

// preInstall runs the PreInstall hooks; held is true when one holds the
// install (asked again in 15 s, or when the hook's watch wakes the
// resource). A hold is not a failure: no failed revision, no backoff.
func (r *Reconciler) preInstall(ctx context.Context, p *pass, d *desired) (ctrl.Result, bool, error) {
	for _, h := range r.Hooks {
		if h.PreInstall == nil {
			continue
		}
		obj := d.hobj
		obj.Values = d.vals
		err := h.PreInstall.PreInstall(ctx, obj)
		if err == nil {
			continue
		}
		rej, ok := hooks.AsRejection(err)
		if !ok {
			return ctrl.Result{}, true, fmt.Errorf("hook %s before the install: %w", h.Name, err)
		}
		msg := "hook " + h.Name + " holds the install: " + oneLine(rej.Message)
		if strings.HasSuffix(rej.Reason, "Failed") {
			// The input must change (or a person act) before the install
			// can go on: Stalled, looked at again each minute.
			reporter{r}.stall(p, rej.Reason, msg)
			return ctrl.Result{RequeueAfter: time.Minute}, true, nil
		}
		apimeta.RemoveStatusCondition(&p.status.Conditions, v1alpha1.ConditionStalled)
		prev := apimeta.FindStatusCondition(p.status.Conditions, v1alpha1.ConditionReconciling)
		if prev == nil || prev.Reason != "InstallBlocked" || prev.Message != msg {
			r.event(p, corev1.EventTypeNormal, rej.Reason, oneLine(rej.Message))
		}
		setCondition(p.status, p.obj, v1alpha1.ConditionReconciling, metav1.ConditionTrue, "InstallBlocked", msg)
		return ctrl.Result{RequeueAfter: 15 * time.Second}, true, nil
	}
	return ctrl.Result{}, false, nil
}
