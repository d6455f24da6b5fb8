package release

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"

	"github.com/Masterminds/semver/v3"

	"github.com/chartpilot/chartpilot/internal/api/v1alpha1"
	"github.com/chartpilot/chartpilot/internal/helm"
	"github.com/chartpilot/chartpilot/internal/source"
)

// Labels on release records that say what a revision deployed, read by the
// version policy without decoding the records.
const (
	LabelChartVersion = "chartpilot.dev/chart-version"
	LabelAppMajor     = "chartpilot.dev/app-major"
)

// Reasons of the UpgradeBlocked condition.
const (
	// reasonAppMajor: the resource asks for another major version of the
	// software it names; nothing is changed until it opts in.
	reasonAppMajor = "MajorVersionChangeBlocked"
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
func (r *Reconciler) deployedFromCache(ctx context.Context, p *pass) deployedState {
	if records, ok := r.releaseRecords(ctx, p); ok {
		best := 0
		var labels map[string]string
		for _, l := range records {
			if v := revisionOf(l); v > best && l[helm.StorageLabelStatus] == string(helm.StatusDeployed) {
				best, labels = v, l
			}
		}
		if labels != nil && labels[LabelChartVersion] != "" {
			return r.withAppMajor(p, deployedState{chartVersion: labels[LabelChartVersion], appMajor: labels[LabelAppMajor]})
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
func (r *Reconciler) deployedFromHistory(p *pass, o Observation) deployedState {
	if o.LastGood == nil {
		return deployedState{}
	}
	return r.withAppMajor(p, deployedState{chartVersion: o.LastGood.ChartVersion, appMajor: o.LastGood.Labels[LabelAppMajor]})
}

// withAppMajor fills a missing app major from the kind's status (releases
// deployed before their records carried the label).
func (r *Reconciler) withAppMajor(p *pass, d deployedState) deployedState {
	if d.appMajor == "" && r.Kind.DeployedAppMajor != nil {
		d.appMajor = r.Kind.DeployedAppMajor(p.obj)
	}
	return d
}

// resourceConstraint is the resource's own chart version constraint:
// spec.chartVersion for typed kinds, else the annotation.
func (r *Reconciler) resourceConstraint(obj *unstructured.Unstructured) (string, string) {
	if r.Kind.Values != nil {
		if v, ok, _ := unstructured.NestedString(obj.Object, "spec", "chartVersion"); ok && v != "" {
			return v, "spec.chartVersion"
		}
	}
	return obj.GetAnnotations()[v1alpha1.AnnotationChartVersion], "annotation " + v1alpha1.AnnotationChartVersion
}

// policyFor is the version policy of a resource, given what it runs.
func (r *Reconciler) policyFor(obj *unstructured.Unstructured, d deployedState) (source.Policy, []uint64, error) {
	ann := obj.GetAnnotations()
	majors, err := source.ParseMajors(ann[v1alpha1.AnnotationAllowMajorUpgrade])
	if err != nil {
		return source.Policy{}, nil, err
	}
	constraint, field := r.resourceConstraint(obj)
	pol := source.Policy{
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
// the release) p.blocked is set and the release stays as it is.
func (r *Reconciler) selectChart(ctx context.Context, p *pass) error {
	r.refreshOnRequest(ctx, p)
	versions, verr := r.Source.Versions()
	r.sourceCondition(p, verr)
	if len(versions) == 0 {
		msg := fmt.Sprintf("no version of chart %s is known yet from %s", r.Source.Name(), r.Source)
		if verr != nil {
			msg += ": " + oneLine(verr.Error())
		}
		r.hold(p, "WaitingForChartSource", msg, 15*time.Second)
		return nil
	}
	if !p.deployedExact {
		p.deployed = r.deployedFromCache(ctx, p)
	}
	pol, majors, err := r.policyFor(p.obj, p.deployed)
	if err != nil {
		return &stallError{"AnnotationInvalid", err}
	}
	choice, err := source.Choose(versions, pol)
	if err != nil {
		return &stallError{"ChartVersionUnsatisfiable", err}
	}
	cs := p.status.Chart
	if cs == nil {
		cs = &v1alpha1.ChartStatus{}
	}
	cs.Name, cs.DeployedVersion, cs.DesiredVersion, cs.AvailableUpgrade = r.Source.Name(), p.deployed.chartVersion, choice.Desired, choice.AvailableUpgrade
	p.status.Chart = cs

	blockReason, blockMsg := choice.Blocked, choice.Message
	p.appMajor = ""
	if r.Kind.AppMajor != nil {
		p.appMajor = r.Kind.AppMajor(p.obj)
		if reason, msg := appMajorPolicy(p.deployed.appMajor, p.appMajor, majors, p.obj.GetAnnotations()[v1alpha1.AnnotationAllowDowngrade]); reason != "" {
			blockReason, blockMsg = reason, msg
			choice.Version = "" // nothing changes until the resource opts in
		}
	}
	r.upgradeBlockedCondition(p, blockReason, blockMsg)
	if choice.Version == "" {
		summarise(p.status, p.obj)
		p.blocked = true
		return nil
	}
	ch, err := r.Source.Load(ctx, choice.Version)
	if err != nil {
		r.hold(p, "ChartUnavailable", oneLine(err.Error()), 15*time.Second)
		return nil
	}
	p.chart = ch
	return nil
}

// appMajorPolicy applies the major-version rule to the software version a
// kind names (PostgreSQL's spec.version): a change of major is a major
// upgrade, a lower major a downgrade.
func appMajorPolicy(have, want string, allow []uint64, allowDowngrade string) (string, string) {
	if have == "" || want == "" || have == want {
		return "", ""
	}
	h, err1 := strconv.ParseUint(have, 10, 64)
	w, err2 := strconv.ParseUint(want, 10, 64)
	if err1 != nil || err2 != nil {
		return "", ""
	}
	if w > h && !slices.Contains(allow, w) {
		return reasonAppMajor, fmt.Sprintf("spec.version asks for major version %d but %d runs: a major upgrade is not done on its own; take a backup, then set annotation %s: \"%d\"", w, h, v1alpha1.AnnotationAllowMajorUpgrade, w)
	}
	if w < h && allowDowngrade != want {
		return source.ReasonDowngrade, fmt.Sprintf("spec.version asks for major version %d but %d runs: downgrades are refused (data written by %d may not be readable by %d); set spec.version back, or annotation %s: %q", w, h, h, w, v1alpha1.AnnotationAllowDowngrade, want)
	}
	return "", ""
}

// hold leaves the release as it is and says why.
func (r *Reconciler) hold(p *pass, reason, msg string, retry time.Duration) {
	setCondition(p.status, p.obj, v1alpha1.ConditionReconciling, metav1.ConditionTrue, reason, msg)
	summarise(p.status, p.obj)
	p.blocked = true
	p.retryAfter = retry
}

// upgradeBlockedCondition sets UpgradeBlocked (and a Warning event when it
// turns on or its message changes), or removes it.
func (r *Reconciler) upgradeBlockedCondition(p *pass, reason, msg string) {
	if reason == "" {
		apimeta.RemoveStatusCondition(&p.status.Conditions, v1alpha1.ConditionUpgradeBlocked)
		return
	}
	prev := apimeta.FindStatusCondition(p.orig.Conditions, v1alpha1.ConditionUpgradeBlocked)
	setCondition(p.status, p.obj, v1alpha1.ConditionUpgradeBlocked, metav1.ConditionTrue, reason, msg)
	if prev == nil || prev.Status != metav1.ConditionTrue || prev.Message != msg {
		r.Recorder.Event(p.obj, corev1.EventTypeWarning, reason, msg)
	}
}

// sourceCondition reports a remote source's reachability.
func (r *Reconciler) sourceCondition(p *pass, verr error) {
	if r.Source.Interval() == 0 {
		return
	}
	if verr != nil {
		msg := oneLine(verr.Error()) + "; releases stay on the versions they have"
		prev := apimeta.FindStatusCondition(p.orig.Conditions, v1alpha1.ConditionSourceAvailable)
		setCondition(p.status, p.obj, v1alpha1.ConditionSourceAvailable, metav1.ConditionFalse, "SourceUnreachable", msg)
		if prev == nil || prev.Status != metav1.ConditionFalse {
			r.Recorder.Event(p.obj, corev1.EventTypeWarning, "SourceUnreachable", msg)
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
func (r *Reconciler) refreshOnRequest(ctx context.Context, p *pass) {
	if r.Source.Interval() == 0 {
		return
	}
	token := p.obj.GetAnnotations()[v1alpha1.AnnotationReconcileRequestedAt]
	if token == "" {
		return
	}
	r.mu.Lock()
	if r.refreshTokens == nil {
		r.refreshTokens = map[types.NamespacedName]string{}
	}
	if r.refreshTokens[p.key] == token {
		r.mu.Unlock()
		return
	}
	if wait := sourceRefreshMin - time.Since(r.lastRefresh); wait > 0 {
		r.mu.Unlock()
		p.refreshWait = wait
		return
	}
	r.refreshTokens[p.key] = token
	r.lastRefresh = time.Now()
	r.mu.Unlock()
	changed, err := r.Source.Refresh(ctx)
	p.log.V(1).Info("Refreshed the chart source on request", "changed", changed, "error", fmt.Sprint(err))
	if changed {
		r.kickAll(ctx)
	}
}

// isVersionChange reports whether the pass would change the deployed chart version.
func (p *pass) isVersionChange() bool {
	return p.deployed.chartVersion != "" && p.chart != nil && p.chart.Version != p.deployed.chartVersion
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
	case source.ReasonMajorUpgrade, reasonWindow, reasonCanaries, reasonHalted:
		return nil // a newer chart waits by policy; what runs is what was asked
	}
	return c
}

// ValidateAnnotations checks the version and rollout annotations of a
// resource (admission runs it; the reconciler reports the same errors on
// the resource's conditions).
func ValidateAnnotations(obj *unstructured.Unstructured) error {
	ann := obj.GetAnnotations()
	var errs []error
	if _, err := source.ParseMajors(ann[v1alpha1.AnnotationAllowMajorUpgrade]); err != nil {
		errs = append(errs, err)
	}
	if c := ann[v1alpha1.AnnotationChartVersion]; c != "" {
		if _, err := semver.NewConstraint(c); err != nil {
			errs = append(errs, fmt.Errorf("annotation %s: %q is not a semver constraint (%w): write e.g. \"~1.4\" or \">=1.2, <2\"", v1alpha1.AnnotationChartVersion, c, err))
		}
	}
	if w := ann[v1alpha1.AnnotationMaintenanceWindow]; w != "" {
		if _, err := parseWindows(w); err != nil {
			errs = append(errs, fmt.Errorf("annotation %s: %w", v1alpha1.AnnotationMaintenanceWindow, err))
		}
	}
	if len(errs) == 0 {
		return nil
	}
	msgs := make([]string, len(errs))
	for i, err := range errs {
		msgs[i] = err.Error()
	}
	return errors.New(strings.Join(msgs, "; "))
}

// stallError is an input error with its own Stalled reason.
type stallError struct {
	reason string
	err    error
}

func (e *stallError) Error() string { return e.err.Error() }
func (e *stallError) Unwrap() error { return e.err }

// stallReason is the Stalled reason of an error from desired.
func stallReason(err error) string {
	var se *stallError
	if errors.As(err, &se) {
		return se.reason
	}
	return "ValuesInvalid"
}
