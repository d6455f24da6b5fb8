package release

import (
	"context"
	"fmt"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"

	"github.com/chartpilot/chartpilot/internal/api/v1alpha1"
	"github.com/chartpilot/chartpilot/internal/helm"
	"github.com/chartpilot/chartpilot/internal/policy"
)

// sourceRefreshMin is the least time between on-demand refreshes of a source.
const sourceRefreshMin = 10 * time.Second

// deployedState is what runs now, as far as version policy is concerned.
type deployedState struct {
	chartVersion, appMajor string
}

// deployedFromCache reads the newest deployed release record's labels from
// the metadata cache; before chartpilot labelled records (or without the
// cache) it falls back to the status.
func (r chartVersions) deployedFromCache(ctx context.Context, p *pass) deployedState {
	if records, ok := r.releaseRecords(ctx, p); ok {
		best := 0
		var labels map[string]string
		for _, l := range records {
			if v := revisionOf(l); v > best && l[helm.StorageLabelStatus] == string(helm.StatusDeployed) {
				best, labels = v, l
			}
		}
		if labels != nil && labels[v1alpha1.LabelChartVersion] != "" {
			return r.withAppMajor(p, deployedState{chartVersion: labels[v1alpha1.LabelChartVersion], appMajor: labels[v1alpha1.LabelAppMajor]})
		}
	}
	if c := p.status.Chart; c != nil && c.DeployedVersion != "" {
		return r.withAppMajor(p, deployedState{chartVersion: c.DeployedVersion})
	}
	if rel := p.status.Release; rel != nil && rel.Status == string(helm.StatusDeployed) {
		return r.withAppMajor(p, deployedState{chartVersion: rel.ChartVersion})
	}
	return deployedState{}
}

// deployedFromHistory is the exact deployed state: the last good revision.
func (r chartVersions) deployedFromHistory(p *pass, good *helm.Release) deployedState {
	if good == nil {
		return deployedState{}
	}
	return r.withAppMajor(p, deployedState{chartVersion: good.ChartVersion, appMajor: good.Labels[v1alpha1.LabelAppMajor]})
}

// withAppMajor fills a missing app major from the kind's status (releases
// deployed before their records carried the label).
func (r chartVersions) withAppMajor(p *pass, d deployedState) deployedState {
	if d.appMajor == "" && r.Kind.DeployedAppMajor != nil {
		d.appMajor = r.Kind.DeployedAppMajor(p.obj)
	}
	return d
}

// resourceConstraint is the resource's own chart version constraint:
// spec.chartVersion for typed kinds, else the annotation.
func (r chartVersions) resourceConstraint(obj *unstructured.Unstructured) (string, string) {
	if r.Kind.Typed() {
		if v, ok, _ := unstructured.NestedString(obj.Object, "spec", "chartVersion"); ok && v != "" {
			return v, "spec.chartVersion"
		}
	}
	return obj.GetAnnotations()[v1alpha1.AnnotationChartVersion], "annotation " + v1alpha1.AnnotationChartVersion
}

// policyFor is the version policy of a resource, given what it runs.
func (r chartVersions) policyFor(obj *unstructured.Unstructured, d deployedState) (policy.Policy, []uint64, error) {
	ann := obj.GetAnnotations()
	majors, err := policy.ParseMajors(ann[v1alpha1.AnnotationAllowMajorUpgrade])
	if err != nil {
		return policy.Policy{}, nil, err
	}
	constraint, field := r.resourceConstraint(obj)
	pol := policy.Policy{
		Chart:          r.Source.Name(),
		Resource:       constraint,
		Field:          field,
		Deployed:       d.chartVersion,
		AllowMajor:     majors,
		AllowDowngrade: ann[v1alpha1.AnnotationAllowDowngrade],
	}
	if r.Watch.Remote != nil {
		pol.Watch = r.Watch.Remote.Version
	}
	return pol, majors, nil
}

// selectChart decides the chart version of the pass and loads it. When
// nothing may be deployed (the source knows no version yet, or policy holds
// the release) d.held is set and the release stays as it is.
func (r chartVersions) selectChart(ctx context.Context, p *pass, d *desired) error {
	r.refreshOnRequest(ctx, p)
	versions, verr := r.Source.Versions()
	r.sourceCondition(p, verr)
	if len(versions) == 0 {
		msg := fmt.Sprintf("no version of chart %s is known yet from %s", r.Source.Name(), r.Source)
		if verr != nil {
			msg += ": " + oneLine(verr.Error())
		}
		r.holdChart(p, d, "WaitingForChartSource", msg)
		return nil
	}
	pol, majors, err := r.policyFor(p.obj, d.deployed)
	if err != nil {
		return &stallError{"AnnotationInvalid", err}
	}
	choice, err := policy.Choose(versions, pol)
	if err != nil {
		return &stallError{"ChartVersionUnsatisfiable", err}
	}
	cs := p.status.Chart
	if cs == nil {
		cs = &v1alpha1.ChartStatus{}
	}
	cs.Name, cs.DeployedVersion, cs.DesiredVersion, cs.AvailableUpgrade = r.Source.Name(), d.deployed.chartVersion, choice.Desired, choice.AvailableUpgrade
	p.status.Chart = cs

	blockReason, blockMsg := choice.Blocked, choice.Message
	if r.Kind.AppMajor != nil {
		d.appMajor = r.Kind.AppMajor(p.obj)
		if reason, msg := policy.AppMajor(d.deployed.appMajor, d.appMajor, majors, p.obj.GetAnnotations()[v1alpha1.AnnotationAllowDowngrade]); reason != "" {
			blockReason, blockMsg = reason, msg
			choice.Version = "" // nothing changes until the resource opts in
		}
	}
	r.upgradeBlockedCondition(p, blockReason, blockMsg)
	if choice.Version == "" {
		d.held = true
		return nil
	}
	ch, err := r.Source.Load(ctx, choice.Version)
	if err != nil {
		r.holdChart(p, d, "ChartUnavailable", oneLine(err.Error()))
		return nil
	}
	d.chart = ch
	return nil
}

// chartRetry is how soon a resource waiting for its chart looks again.
const chartRetry = 15 * time.Second

// holdChart leaves the release as it is while no chart can be had, and says why.
func (r chartVersions) holdChart(p *pass, d *desired, reason, msg string) {
	setCondition(p.status, p.obj, v1alpha1.ConditionReconciling, metav1.ConditionTrue, reason, msg)
	d.held, d.retryAfter = true, chartRetry
}

// upgradeBlockedCondition sets UpgradeBlocked (and a Warning event when it
// turns on or its message changes), or removes it.
func (r chartVersions) upgradeBlockedCondition(p *pass, reason, msg string) {
	if reason == "" {
		apimeta.RemoveStatusCondition(&p.status.Conditions, v1alpha1.ConditionUpgradeBlocked)
		return
	}
	prev := apimeta.FindStatusCondition(p.orig.Conditions, v1alpha1.ConditionUpgradeBlocked)
	setCondition(p.status, p.obj, v1alpha1.ConditionUpgradeBlocked, metav1.ConditionTrue, reason, msg)
	if prev == nil || prev.Status != metav1.ConditionTrue || prev.Message != msg {
		r.event(p, corev1.EventTypeWarning, reason, msg)
	}
}

// sourceCondition reports a remote source's reachability.
func (r chartVersions) sourceCondition(p *pass, verr error) {
	if r.Source.Interval() == 0 {
		return
	}
	if verr != nil {
		msg := oneLine(verr.Error()) + "; releases stay on the versions they have"
		prev := apimeta.FindStatusCondition(p.orig.Conditions, v1alpha1.ConditionSourceAvailable)
		setCondition(p.status, p.obj, v1alpha1.ConditionSourceAvailable, metav1.ConditionFalse, "SourceUnreachable", msg)
		if prev == nil || prev.Status != metav1.ConditionFalse {
			r.event(p, corev1.EventTypeWarning, "SourceUnreachable", msg)
		}
		return
	}
	setCondition(p.status, p.obj, v1alpha1.ConditionSourceAvailable, metav1.ConditionTrue, "Refreshed", "the version list of "+r.Source.String()+" was read")
}

// refreshOnRequest refreshes a remote source when the resource's
// reconcile-requested-at annotation changed. Refreshes on request are at
// least sourceRefreshMin apart (a fleet-wide bump reads the index a few
// times, not once per resource); a request that comes too soon is not
// dropped: the pass asks to be run again when the next refresh may happen.
func (r chartVersions) refreshOnRequest(ctx context.Context, p *pass) {
	if r.Source.Interval() == 0 {
		return
	}
	token := p.obj.GetAnnotations()[v1alpha1.AnnotationReconcileRequestedAt]
	if token == "" {
		return
	}
	due, wait := r.sourceRefresh.take(p.key, token, time.Now())
	if !due {
		p.refreshWait = wait
		return
	}
	changed, err := r.Source.Refresh(ctx)
	p.log.V(1).Info("Refreshed the chart source on request", "changed", changed, "error", fmt.Sprint(err))
	if changed {
		wiring{r.Reconciler}.kickAll(ctx)
	}
}

// refreshLimiter spaces the source refreshes that resources ask for.
type refreshLimiter struct {
	mu   sync.Mutex
	last time.Time
	// tokens is the reconcile-requested-at value that last refreshed the
	// source, per resource.
	tokens map[types.NamespacedName]string
}

// take reports whether key's token calls for a refresh now; when one is
// called for but comes too soon, wait says when it may happen.
func (l *refreshLimiter) take(key types.NamespacedName, token string, now time.Time) (due bool, wait time.Duration) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.tokens[key] == token {
		return false, 0
	}
	if wait := sourceRefreshMin - now.Sub(l.last); wait > 0 {
		return false, wait
	}
	if l.tokens == nil {
		l.tokens = map[types.NamespacedName]string{}
	}
	l.tokens[key], l.last = token, now
	return true, 0
}

func (l *refreshLimiter) forget(key types.NamespacedName) {
	l.mu.Lock()
	defer l.mu.Unlock()
	delete(l.tokens, key)
}

// blockedSummary reports an UpgradeBlocked condition that keeps the
// resource from what its spec asks for (a software major version change, a
// downgrade, an invalid window): Ready is False. A newer chart version that
// waits by policy (major opt-in, window, canaries, a halted rollout) leaves
// Ready alone.
func blockedSummary(st *v1alpha1.ReleaseStatus) *metav1.Condition {
	c := apimeta.FindStatusCondition(st.Conditions, v1alpha1.ConditionUpgradeBlocked)
	if c == nil || c.Status != metav1.ConditionTrue {
		return nil
	}
	switch c.Reason {
	case policy.ReasonMajorUpgrade, reasonWindow, reasonCanaries, reasonHalted:
		return nil // a newer chart waits by policy; what runs is what was asked
	}
	return c
}
