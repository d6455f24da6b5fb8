package release

import (
	"context"
	"fmt"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"

	"github.com/chartpilot/chartpilot/internal/api/v1alpha1"
	"github.com/chartpilot/chartpilot/internal/helm"
)

// Back-off of a failed action on the same inputs: 15s, 30s, 1m, ... capped.
const (
	backoffBase = 15 * time.Second
	backoffMax  = 15 * time.Minute
	// historyLimit bounds status.history.
	historyLimit = 10
)

// backoff returns how long to wait before retrying action on the current
// inputs, or 0 to go ahead. New inputs or a new reconcile request retry at
// once. The last failure is the newest of three records: the resource's
// status, this process's memory (the status read may come from a cache that
// lags behind the write), and failed revisions of these inputs in the
// release history (observed state, which survives restarts and cache lag).
func (r *Reconciler) backoff(p *pass, action, requested string, history []*helm.Release) time.Duration {
	f := r.lastFailure(p, history)
	if f == nil || f.Digest != p.digest || f.RequestedAt != requested || f.Count == 0 {
		return 0
	}
	wait := backoffBase << min(f.Count-1, 10)
	wait = min(wait, backoffMax)
	elapsed := r.now().Sub(f.Time.Time)
	if elapsed >= wait {
		return 0
	}
	setCondition(p.status, p.obj, v1alpha1.ConditionReconciling, metav1.ConditionTrue, "BackingOff",
		fmt.Sprintf("%s failed %d time(s) on these inputs; next try in %s unless the spec changes or %s is set", action, f.Count, (wait-elapsed).Round(time.Second), v1alpha1.AnnotationReconcileRequestedAt))
	summarise(p.status, p.obj)
	return wait - elapsed
}

// lastFailure merges the failure records described at backoff.
func (r *Reconciler) lastFailure(p *pass, history []*helm.Release) *v1alpha1.Failure {
	var f *v1alpha1.Failure
	newer := func(c *v1alpha1.Failure) {
		if c == nil {
			return
		}
		if f == nil || c.Time.After(f.Time.Time) {
			cc := *c
			if f != nil && f.Digest == cc.Digest && f.Count > cc.Count {
				cc.Count = f.Count
			}
			f = &cc
		} else if f.Digest == c.Digest && c.Count > f.Count {
			f.Count = c.Count
		}
	}
	newer(p.status.LastFailure)
	r.mu.Lock()
	mem, ok := r.failures[p.key]
	r.mu.Unlock()
	if ok {
		newer(&mem)
	}
	count := 0
	var newest *helm.Release
	for _, rel := range history {
		if rel.Status == helm.StatusFailed && rel.Labels[LabelDigest] == p.digest && !strings.HasPrefix(rel.Description, unlockedPrefix) {
			count++
			newest = rel
		}
	}
	if newest != nil {
		newer(&v1alpha1.Failure{
			Action: "Upgrade", Digest: p.digest, Count: count,
			Time:        metav1.NewTime(newest.LastDeployed),
			RequestedAt: newest.Labels[LabelRequestedAt],
		})
	}
	return f
}

// failed records a failed action: condition, event, history, back-off.
func (r *Reconciler) failed(p *pass, action, reason string, err error, rel *helm.Release) ctrl.Result {
	msg := fmt.Sprintf("%s failed: %s", action, oneLine(err.Error()))
	count := 1
	requested := labelSafe(p.obj.GetAnnotations()[v1alpha1.AnnotationReconcileRequestedAt])
	if f := p.status.LastFailure; f != nil && f.Digest == p.digest && f.Action == action && f.RequestedAt == requested {
		count = f.Count + 1
	}
	if f := r.lastFailure(p, nil); f != nil && f.Digest == p.digest && f.Action == action && f.RequestedAt == requested {
		count = max(count, f.Count+1)
	}
	p.status.LastFailure = &v1alpha1.Failure{
		Action: action, Digest: p.digest, Count: count, Time: metav1.NewTime(r.now().Truncate(time.Second).UTC()),
		RequestedAt: requested, Message: msg,
	}
	r.mu.Lock()
	if r.failures == nil {
		r.failures = map[types.NamespacedName]v1alpha1.Failure{}
	}
	r.failures[p.key] = *p.status.LastFailure
	r.mu.Unlock()
	setCondition(p.status, p.obj, v1alpha1.ConditionReleased, metav1.ConditionFalse, reason, msg)
	setCondition(p.status, p.obj, v1alpha1.ConditionReconciling, metav1.ConditionTrue, reason, msg)
	r.recordHistory(p, action, rel, false, msg)
	r.Recorder.Event(p.obj, corev1.EventTypeWarning, reason, msg)
	p.log.Info("Helm action failed", "action", action, "reason", reason, "error", oneLine(err.Error()))
	if rel != nil {
		r.setReleaseInfo(p, rel)
	}
	summarise(p.status, p.obj)
	wait := min(backoffBase<<min(count-1, 10), backoffMax)
	return ctrl.Result{RequeueAfter: wait}
}

// succeeded records a successful action.
func (r *Reconciler) succeeded(p *pass, action, reason, msg string, rel *helm.Release) {
	p.status.LastFailure = nil
	r.mu.Lock()
	delete(r.failures, p.key)
	delete(r.statusSettled, p.key) // the kind's status may change with the release
	r.mu.Unlock()
	apimeta.RemoveStatusCondition(&p.status.Conditions, v1alpha1.ConditionStalled)
	setCondition(p.status, p.obj, v1alpha1.ConditionReleased, metav1.ConditionTrue, reason, msg)
	setCondition(p.status, p.obj, v1alpha1.ConditionReconciling, metav1.ConditionFalse, reason, msg)
	r.recordHistory(p, action, rel, true, msg)
	r.Recorder.Event(p.obj, corev1.EventTypeNormal, reason, msg)
	p.log.Info("Helm action succeeded", "action", action, "revision", revisionOfRelease(rel))
	if rel != nil {
		r.setReleaseInfo(p, rel)
	}
	summarise(p.status, p.obj)
}

// stall marks input that must change before anything can be done. Nothing
// deployed is touched; the next change of the resource retries.
func (r *Reconciler) stall(p *pass, reason, msg string) {
	prev := apimeta.FindStatusCondition(p.status.Conditions, v1alpha1.ConditionStalled)
	setCondition(p.status, p.obj, v1alpha1.ConditionStalled, metav1.ConditionTrue, reason, msg)
	setCondition(p.status, p.obj, v1alpha1.ConditionReconciling, metav1.ConditionFalse, reason, msg)
	if prev == nil || prev.Status != metav1.ConditionTrue || prev.Message != msg {
		r.Recorder.Event(p.obj, corev1.EventTypeWarning, reason, msg)
		p.log.Info("Stalled", "reason", reason, "message", msg)
	}
	summarise(p.status, p.obj)
}

func (r *Reconciler) markInSync(p *pass, rel *helm.Release) {
	apimeta.RemoveStatusCondition(&p.status.Conditions, v1alpha1.ConditionStalled)
	// Nothing is left to upgrade: a hook that can only hold upgrades holds nothing.
	for _, h := range r.Hooks {
		if h.PreUpgrade != nil && h.Validator == nil && h.PostRelease == nil {
			r.hookPassed(p, h)
		}
	}
	if c := apimeta.FindStatusCondition(p.status.Conditions, v1alpha1.ConditionReleased); c == nil || c.Status != metav1.ConditionTrue {
		setCondition(p.status, p.obj, v1alpha1.ConditionReleased, metav1.ConditionTrue, "UpToDate", "the release is deployed from the current inputs")
	}
	if c := apimeta.FindStatusCondition(p.status.Conditions, v1alpha1.ConditionReconciling); c == nil || c.Status != metav1.ConditionFalse {
		setCondition(p.status, p.obj, v1alpha1.ConditionReconciling, metav1.ConditionFalse, "UpToDate", "the release is deployed from the current inputs")
	}
	if rel != nil {
		r.setReleaseInfo(p, rel)
	}
	if cs := p.status.Chart; cs != nil && p.chart != nil {
		cs.DeployedVersion = p.chart.Version
		if cs.FailedVersion == p.chart.Version {
			cs.FailedVersion = ""
		}
	}
	r.setWaiting(p.key, "")
	// In sync and healthy: whatever upgrade held a slot is over.
	r.endUpgrade(p.key)
	summarise(p.status, p.obj)
}

func (r *Reconciler) setReleaseInfo(p *pass, rel *helm.Release) {
	info := &v1alpha1.ReleaseInfo{
		Name:         rel.Name,
		Revision:     rel.Revision,
		ChartName:    rel.ChartName,
		ChartVersion: rel.ChartVersion,
		AppVersion:   rel.AppVersion,
		Status:       string(rel.Status),
		ValuesDigest: rel.Labels[LabelDigest],
	}
	if !rel.LastDeployed.IsZero() {
		t := metav1.NewTime(rel.LastDeployed.Truncate(time.Second).UTC())
		info.LastDeployed = &t
	}
	p.status.Release = info
	if rel.Status == helm.StatusDeployed && p.status.Chart != nil {
		p.status.Chart.DeployedVersion = rel.ChartVersion
	}
	releaseInfo.DeletePartialMatch(map[string]string{"kind": r.Watch.GVK.Kind, "namespace": p.key.Namespace, "name": p.key.Name})
	releaseInfo.WithLabelValues(r.Watch.GVK.Kind, p.key.Namespace, p.key.Name, rel.ChartName, rel.ChartVersion, string(rel.Status)).Set(1)
}

func (r *Reconciler) recordHistory(p *pass, action string, rel *helm.Release, ok bool, msg string) {
	e := v1alpha1.HistoryEntry{
		Action:    action,
		Digest:    p.digest,
		Succeeded: ok,
		Time:      metav1.NewTime(r.now().Truncate(time.Second).UTC()),
		Message:   msg,
	}
	if rel != nil {
		e.Revision = rel.Revision
		e.ChartVersion = rel.ChartVersion
	}
	p.status.History = append([]v1alpha1.HistoryEntry{e}, p.status.History...)
	if len(p.status.History) > historyLimit {
		p.status.History = p.status.History[:historyLimit]
	}
}

func revisionOfRelease(rel *helm.Release) int {
	if rel == nil {
		return 0
	}
	return rel.Revision
}

// timed runs one Helm action and records its duration.
func timed[T any](action string, f func() (T, error)) (T, error) {
	start := time.Now()
	v, err := f()
	result := "success"
	if err != nil {
		result = "error"
	}
	helmActionDuration.WithLabelValues(action, result).Observe(time.Since(start).Seconds())
	return v, err
}

// install is the Install action.
func (r *Reconciler) install(ctx context.Context, p *pass) (ctrl.Result, error) {
	setCondition(p.status, p.obj, v1alpha1.ConditionReconciling, metav1.ConditionTrue, "Installing", "installing chart "+p.chart.Name+" "+p.chart.Version)
	rel, err := timed("install", func() (*helm.Release, error) {
		return r.Helm.As(p.identity).Install(ctx, p.chart, r.actionOptions(p, "Install by chartpilot"))
	})
	if err != nil {
		if rel == nil || rel.Revision == 0 {
			// Nothing was stored: the chart did not render or the values
			// were rejected. Retrying the same inputs cannot help.
			res := r.failed(p, "Install", "InstallFailed", err, nil)
			r.stall(p, "RenderFailed", "Install failed before anything was applied: "+oneLine(err.Error()))
			return res, nil
		}
		return r.failed(p, "Install", "InstallFailed", err, rel), nil
	}
	r.succeeded(p, "Install", "InstallSucceeded", fmt.Sprintf("installed %s %s as revision %d", rel.ChartName, rel.ChartVersion, rel.Revision), rel)
	r.afterDeploy(ctx, p, rel)
	return r.awaitHealth(p), nil
}

// upgrade is the Upgrade action (also how an interrupted upgrade is finished).
func (r *Reconciler) upgrade(ctx context.Context, p *pass, o Observation) (ctrl.Result, error) {
	opts := r.actionOptions(p, "Upgrade by chartpilot")
	if p.force != "" && o.Latest != nil && o.Latest.Labels[LabelForceToken] != labelSafe(p.force) {
		opts.Force = true
	}
	from := ""
	if o.Latest != nil {
		from = o.Latest.ChartVersion
	}
	for _, h := range r.Hooks {
		if h.PreUpgrade == nil {
			continue
		}
		if err := h.PreUpgrade.PreUpgrade(ctx, p.hobj, from, p.chart.Version); err != nil {
			r.hookRefused(p, h, err)
			setCondition(p.status, p.obj, v1alpha1.ConditionReconciling, metav1.ConditionTrue, "UpgradeBlocked", "hook "+h.Name+" holds the upgrade: "+oneLine(err.Error()))
			summarise(p.status, p.obj)
			return ctrl.Result{RequeueAfter: time.Minute}, nil
		}
		r.hookPassed(p, h)
	}
	setCondition(p.status, p.obj, v1alpha1.ConditionReconciling, metav1.ConditionTrue, "Upgrading", "upgrading to chart "+p.chart.Name+" "+p.chart.Version)
	prevRevision := 0
	if o.Latest != nil {
		prevRevision = o.Latest.Revision
	}
	rel, err := timed("upgrade", func() (*helm.Release, error) { return r.Helm.As(p.identity).Upgrade(ctx, p.chart, opts) })
	if err != nil {
		r.endUpgrade(p.key)
		if rel == nil || rel.Revision <= prevRevision {
			res := r.failed(p, "Upgrade", "UpgradeFailed", err, nil)
			r.stall(p, "RenderFailed", fmt.Sprintf("Upgrade failed before anything was applied; revision %d keeps running: %s", prevRevision, oneLine(err.Error())))
			return res, nil
		}
		// A failed revision is stored: the next pass rolls back to the last good one.
		res := r.failed(p, "Upgrade", "UpgradeFailed", err, rel)
		return ctrl.Result{RequeueAfter: min(res.RequeueAfter, time.Second)}, nil
	}
	r.succeeded(p, "Upgrade", "UpgradeSucceeded", fmt.Sprintf("upgraded to %s %s as revision %d", rel.ChartName, rel.ChartVersion, rel.Revision), rel)
	if from != rel.ChartVersion {
		rolloutUpgrades.WithLabelValues(r.Watch.GVK.Kind, rel.ChartVersion, rolloutResultDeployed).Inc()
	}
	r.afterDeploy(ctx, p, rel)
	return r.awaitHealth(p), nil
}

// awaitHealth leaves a fresh revision Reconciling (not Ready) until the
// health gate has seen its workloads ready.
func (r *Reconciler) awaitHealth(p *pass) ctrl.Result {
	r.setAwaiting(p.key, true)
	setCondition(p.status, p.obj, v1alpha1.ConditionReconciling, metav1.ConditionTrue, "Progressing", "deployed; waiting for the workloads to become ready")
	summarise(p.status, p.obj)
	return ctrl.Result{RequeueAfter: healthPoll}
}

// rollback is the Rollback action after a failed upgrade.
func (r *Reconciler) rollback(p *pass, o Observation) (ctrl.Result, error) {
	target := o.LastGood
	_, err := timed("rollback", func() (struct{}, error) {
		return struct{}{}, r.Helm.As(p.identity).Rollback(p.key.Namespace, p.key.Name, target.Revision, r.Watch.Timeout, r.Watch.MaxHistory)
	})
	if err != nil {
		msg := fmt.Sprintf("Rollback to revision %d failed: %s", target.Revision, oneLine(err.Error()))
		r.Recorder.Event(p.obj, corev1.EventTypeWarning, "RollbackFailed", msg)
		setCondition(p.status, p.obj, v1alpha1.ConditionReleased, metav1.ConditionFalse, "RollbackFailed", msg)
		r.recordHistory(p, "Rollback", target, false, msg)
		summarise(p.status, p.obj)
		return ctrl.Result{RequeueAfter: backoffBase}, nil
	}
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
	r.Recorder.Event(p.obj, corev1.EventTypeNormal, "RolledBack", msg)
	p.log.Info("Rolled back", "revision", target.Revision)
	if hist, err := r.Helm.History(p.key.Namespace, p.key.Name); err == nil && len(hist) > 0 {
		r.setReleaseInfo(p, hist[len(hist)-1])
	}
	r.recordHistory(p, "Rollback", target, true, msg)
	// Released stays False: what runs is not what the resource asks for.
	setCondition(p.status, p.obj, v1alpha1.ConditionReleased, metav1.ConditionFalse, "UpgradeFailed", msg)
	summarise(p.status, p.obj)
	return ctrl.Result{RequeueAfter: time.Second}, nil
}

// unlock is the Unlock action: a revision left pending-* by a process that
// died mid-action is marked failed, so that the next pass finishes the work.
// Only one pass at a time handles a resource and only the leader runs
// passes, so a pending revision seen here has no live holder.
func (r *Reconciler) unlock(p *pass, o Observation) (ctrl.Result, error) {
	action := strings.TrimPrefix(string(o.Latest.Status), "pending-")
	err := r.Helm.As(p.identity).MarkFailed(p.key.Namespace, p.key.Name, o.Latest.Revision, unlockedPrefix+action)
	if err != nil {
		return ctrl.Result{}, fmt.Errorf("unlocking release: %w", err)
	}
	msg := fmt.Sprintf("revision %d was left %s by an interrupted %s; unlocked it to finish the work", o.Latest.Revision, o.Latest.Status, action)
	r.Recorder.Event(p.obj, corev1.EventTypeNormal, "Unlocked", msg)
	r.recordHistory(p, "Unlock", o.Latest, true, msg)
	setCondition(p.status, p.obj, v1alpha1.ConditionReconciling, metav1.ConditionTrue, "Unlocked", msg)
	summarise(p.status, p.obj)
	return ctrl.Result{RequeueAfter: 100 * time.Millisecond}, nil
}

// cleanupFailedInstall uninstalls a release that never deployed, so that
// Install can start again from nothing (after back-off unless interrupted).
func (r *Reconciler) cleanupFailedInstall(p *pass, o Observation, requested string, interrupted bool) (ctrl.Result, error) {
	if !interrupted {
		if wait := r.backoff(p, "Install", requested, []*helm.Release{o.Latest}); wait > 0 {
			return ctrl.Result{RequeueAfter: wait}, nil
		}
	}
	_, err := timed("uninstall", func() (struct{}, error) {
		return struct{}{}, r.Helm.Uninstall(p.key.Namespace, p.key.Name, r.Watch.Timeout)
	})
	if err != nil {
		return ctrl.Result{}, fmt.Errorf("cleaning up failed install: %w", err)
	}
	msg := fmt.Sprintf("removed revision %d (%s) that never deployed, to install again", o.Latest.Revision, o.Latest.Status)
	r.Recorder.Event(p.obj, corev1.EventTypeNormal, "FailedInstallRemoved", msg)
	r.recordHistory(p, "Uninstall", o.Latest, true, msg)
	setCondition(p.status, p.obj, v1alpha1.ConditionReconciling, metav1.ConditionTrue, "Reinstalling", msg)
	summarise(p.status, p.obj)
	return ctrl.Result{RequeueAfter: 100 * time.Millisecond}, nil
}

// finalize uninstalls the release of a resource being deleted, then removes
// the finalizer. A resource whose release was never installed goes at once.
func (r *Reconciler) finalize(ctx context.Context, p *pass) (ctrl.Result, error) {
	if !controllerutil.ContainsFinalizer(p.obj, v1alpha1.Finalizer) {
		return ctrl.Result{}, nil
	}
	history, err := r.Helm.History(p.key.Namespace, p.key.Name)
	if err != nil {
		return ctrl.Result{}, err
	}
	o := observe(history, string(p.obj.GetUID()), p.digest, p.obj.GetAnnotations()[v1alpha1.AnnotationAdopt] == "true")
	switch o.State {
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
			summarise(p.status, p.obj)
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

// afterDeploy runs the PostRelease hooks and watches the kinds of the new
// release's objects.
func (r *Reconciler) afterDeploy(ctx context.Context, p *pass, rel *helm.Release) {
	for _, h := range r.Hooks {
		if h.PostRelease == nil {
			continue
		}
		if err := h.PostRelease.PostRelease(ctx, p.hobj); err != nil {
			r.hookRefused(p, h, err)
			p.blocked = false // the release is deployed; the hook's condition says what is missing
			summarise(p.status, p.obj)
		}
	}
	if r.deps == nil || rel == nil {
		return
	}
	if err := r.deps.ensure(ctx, r, rel.Manifest); err != nil {
		p.log.Error(err, "Failed to watch the release's objects")
	}
}

// oneLine keeps an error message to a single line for conditions and events.
func oneLine(s string) string {
	s = strings.Join(strings.Fields(s), " ")
	if len(s) > 1024 {
		s = s[:1021] + "..."
	}
	return s
}

// apiEqual compares statuses as the API server would store them (times by
// instant, not by location), so an unchanged status is never written.
func apiEqual(a, b *v1alpha1.ReleaseStatus) bool { return equality.Semantic.DeepEqual(a, b) }
