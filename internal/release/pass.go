package release

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/chartpilot/chartpilot/internal/api/v1alpha1"
	"github.com/chartpilot/chartpilot/internal/helm"
	"github.com/chartpilot/chartpilot/internal/hooks"
	"github.com/chartpilot/chartpilot/internal/values"
)

// pass is one reconcile of one resource: what was read and what will be
// written. Its inputs to Helm are in a desired value, never here.
type pass struct {
	obj *unstructured.Unstructured
	key types.NamespacedName
	// status is the status being built; orig is the status as read, so
	// that only a change is written.
	status, orig *v1alpha1.ReleaseStatus
	// extras are the kind's own status fields (Kind.Status), nil if not computed.
	extras map[string]any
	log    logr.Logger
	// requested is the reconcile-requested-at token as stored in labels.
	requested string
	// refreshWait > 0: a refresh the resource asked for must wait this long.
	refreshWait time.Duration
	// records are the labels of the release records (metadata cache), once read.
	records     []map[string]string
	recordsRead bool
	// fresh: obj is what the API server returned for a write of this pass
	// (no read is needed to act on it).
	fresh bool
	// settling: the pass deployed a revision and ends waiting a moment for
	// its health; its status may be owed to the next pass (see owe).
	settling bool
	// reserved: the cache path took an upgrade slot for this pass before
	// its fresh read; given back at the end unless an upgrade began.
	reserved bool
	// stopped: the pass ended because its manager stopped before it
	// acted (endedByStop); nil outside a pass's context.
	stopped func() bool
}

func (r *Reconciler) newPass(key types.NamespacedName, obj *unstructured.Unstructured) *pass {
	st, orig := r.startStatus(key, obj)
	return &pass{
		obj: obj, key: key, status: st, orig: orig,
		log:       r.Log.WithValues(strings.ToLower(r.Watch.GVK.Kind), key),
		requested: labelSafe(obj.GetAnnotations()[v1alpha1.AnnotationReconcileRequestedAt]),
	}
}

// startStatus is the status a pass starts from and the status as read:
// the same, unless the last pass's status was not written (owe), which
// this pass goes on from and writes with its own changes.
func (r *Reconciler) startStatus(key types.NamespacedName, obj *unstructured.Unstructured) (st, orig *v1alpha1.ReleaseStatus) {
	orig = readStatus(obj)
	if m := r.mem.get(key); m.owed != nil && m.owedUID == obj.GetUID() {
		return m.owed.DeepCopy(), orig
	}
	return orig.DeepCopy(), orig
}

// desired is everything a release is made from, computed once from one read
// of the resource: the chart version, the values, the identity Helm runs as
// and the hooks' verdicts. It is not changed after desire returns.
type desired struct {
	chart    *helm.Chart
	deployed deployedState
	// appMajor is the software major version asked for (Kind.AppMajor).
	appMajor string
	vals     map[string]any
	digest   string
	force    string
	// hobj is what hooks see of the resource.
	hobj hooks.Object
	// identity is the user Helm actions run as ("" for the operator itself).
	identity string
	// hookUsers are the users the hooks name, in order (see identity.Resolve).
	hookUsers []string
	// held: a hook refused the resource, policy holds it, or no chart can be
	// had; nothing may be deployed (retryAfter > 0: look again then).
	held       bool
	retryAfter time.Duration
	// stall is an input error that only a change of the resource can fix.
	stall *stallError
}

// stopped reports whether no action may follow from d.
func (d *desired) stopped() bool { return d.held || d.stall != nil }

// isVersionChange reports whether d would change the deployed chart version.
func (d *desired) isVersionChange() bool {
	return d.deployed.chartVersion != "" && d.chart != nil && d.chart.Version != d.deployed.chartVersion
}

// stop ends a pass that may not act, saying why.
func (r *Reconciler) stop(p *pass, d *desired) ctrl.Result {
	if d.stall != nil {
		reporter{r}.stall(p, d.stall.reason, d.stall.Error())
		return ctrl.Result{}
	}
	return ctrl.Result{RequeueAfter: d.retryAfter}
}

// desire computes the desired inputs of the pass from p.obj, given what is
// deployed: chart version (policy), values layers, identity and verdicts.
// Verdicts become conditions on p.status.
func (r *Reconciler) desire(ctx context.Context, p *pass, deployed deployedState) *desired {
	d := &desired{deployed: deployed}
	if err := (chartVersions{r}).selectChart(ctx, p, d); err != nil {
		d.stall = asStall(err, "ValuesInvalid")
		return d
	}
	if d.held {
		return d
	}
	hobj, crVals, err := r.Kind.Object(p.obj, d.chart.Name, d.chart.Version)
	if err != nil {
		d.stall = asStall(err, "ValuesInvalid")
		return d
	}
	d.hobj = hobj
	layers, ok := r.hookLayers(ctx, p, d, crVals)
	if !ok {
		d.held = true
		return d
	}
	secrets, err := r.overrideSecrets(ctx)
	if err != nil {
		r.holdOverrides(p, d, err)
		return d
	}
	if secrets != nil {
		r.mem.retried(p.key, "OverrideSecret")
		layers = append(layers, values.Layer{Name: "overrides from Secrets", Values: secrets})
	}
	if d.identity, d.stall = r.identity(ctx, d.hookUsers, p.key.Namespace); d.stall != nil {
		return d
	}
	d.vals = values.Merge(layers...)
	p.status.ValuesLayers = layerSummary(layers)
	d.force = p.obj.GetAnnotations()[v1alpha1.AnnotationForceUpgrade]
	if d.digest, err = values.Digest(d.chart.Digest, d.vals, map[string]string{v1alpha1.AnnotationForceUpgrade: d.force}); err != nil {
		d.stall = asStall(err, "ValuesInvalid")
	}
	return d
}

// hookLayers runs every hook's Validate, Identity and Values in order and
// returns the values layers (the resource's, hooks', tenants', the watch's
// overrides); false when a hook refused the resource.
func (r *Reconciler) hookLayers(ctx context.Context, p *pass, d *desired, crVals map[string]any) ([]values.Layer, bool) {
	layers := []values.Layer{{Name: "cr", Values: crVals}}
	var tenantLayers []values.Layer
	for _, h := range r.Hooks {
		if h.Validator != nil {
			if err := h.Validator.Validate(ctx, d.hobj); err != nil {
				r.refusedBy(p, d, h, err)
				return nil, false
			}
			reporter{r}.hookPassed(p, h)
		}
		if h.Identity != nil {
			id, err := h.Identity(ctx, d.hobj)
			if err != nil {
				r.refusedBy(p, d, h, err)
				return nil, false
			}
			d.hookUsers = append(d.hookUsers, id)
		}
		if h.Values != nil {
			v, err := h.Values.Values(ctx, d.hobj)
			if err != nil {
				r.refusedBy(p, d, h, err)
				return nil, false
			}
			if c := apimeta.FindStatusCondition(p.status.Conditions, h.ConditionType); c != nil && c.Status == metav1.ConditionFalse {
				// A refusal of an earlier pass is over.
				reporter{r}.hookPassed(p, h)
			}
			l := values.Layer{Name: "hook:" + h.Name, Values: v}
			if h.ValuesLayer == hooks.LayerTenant {
				tenantLayers = append(tenantLayers, l)
			} else {
				layers = append(layers, l)
			}
		}
		r.mem.retried(p.key, "hook:"+h.Name)
		if h.Report != nil && h.ReportType != "" {
			if c := h.Report(ctx, d.hobj); c != nil {
				setCondition(p.status, p.obj, h.ReportType, c.Status, c.Reason, c.Message)
			} else {
				apimeta.RemoveStatusCondition(&p.status.Conditions, h.ReportType)
			}
		}
	}
	layers = append(layers, tenantLayers...)
	return append(layers, values.Layer{Name: "overrides", Values: r.Watch.OverrideValues}), true
}

// refusedBy records hook h's refusal of the pass; one that waits on
// something outside the resource (hooks.Wait) is looked at again after a
// backoff, as nothing the resource's own watch sees may change it.
func (r *Reconciler) refusedBy(p *pass, d *desired, h *hooks.Hook, err error) {
	reporter{r}.hookRefused(p, h, err)
	if rej, ok := hooks.AsRejection(err); ok && rej.Retry {
		d.retryAfter = r.mem.retryAfter(p.key, "hook:"+h.Name)
	}
}

// observeFresh reads the resource from the API server (the informer cache
// may lag behind a change made elsewhere, such as a block of the upgrade,
// and a pass would act on what it replaced) and the release history. When
// either differs from what d was computed from, d is computed again from
// the new read, and only that value is used from then on.
func (r *Reconciler) observeFresh(ctx context.Context, p *pass, d *desired) (*desired, []*helm.Release, error) {
	changed, err := r.readFresh(ctx, p)
	if err != nil {
		return nil, nil, err
	}
	history, err := r.Helm.History(p.key.Namespace, p.key.Name)
	if err != nil {
		return nil, nil, err
	}
	if exact := (chartVersions{r}).deployedFromHistory(p, lastGood(history)); changed || exact != d.deployed {
		d = r.desire(ctx, p, exact)
	}
	return d, history, nil
}

// readFresh replaces the cached read of the resource by the API server's;
// changed is true when it differs.
func (r *Reconciler) readFresh(ctx context.Context, p *pass) (bool, error) {
	if r.APIReader == nil || p.fresh {
		return false, nil
	}
	if rv := p.obj.GetResourceVersion(); rv != "" && r.mem.get(p.key).wroteRV == rv {
		// The cache shows the resource exactly as the API server returned
		// it to this process's own last write of it (an upgrade that
		// waited for a slot wrote UpgradeQueued): nothing was changed
		// elsewhere since, except what the watch has yet to bring, which
		// a read now would not keep from coming a moment after it either.
		return false, nil
	}
	fresh := &unstructured.Unstructured{}
	fresh.SetGroupVersionKind(r.Watch.GVK)
	if err := r.APIReader.Get(ctx, p.key, fresh); err != nil {
		return false, fmt.Errorf("reading %s: %w", p.key, err)
	}
	if fresh.GetResourceVersion() == p.obj.GetResourceVersion() {
		return false, nil
	}
	p.status, p.orig = r.startStatus(p.key, fresh)
	p.obj = fresh
	p.requested = labelSafe(fresh.GetAnnotations()[v1alpha1.AnnotationReconcileRequestedAt])
	return true, nil
}

// newestRecord is the revision and labels of the newest of records.
func newestRecord(records []map[string]string) (int, map[string]string) {
	var latest map[string]string
	best := 0
	for _, l := range records {
		if v := revisionOf(l); v > best {
			best, latest = v, l
		}
	}
	return best, latest
}

// releaseRecords returns the labels of the resource's release records from
// the metadata cache, read once per pass (the version policy and the fast
// path both need them).
func (r *Reconciler) releaseRecords(ctx context.Context, p *pass) ([]map[string]string, bool) {
	if p.recordsRead {
		return p.records, true
	}
	if r.Helm != nil {
		// The cache merged with this process's own writes of records, which
		// the cache may not show yet.
		if recs, ok := r.Helm.RecordLabels(p.key.Namespace, p.key.Name); ok {
			p.records, p.recordsRead = recs, true
			return recs, true
		}
	}
	if r.Releases == nil {
		return nil, false
	}
	list := &metav1.PartialObjectMetadataList{}
	list.SetGroupVersionKind(corev1.SchemeGroupVersion.WithKind("SecretList"))
	if err := r.Releases.List(ctx, list, client.InNamespace(p.key.Namespace), client.MatchingLabels{
		helm.StorageLabelOwner: helm.StorageOwnerHelm,
		helm.StorageLabelName:  p.key.Name,
	}); err != nil {
		return nil, false
	}
	p.records = make([]map[string]string, len(list.Items))
	for i := range list.Items {
		p.records[i] = list.Items[i].GetLabels()
	}
	p.recordsRead = true
	return p.records, true
}

// stallError is an input error with its own Stalled reason.
type stallError struct {
	reason string
	err    error
}

func (e *stallError) Error() string { return e.err.Error() }
func (e *stallError) Unwrap() error { return e.err }

// asStall keeps a stallError's reason, or gives err the fallback reason.
func asStall(err error, fallback string) *stallError {
	var se *stallError
	if errors.As(err, &se) {
		return se
	}
	return &stallError{fallback, err}
}
