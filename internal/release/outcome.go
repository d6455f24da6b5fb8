package release

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ctrl "sigs.k8s.io/controller-runtime"

	"github.com/chartpilot/chartpilot/internal/api/v1alpha1"
	"github.com/chartpilot/chartpilot/internal/helm"
)

// Back-off of a failed action on the same inputs: 15s, 30s, 1m, ... capped.
const (
	backoffBase = 15 * time.Second
	backoffMax  = 15 * time.Minute
)

// backoffDelay is the wait after the count-th failure of the same inputs.
func backoffDelay(count int) time.Duration {
	return min(backoffBase<<min(max(count, 1)-1, 10), backoffMax)
}

// backoff returns how long to wait before retrying an action on inputs
// digest, or 0 to go ahead, and the failure it waits out. New inputs or a
// new reconcile request retry at once. The last failure is the newest of
// three records: the resource's status, this process's memory (the status
// read may come from a cache that lags behind the write), and failed
// revisions of these inputs in the release history (observed state, which
// survives restarts and cache lag).
func (r reporter) backoff(p *pass, digest string, history []*helm.Release) (time.Duration, *v1alpha1.Failure) {
	f := r.lastFailure(p, digest, history)
	if f == nil || f.Digest != r.shown(digest) || f.RequestedAt != p.requested || f.Count == 0 {
		return 0, nil
	}
	wait := backoffDelay(f.Count)
	elapsed := r.now().Sub(f.Time.Time)
	if elapsed >= wait {
		return 0, nil
	}
	return wait - elapsed, f
}

// lastFailure merges the failure records described at backoff.
func (r reporter) lastFailure(p *pass, digest string, history []*helm.Release) *v1alpha1.Failure {
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
	newer(r.mem.get(p.key).failure)
	count := 0
	var newest *helm.Release
	for _, rel := range history {
		if rel.Status == helm.StatusFailed && rel.Labels[v1alpha1.LabelDigest] == digest && !strings.HasPrefix(rel.Description, unlockedPrefix) {
			count++
			newest = rel
		}
	}
	if newest != nil {
		newer(&v1alpha1.Failure{
			Action: "Upgrade", Digest: r.shown(digest), Count: count,
			Time:        metav1.NewTime(newest.LastDeployed),
			RequestedAt: newest.Labels[v1alpha1.LabelRequestedAt],
		})
	}
	return f
}

// failed records a failed action: condition, event, history, back-off.
func (r reporter) failed(p *pass, d *desired, action, reason string, err error, rel *helm.Release) ctrl.Result {
	msg := fmt.Sprintf("%s failed: %s", action, oneLine(err.Error()))
	count := 1
	same := func(f *v1alpha1.Failure) bool {
		return f != nil && f.Digest == r.shown(d.digest) && f.Action == action && f.RequestedAt == p.requested
	}
	if f := p.status.LastFailure; same(f) {
		count = f.Count + 1
	}
	if f := r.lastFailure(p, d.digest, nil); same(f) {
		count = max(count, f.Count+1)
	}
	failure := &v1alpha1.Failure{
		Action: action, Digest: r.shown(d.digest), Count: count, Time: metav1.NewTime(r.now().Truncate(time.Second).UTC()),
		RequestedAt: p.requested, Message: msg,
	}
	p.status.LastFailure = failure
	r.mem.with(p.key, func(m *memo) { m.failure = failure.DeepCopy() })
	setCondition(p.status, p.obj, v1alpha1.ConditionReleased, metav1.ConditionFalse, reason, msg)
	setCondition(p.status, p.obj, v1alpha1.ConditionReconciling, metav1.ConditionTrue, reason, msg)
	r.recordHistory(p, d.digest, action, rel, false, msg)
	r.event(p, corev1.EventTypeWarning, reason, msg)
	p.log.Info("Helm action failed", "action", action, "reason", reason, "error", oneLine(err.Error()))
	if rel != nil {
		r.setReleaseInfo(p, rel)
	}
	return ctrl.Result{RequeueAfter: backoffDelay(count)}
}

// brokenOff records an action broken off by a transient API error
// (throttling, a server error, a lost connection) after its requests' own
// retries: not a failure of the inputs. It does not count toward the
// failure back-off and is tried again within seconds; a revision it left
// failed is discarded (see discard), not cleaned up or rolled back.
func (r reporter) brokenOff(p *pass, action string, err error, rel *helm.Release) ctrl.Result {
	n := 0
	r.mem.with(p.key, func(m *memo) {
		m.transients++
		n = m.transients
		m.brokenOff = 0
		if rel != nil && rel.Revision > 0 && rel.Status == helm.StatusFailed {
			m.brokenOff = rel.Revision
		}
	})
	wait := transientDelay(n)
	msg := fmt.Sprintf("%s broken off by an API error (%d in a row); trying again in %s: %s", action, n, wait.Round(100*time.Millisecond), oneLine(err.Error()))
	setCondition(p.status, p.obj, v1alpha1.ConditionReconciling, metav1.ConditionTrue, "APIError", msg)
	r.event(p, corev1.EventTypeWarning, "APIError", msg)
	p.log.Info("Helm action broken off by an API error", "action", action, "inARow", n, "error", oneLine(err.Error()))
	if rel != nil && rel.Revision > 0 {
		r.setReleaseInfo(p, rel)
	}
	return ctrl.Result{RequeueAfter: wait}
}

// transientDelay is the wait before trying again after n transient
// failures in a row: 1 s doubling to 30 s, each jittered by up to half.
func transientDelay(n int) time.Duration {
	d := min(time.Second<<min(max(n, 1)-1, 5), 30*time.Second)
	return d/2 + rand.N(d/2+1)
}

// succeeded records a successful action.
func (r reporter) succeeded(p *pass, d *desired, action, reason, msg string, rel *helm.Release) {
	p.status.LastFailure = nil
	r.mem.with(p.key, func(m *memo) {
		m.failure = nil
		m.statusSettled = false // the kind's status may change with the release
		m.brokenOff, m.transients = 0, 0
	})
	apimeta.RemoveStatusCondition(&p.status.Conditions, v1alpha1.ConditionStalled)
	setCondition(p.status, p.obj, v1alpha1.ConditionReleased, metav1.ConditionTrue, reason, msg)
	setCondition(p.status, p.obj, v1alpha1.ConditionReconciling, metav1.ConditionFalse, reason, msg)
	r.recordHistory(p, d.digest, action, rel, true, msg)
	r.event(p, corev1.EventTypeNormal, reason, msg)
	p.log.Info("Helm action succeeded", "action", action, "revision", revisionOfRelease(rel))
	if rel != nil {
		r.setReleaseInfo(p, rel)
	}
}

// stall marks input that must change before anything can be done. Nothing
// deployed is touched; the next change of the resource retries.
func (r reporter) stall(p *pass, reason, msg string) {
	prev := apimeta.FindStatusCondition(p.status.Conditions, v1alpha1.ConditionStalled)
	setCondition(p.status, p.obj, v1alpha1.ConditionStalled, metav1.ConditionTrue, reason, msg)
	setCondition(p.status, p.obj, v1alpha1.ConditionReconciling, metav1.ConditionFalse, reason, msg)
	if prev == nil || prev.Status != metav1.ConditionTrue || prev.Message != msg {
		r.event(p, corev1.EventTypeWarning, reason, msg)
		p.log.Info("Stalled", "reason", reason, "message", msg)
	}
}

// markInSync records a release deployed from the current inputs and healthy.
func (r reporter) markInSync(p *pass, d *desired, rel *helm.Release) {
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
	if cs := p.status.Chart; cs != nil && d.chart != nil {
		cs.DeployedVersion = d.chart.Version
		if cs.FailedVersion == d.chart.Version {
			cs.FailedVersion = ""
		}
	}
	r.setWaiting(p.key, "")
	// In sync and healthy: whatever upgrade held a slot is over.
	r.slots.end(p.key)
}

func revisionOfRelease(rel *helm.Release) int {
	if rel == nil {
		return 0
	}
	return rel.Revision
}

// timed runs one Helm action and records its duration. From here on the
// pass runs to its end (commit); a manager that stopped first keeps the
// action from beginning.
func timed[T any](ctx context.Context, action string, f func() (T, error)) (T, error) {
	if err := commit(ctx); err != nil {
		var zero T
		return zero, err
	}
	start := time.Now()
	v, err := f()
	result := "success"
	if err != nil {
		result = "error"
	}
	helmActionDuration.WithLabelValues(action, result).Observe(time.Since(start).Seconds())
	return v, err
}
