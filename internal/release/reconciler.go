// Package release is chartpilot's release reconciler: for every custom
// resource of a watched kind it observes the Helm release, then takes exactly
// one action (Install, Upgrade, Rollback, Uninstall, Unlock, CorrectDrift) or
// none, and writes the outcome to the resource's status, events and metrics.
package release

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/tools/record"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/event"

	"github.com/chartpilot/chartpilot/hooks"
	"github.com/chartpilot/chartpilot/internal/api/v1alpha1"
	"github.com/chartpilot/chartpilot/internal/helm"
	"github.com/chartpilot/chartpilot/internal/kinds"
	"github.com/chartpilot/chartpilot/internal/source"
	"github.com/chartpilot/chartpilot/internal/values"
	"github.com/chartpilot/chartpilot/internal/watches"
)

// maxReleaseName is Helm's limit on release names.
const maxReleaseName = 53

// Reconciler reconciles one watched kind.
type Reconciler struct {
	Watch watches.Watch
	// Source provides the chart's versions; the version policy picks one per resource.
	Source source.Source
	Helm   *helm.Client
	Client client.Client
	// Releases reads release records' metadata from a cache (see SetupWithManager).
	Releases client.Reader
	// APIReader reads the resource from the API server, bypassing the cache.
	APIReader client.Reader
	Dynamic   dynamic.Interface
	Recorder  record.EventRecorder
	Log       logr.Logger
	// Kind is the typed kind's translator and status reporter (zero: passthrough).
	Kind kinds.Kind
	// Hooks are the watch's hooks, in order.
	Hooks []*hooks.Hook
	// Now is the clock (tests may replace it).
	Now func() time.Time

	deps *dependents

	mu sync.Mutex
	// driftCheck holds resources whose objects may have drifted: flagged by
	// dependent events, on the first pass after start, and on a reconcile request.
	driftCheck map[types.NamespacedName]bool
	// seen holds the resources reconciled since start, and the
	// reconcile-requested-at value last handled.
	seen map[types.NamespacedName]string
	// failures remembers failed actions in this process (see backoff).
	failures map[types.NamespacedName]v1alpha1.Failure
	// statusSettled holds resources whose Kind.Status asked for nothing more.
	statusSettled map[types.NamespacedName]bool
	// healthyRev is the revision last seen healthy, per resource.
	healthyRev map[types.NamespacedName]int
	// upgrading holds the resources upgrading now (bounded by maxConcurrentUpgrades).
	upgrading map[types.NamespacedName]bool
	// awaiting holds resources whose health gate waits on their workloads.
	awaiting map[types.NamespacedName]bool
	// refreshTokens is the reconcile-requested-at value that last refreshed
	// the source, per resource; lastRefresh rate-limits those refreshes.
	refreshTokens map[types.NamespacedName]string
	lastRefresh   time.Time
	// waiting holds the resources a rollout gate holds, by reason (metrics).
	waiting map[types.NamespacedName]string
	// kick wakes every resource of the kind (a source's versions changed).
	kick chan event.GenericEvent
	// queue holds the resources waiting for an upgrade slot, oldest first;
	// wake reconciles one of them when a slot frees.
	queue []types.NamespacedName
	wake  chan event.GenericEvent
}

func (r *Reconciler) now() time.Time {
	if r.Now != nil {
		return r.Now()
	}
	return time.Now()
}

func (r *Reconciler) ownerKind() string {
	return r.Watch.GVK.Kind + "." + r.Watch.GVK.Group
}

// pass carries one reconcile's inputs and outputs.
type pass struct {
	obj    *unstructured.Unstructured
	key    types.NamespacedName
	status *v1alpha1.ReleaseStatus
	// orig is the status as read, to write only what changed.
	orig *v1alpha1.ReleaseStatus
	// extras are the kind's own status fields (Kind.Status), nil if not computed.
	extras map[string]any
	log    logr.Logger

	vals   map[string]any
	digest string
	force  string
	// hobj is what hooks see of the resource; identity is the user Helm
	// actions run as ("" for the operator itself).
	hobj     hooks.Object
	identity string
	// blocked is set when a hook refused the resource or version policy
	// holds it: no action is taken (retryAfter > 0: look again then).
	blocked    bool
	retryAfter time.Duration

	// chart is the chart version chosen for this pass.
	chart *helm.Chart
	// deployed is what runs now; exact once read from the release history.
	deployed      deployedState
	deployedExact bool
	// appMajor is the software major version asked for (Kind.AppMajor).
	appMajor string
	// refreshWait > 0: a refresh the resource asked for must wait this long.
	refreshWait time.Duration
	// records are the labels of the release records (metadata cache), once read.
	records     []map[string]string
	recordsRead bool
}

// Reconcile runs one pass for a resource.
func (r *Reconciler) Reconcile(ctx context.Context, req ctrl.Request) (res ctrl.Result, retErr error) {
	start := r.now()
	log := r.Log.WithValues(strings.ToLower(r.Watch.GVK.Kind), req.NamespacedName)
	obj := &unstructured.Unstructured{}
	obj.SetGroupVersionKind(r.Watch.GVK)
	if err := r.Client.Get(ctx, req.NamespacedName, obj); err != nil {
		if apierrors.IsNotFound(err) {
			r.forget(req.NamespacedName)
			return ctrl.Result{}, nil
		}
		return ctrl.Result{}, err
	}
	if r.Watch.Selector != nil && !r.Watch.Selector.Matches(labels.Set(obj.GetLabels())) {
		return ctrl.Result{}, nil
	}
	st := readStatus(obj)
	p := &pass{obj: obj, key: req.NamespacedName, status: st, orig: st.DeepCopy(), log: log}
	defer func() {
		result := "success"
		switch {
		case retErr != nil:
			result = "error"
		case res.RequeueAfter > 0:
			result = "requeue"
		}
		if w := p.refreshWait; w > 0 && retErr == nil && (res.RequeueAfter == 0 || res.RequeueAfter > w) {
			res.RequeueAfter = w // come back for the refresh this resource asked for
		}
		reconcileTotal.WithLabelValues(r.Watch.GVK.Kind, result).Inc()
		reconcileDuration.WithLabelValues(r.Watch.GVK.Kind, result).Observe(time.Since(start).Seconds())
		if p.obj.GetDeletionTimestamp() != nil && !controllerutil.ContainsFinalizer(p.obj, v1alpha1.Finalizer) {
			return // gone once the finalizer is off
		}
		if err := r.writeStatus(ctx, p); err != nil {
			retErr = errors.Join(retErr, err)
		}
	}()

	if obj.GetDeletionTimestamp() != nil {
		return r.finalize(ctx, p)
	}
	if obj.GetAnnotations()[v1alpha1.AnnotationPause] == "true" {
		setCondition(p.status, obj, v1alpha1.ConditionReconciling, metav1.ConditionFalse, "Paused", "chartpilot.dev/pause is set: no action is taken until it is removed")
		summarise(p.status, obj)
		return ctrl.Result{}, nil
	}
	if !controllerutil.ContainsFinalizer(obj, v1alpha1.Finalizer) {
		patch := client.MergeFromWithOptions(obj.DeepCopy(), client.MergeFromWithOptimisticLock{})
		controllerutil.AddFinalizer(obj, v1alpha1.Finalizer)
		if err := r.Client.Patch(ctx, obj, patch); err != nil {
			return ctrl.Result{}, fmt.Errorf("adding finalizer: %w", err)
		}
	}
	if len(obj.GetName()) > maxReleaseName {
		r.stall(p, "NameTooLong", fmt.Sprintf("metadata.name: Helm release names are limited to %d characters; this one has %d: use a shorter name", maxReleaseName, len(obj.GetName())))
		return ctrl.Result{}, nil
	}
	if res, stop := r.decide(ctx, p); stop {
		return res, nil
	}
	res, err := r.act(ctx, p)
	if err != nil {
		return res, err
	}
	return r.kindStatus(ctx, p, res)
}

// decide computes the desired inputs; stop is true when no action may
// follow (bad input stalls the resource, or policy or a hook holds it).
func (r *Reconciler) decide(ctx context.Context, p *pass) (res ctrl.Result, stop bool) {
	if err := r.desired(ctx, p); err != nil {
		r.stall(p, stallReason(err), err.Error())
		return ctrl.Result{}, true
	}
	if p.blocked {
		summarise(p.status, p.obj)
		return ctrl.Result{RequeueAfter: p.retryAfter}, true
	}
	return ctrl.Result{}, false
}

// kindStatus runs Kind.Status once the release is deployed from the current
// inputs, unless it said last time that nothing more was to be seen.
func (r *Reconciler) kindStatus(ctx context.Context, p *pass, res ctrl.Result) (ctrl.Result, error) {
	if r.Kind.Status == nil {
		return res, nil
	}
	c := apimeta.FindStatusCondition(p.status.Conditions, v1alpha1.ConditionReleased)
	if c == nil || c.Status != metav1.ConditionTrue {
		r.setSettled(p.key, false)
		return res, nil
	}
	r.mu.Lock()
	settled := r.statusSettled[p.key]
	r.mu.Unlock()
	if settled {
		return res, nil
	}
	reader := r.APIReader
	if reader == nil {
		reader = r.Client
	}
	extras, again, err := r.Kind.Status(ctx, reader, p.obj)
	if err != nil {
		return res, fmt.Errorf("reporting %s status: %w", r.Watch.GVK.Kind, err)
	}
	p.extras = extras
	r.setSettled(p.key, again == 0)
	if again > 0 && (res.RequeueAfter == 0 || again < res.RequeueAfter) {
		res.RequeueAfter = again
	}
	return res, nil
}

func (r *Reconciler) setSettled(key types.NamespacedName, settled bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.statusSettled == nil {
		r.statusSettled = map[types.NamespacedName]bool{}
	}
	if settled {
		r.statusSettled[key] = true
	} else {
		delete(r.statusSettled, key)
	}
}

// desired runs the hooks' checks and computes the final values and the
// digest of all inputs.
func (r *Reconciler) desired(ctx context.Context, p *pass) error {
	p.blocked, p.retryAfter, p.identity = false, 0, ""
	if err := r.selectChart(ctx, p); err != nil || p.blocked {
		return err
	}
	hobj, crVals, err := r.Kind.Object(p.obj, p.chart.Name, p.chart.Version)
	if err != nil {
		return err
	}
	p.hobj = hobj
	layers := []values.Layer{{Name: "cr", Values: crVals}}
	var tenantLayers []values.Layer
	for _, h := range r.Hooks {
		if h.Validator != nil {
			if err := h.Validator.Validate(ctx, p.hobj); err != nil {
				r.hookRefused(p, h, err)
				return nil
			}
			r.hookPassed(p, h)
		}
		if h.Identity != nil {
			id, err := h.Identity(ctx, p.hobj)
			if err != nil {
				r.hookRefused(p, h, err)
				return nil
			}
			if id != "" {
				p.identity = id
			}
		}
		if h.Values != nil {
			v, err := h.Values.Values(ctx, p.hobj)
			if err != nil {
				r.hookRefused(p, h, err)
				return nil
			}
			l := values.Layer{Name: "hook:" + h.Name, Values: v}
			if h.ValuesLayer == hooks.LayerTenant {
				tenantLayers = append(tenantLayers, l)
			} else {
				layers = append(layers, l)
			}
		}
	}
	layers = append(layers, tenantLayers...)
	layers = append(layers, values.Layer{Name: "overrides", Values: r.Watch.OverrideValues})
	p.vals = values.Merge(layers...)
	p.force = p.obj.GetAnnotations()[v1alpha1.AnnotationForceUpgrade]
	digest, err := values.Digest(p.chart.Digest, p.vals, map[string]string{v1alpha1.AnnotationForceUpgrade: p.force})
	if err != nil {
		return err
	}
	p.digest = digest
	return nil
}

// act observes the release and runs the one action it calls for.
func (r *Reconciler) act(ctx context.Context, p *pass) (ctrl.Result, error) {
	// The token as stored in labels, so that all failure records compare alike.
	requested := labelSafe(p.obj.GetAnnotations()[v1alpha1.AnnotationReconcileRequestedAt])
	checkDrift := r.takeDriftFlag(p.key, requested)

	// Fast path: from the release records' metadata alone, the release is
	// deployed from exactly these inputs; unless a drift check is due there
	// is nothing to read, render or write.
	// Health is judged for the revision the records show, not the one the
	// (possibly older) status names: a fresh upgrade must pass the health
	// gate, which also gives its upgrade slot back.
	if rev, ok := r.inSyncFromCache(ctx, p); !checkDrift && ok && r.healthy(p.key, rev) {
		rendersSkipped.WithLabelValues(r.Watch.GVK.Kind).Inc()
		r.markInSync(p, nil)
		return ctrl.Result{RequeueAfter: r.Watch.ReconcilePeriod}, nil
	}

	// A chart version upgrade that a rollout gate holds is looked at again
	// from the caches alone: a fleet waiting for canaries or a maintenance
	// window costs no API request.
	if !checkDrift && p.isVersionChange() && r.isGated(p.key) {
		if res, hold := r.rolloutGate(ctx, p); hold {
			return res, nil
		}
	}

	// Beyond the fast path every decision and status write builds on what
	// the resource says now: the informer cache may lag behind this
	// reconciler's own last status write (and a decision on a stale status
	// would undo it).
	if err := r.refresh(ctx, p); err != nil {
		return ctrl.Result{}, err
	}
	history, err := r.Helm.History(p.key.Namespace, p.key.Name)
	if err != nil {
		return ctrl.Result{}, err
	}
	adopt := p.obj.GetAnnotations()[v1alpha1.AnnotationAdopt] == "true"
	o := observe(history, string(p.obj.GetUID()), p.digest, adopt)
	// Version policy decided on the cached view of what runs; the history
	// is exact. If they differ, decide again.
	if d := r.deployedFromHistory(p, o); d != p.deployed {
		p.deployed, p.deployedExact = d, true
		if res, stop := r.decide(ctx, p); stop {
			return res, nil
		}
		o = observe(history, string(p.obj.GetUID()), p.digest, adopt)
	}
	p.log.V(1).Info("Observed release", "state", o.State, "digest", p.digest)
	if o.Latest != nil && o.State != StateUnmanaged && o.State != StateConflict {
		// status.release always says what the newest revision is.
		r.setReleaseInfo(p, o.Latest)
	}

	switch o.State {
	case StateAbsent:
		if wait := r.backoff(p, "Install", requested, nil); wait > 0 {
			return ctrl.Result{RequeueAfter: wait}, nil
		}
		return r.install(ctx, p)
	case StateUnmanaged:
		r.stall(p, "ReleaseNotManaged", fmt.Sprintf("a Helm release %q already exists in %s and was not installed by chartpilot: nothing was changed; set annotation %s: \"true\" to take it over, or rename this resource", p.key.Name, p.key.Namespace, v1alpha1.AnnotationAdopt))
		return ctrl.Result{}, nil
	case StateConflict:
		r.stall(p, "ReleaseConflict", fmt.Sprintf("the Helm release %q in %s belongs to another object (uid %s, kind %s): nothing was changed; rename this resource or uninstall the other release", p.key.Name, p.key.Namespace, o.Latest.Labels[LabelOwnerUID], o.Latest.Labels[LabelOwnerKind]))
		return ctrl.Result{}, nil
	case StateLocked:
		return r.unlock(p, o)
	case StateInterrupted:
		if o.LastGood == nil {
			return r.cleanupFailedInstall(p, o, requested, true)
		}
		if !r.beginUpgrade(p.key) {
			return r.queued(p), nil
		}
		return r.upgrade(ctx, p, o)
	case StateUninstalling:
		return r.cleanupFailedInstall(p, o, requested, true)
	case StateFailedInstall:
		return r.cleanupFailedInstall(p, o, requested, false)
	case StateFailedUpgrade:
		return r.rollback(p, o)
	case StateOutOfSync:
		if bad, ok := unhealthyFailure(history, p.digest, requested); ok {
			setCondition(p.status, p.obj, v1alpha1.ConditionReconciling, metav1.ConditionTrue, "UpgradeFailed",
				fmt.Sprintf("these inputs were rolled back (revision %d: %s); change the spec or set %s to try again", bad.Revision, strings.TrimPrefix(bad.Description, unhealthyPrefix), v1alpha1.AnnotationReconcileRequestedAt))
			summarise(p.status, p.obj)
			return ctrl.Result{RequeueAfter: r.Watch.ReconcilePeriod}, nil
		}
		if wait := r.backoff(p, "Upgrade", requested, history); wait > 0 {
			return ctrl.Result{RequeueAfter: wait}, nil
		}
		if p.isVersionChange() {
			if res, hold := r.rolloutGate(ctx, p); hold {
				return res, nil
			}
		}
		if !r.beginUpgrade(p.key) {
			return r.queued(p), nil
		}
		r.setWaiting(p.key, "")
		return r.upgrade(ctx, p, o)
	case StateInSync:
		if r.deps != nil {
			if err := r.deps.ensure(ctx, r, o.Latest.Manifest); err != nil {
				p.log.Error(err, "Failed to watch the release's objects")
			}
		}
		if !r.healthy(p.key, o.Latest.Revision) {
			res, ok, err := r.checkHealth(ctx, p, o, history)
			if err != nil || !ok {
				return res, err
			}
		}
		if checkDrift {
			return r.correctDrift(ctx, p, o)
		}
		r.markInSync(p, o.Latest)
		return ctrl.Result{RequeueAfter: r.Watch.ReconcilePeriod}, nil
	}
	return ctrl.Result{}, fmt.Errorf("unhandled release state %s", o.State)
}

// inSyncFromCache reports whether the newest release record, as the
// metadata cache sees it, is deployed from the desired digest by this owner,
// and its revision.
func (r *Reconciler) inSyncFromCache(ctx context.Context, p *pass) (int, bool) {
	records, ok := r.releaseRecords(ctx, p)
	if !ok {
		return 0, false
	}
	var latest map[string]string
	best := 0
	for _, l := range records {
		if v := revisionOf(l); v > best {
			best, latest = v, l
		}
	}
	if latest == nil || p.status.Release == nil || best < p.status.Release.Revision {
		return 0, false // absent, or the cache lags behind what this operator did
	}
	return best, latest[helm.StorageLabelStatus] == string(helm.StatusDeployed) &&
		latest[LabelDigest] == p.digest &&
		latest[LabelOwnerUID] == string(p.obj.GetUID())
}

// releaseRecords returns the labels of the resource's release records from
// the metadata cache, read once per pass (the version policy and the fast
// path both need them).
func (r *Reconciler) releaseRecords(ctx context.Context, p *pass) ([]map[string]string, bool) {
	if p.recordsRead {
		return p.records, true
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

// takeDriftFlag reports whether a drift check is due, and clears the flag.
func (r *Reconciler) takeDriftFlag(key types.NamespacedName, requested string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.driftCheck == nil {
		r.driftCheck = map[types.NamespacedName]bool{}
		r.seen = map[types.NamespacedName]string{}
	}
	last, seen := r.seen[key]
	due := r.driftCheck[key] || !seen || last != requested
	delete(r.driftCheck, key)
	r.seen[key] = requested
	return due && r.Watch.WatchDependentResources
}

// flagDrift asks for a drift check on the next pass.
func (r *Reconciler) flagDrift(key types.NamespacedName) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.driftCheck == nil {
		r.driftCheck = map[types.NamespacedName]bool{}
		r.seen = map[types.NamespacedName]string{}
	}
	r.driftCheck[key] = true
}

func (r *Reconciler) forget(key types.NamespacedName) {
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.driftCheck, key)
	delete(r.seen, key)
	delete(r.failures, key)
	delete(r.statusSettled, key)
	delete(r.healthyRev, key)
	delete(r.awaiting, key)
	delete(r.upgrading, key)
	delete(r.refreshTokens, key)
	r.setWaitingLocked(key, "")
	releaseInfo.DeletePartialMatch(map[string]string{"kind": r.Watch.GVK.Kind, "namespace": key.Namespace, "name": key.Name})
}

// actionOptions are the Helm inputs of install and upgrade.
func (r *Reconciler) actionOptions(p *pass, description string) helm.ActionOptions {
	return helm.ActionOptions{
		Namespace: p.key.Namespace,
		Name:      p.key.Name,
		Values:    p.vals,
		Labels: map[string]string{
			LabelOwnerUID:     string(p.obj.GetUID()),
			LabelOwnerKind:    r.ownerKind(),
			LabelDigest:       p.digest,
			LabelForceToken:   labelSafe(p.force),
			LabelRequestedAt:  labelSafe(p.obj.GetAnnotations()[v1alpha1.AnnotationReconcileRequestedAt]),
			LabelChartVersion: labelSafe(p.chart.Version),
			LabelAppMajor:     labelSafe(p.appMajor),
		},
		Decorate:    r.decorator(p.obj),
		Timeout:     r.Watch.Timeout,
		MaxHistory:  r.Watch.MaxHistory,
		Description: description,
	}
}

// labelSafe makes an annotation value usable as a label value (or empty).
func labelSafe(s string) string {
	out := make([]rune, 0, len(s))
	for _, c := range s {
		if (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' || c == '_' || c == '.' {
			out = append(out, c)
		}
	}
	if len(out) > 63 {
		out = out[len(out)-63:]
	}
	return strings.Trim(string(out), "-_.")
}

// decorator labels every object of the release so that dependent informers
// can select exactly chartpilot's objects, records the owner in an
// annotation (the only way for cluster-scoped and cross-namespace objects),
// and adds an owner reference where Kubernetes allows one.
func (r *Reconciler) decorator(owner *unstructured.Unstructured) helm.Decorator {
	ownerRef := metav1.OwnerReference{
		APIVersion:         owner.GetAPIVersion(),
		Kind:               owner.GetKind(),
		Name:               owner.GetName(),
		UID:                owner.GetUID(),
		BlockOwnerDeletion: ptrFalse(),
	}
	ownerAnn := r.ownerKind() + "/" + owner.GetNamespace() + "/" + owner.GetName()
	return func(obj *unstructured.Unstructured) error {
		labels := obj.GetLabels()
		if labels == nil {
			labels = map[string]string{}
		}
		labels[LabelRelease] = owner.GetName()
		obj.SetLabels(labels)
		ann := obj.GetAnnotations()
		if ann == nil {
			ann = map[string]string{}
		}
		ann[AnnotationOwner] = ownerAnn
		obj.SetAnnotations(ann)
		ns := obj.GetNamespace()
		sameNS := ns == "" || ns == owner.GetNamespace()
		// Objects Helm keeps on uninstall (data volumes) never get an owner
		// reference: garbage collection would delete them with the owner.
		keep := strings.Contains(ann["helm.sh/resource-policy"], "keep")
		if sameNS && !keep {
			if namespaced, err := r.Helm.IsNamespaced(obj.GroupVersionKind()); err == nil && namespaced {
				refs := obj.GetOwnerReferences()
				for _, ref := range refs {
					if ref.UID == ownerRef.UID {
						return nil
					}
				}
				obj.SetOwnerReferences(append(refs, ownerRef))
			}
		}
		return nil
	}
}

func ptrFalse() *bool { b := false; return &b }

// readStatus decodes the resource's status.
// A status someone else wrote in another shape is replaced, not fatal.
func readStatus(obj *unstructured.Unstructured) *v1alpha1.ReleaseStatus {
	st := &v1alpha1.ReleaseStatus{}
	raw, ok := obj.Object["status"].(map[string]any)
	if !ok || raw == nil {
		return st
	}
	if runtime.DefaultUnstructuredConverter.FromUnstructured(raw, st) != nil {
		return &v1alpha1.ReleaseStatus{}
	}
	return st
}

// refresh re-reads the resource from the API server (not the cache) and
// recomputes the desired inputs from it.
func (r *Reconciler) refresh(ctx context.Context, p *pass) error {
	if r.APIReader == nil {
		return nil
	}
	fresh := &unstructured.Unstructured{}
	fresh.SetGroupVersionKind(r.Watch.GVK)
	if err := r.APIReader.Get(ctx, p.key, fresh); err != nil {
		return fmt.Errorf("reading %s: %w", p.key, err)
	}
	if fresh.GetResourceVersion() == p.obj.GetResourceVersion() {
		return nil
	}
	st := readStatus(fresh)
	p.obj, p.status, p.orig = fresh, st, st.DeepCopy()
	return r.desired(ctx, p)
}

// writeStatus patches the status subresource when, and only when, it
// changed, with optimistic locking: a status computed from a stale read is
// refused by the API server instead of undoing a newer write. This
// reconciler is the only writer of the status, so on a conflict it applies
// its status once more on top of a fresh read.
func (r *Reconciler) writeStatus(ctx context.Context, p *pass) error {
	current, _ := p.obj.Object["status"].(map[string]any)
	changed := !apiEqual(p.orig, p.status)
	for k, v := range p.extras {
		if !equality.Semantic.DeepEqual(current[k], v) {
			changed = true
		}
	}
	if !changed {
		return nil
	}
	raw, err := runtime.DefaultUnstructuredConverter.ToUnstructured(p.status)
	if err != nil {
		return err
	}
	base := p.obj
	for attempt := 0; ; attempt++ {
		withStatus := base.DeepCopy()
		// The kind's own fields are kept (or replaced by p.extras); the
		// shared fields are entirely this reconciler's.
		merged := map[string]any{}
		if cur, ok := base.Object["status"].(map[string]any); ok {
			for k, v := range cur {
				merged[k] = v
			}
		}
		for _, k := range []string{"observedGeneration", "conditions", "release", "chart", "history", "lastFailure"} {
			delete(merged, k)
		}
		for k, v := range raw {
			merged[k] = v
		}
		for k, v := range p.extras {
			if v == nil {
				delete(merged, k)
			} else {
				merged[k] = v
			}
		}
		withStatus.Object["status"] = merged
		err := r.Client.Status().Patch(ctx, withStatus, client.MergeFromWithOptions(base, client.MergeFromWithOptimisticLock{}))
		switch {
		case err == nil, apierrors.IsNotFound(err):
			return nil
		case apierrors.IsConflict(err) && attempt == 0 && r.APIReader != nil:
			fresh := &unstructured.Unstructured{}
			fresh.SetGroupVersionKind(r.Watch.GVK)
			if err := r.APIReader.Get(ctx, p.key, fresh); err != nil {
				return fmt.Errorf("writing status: %w", err)
			}
			base = fresh
		default:
			return fmt.Errorf("writing status: %w", err)
		}
	}
}

// setCondition sets a condition; LastTransitionTime moves only on a flip
// (apimeta.SetStatusCondition keeps it otherwise).
func setCondition(st *v1alpha1.ReleaseStatus, obj *unstructured.Unstructured, typ string, status metav1.ConditionStatus, reason, msg string) {
	apimeta.SetStatusCondition(&st.Conditions, metav1.Condition{
		Type:               typ,
		Status:             status,
		Reason:             reason,
		Message:            msg,
		ObservedGeneration: obj.GetGeneration(),
	})
}

// summarise derives Ready from the other conditions and moves observedGeneration.
func summarise(st *v1alpha1.ReleaseStatus, obj *unstructured.Unstructured) {
	st.ObservedGeneration = obj.GetGeneration()
	get := func(t string) *metav1.Condition { return apimeta.FindStatusCondition(st.Conditions, t) }
	switch stalled, released, reconciling, drifted := get(v1alpha1.ConditionStalled), get(v1alpha1.ConditionReleased), get(v1alpha1.ConditionReconciling), get(v1alpha1.ConditionDrifted); {
	case stalled != nil && stalled.Status == metav1.ConditionTrue:
		setCondition(st, obj, v1alpha1.ConditionReady, metav1.ConditionFalse, stalled.Reason, stalled.Message)
	case reconciling != nil && reconciling.Reason == "Paused":
		setCondition(st, obj, v1alpha1.ConditionReady, metav1.ConditionUnknown, "Paused", reconciling.Message)
	case released == nil || released.Status != metav1.ConditionTrue:
		reason, msg := "Progressing", "the release is not deployed yet"
		if released != nil {
			reason, msg = released.Reason, released.Message
		}
		setCondition(st, obj, v1alpha1.ConditionReady, metav1.ConditionFalse, reason, msg)
	case blockedSummary(st) != nil:
		c := blockedSummary(st)
		setCondition(st, obj, v1alpha1.ConditionReady, metav1.ConditionFalse, c.Reason, c.Message)
	case blockingHookCondition(st) != nil:
		c := blockingHookCondition(st)
		setCondition(st, obj, v1alpha1.ConditionReady, metav1.ConditionFalse, c.Reason, c.Message)
	case drifted != nil && drifted.Status == metav1.ConditionTrue:
		setCondition(st, obj, v1alpha1.ConditionReady, metav1.ConditionFalse, drifted.Reason, drifted.Message)
	case reconciling != nil && reconciling.Status == metav1.ConditionTrue:
		setCondition(st, obj, v1alpha1.ConditionReady, metav1.ConditionFalse, reconciling.Reason, reconciling.Message)
	default:
		setCondition(st, obj, v1alpha1.ConditionReady, metav1.ConditionTrue, released.Reason, released.Message)
	}
}

// blockingHookCondition returns a hook's False condition, if any: a hook that
// refuses a resource makes it not Ready.
func blockingHookCondition(st *v1alpha1.ReleaseStatus) *metav1.Condition {
	for i := range st.Conditions {
		c := &st.Conditions[i]
		switch c.Type {
		case v1alpha1.ConditionReady, v1alpha1.ConditionReleased, v1alpha1.ConditionReconciling, v1alpha1.ConditionStalled, v1alpha1.ConditionDrifted,
			v1alpha1.ConditionUpgradeBlocked, v1alpha1.ConditionSourceAvailable:
			continue
		}
		if c.Status == metav1.ConditionFalse {
			return c
		}
	}
	return nil
}
