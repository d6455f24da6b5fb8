// Package release is chartpilot's release reconciler. One pass for a
// resource reads it, computes what it asks for (desired: chart version,
// values, identity, hook verdicts) once, observes the Helm release, chooses
// exactly one action with the pure nextAction (Install, Upgrade, Rollback,
// Unlock, Cleanup, CheckHealth, CorrectDrift, a hold, or nothing), runs it,
// and writes the outcome to the resource's status once.
package release

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/go-logr/logr"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/tools/record"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/event"

	"github.com/chartpilot/chartpilot/internal/api/v1alpha1"
	"github.com/chartpilot/chartpilot/internal/helm"
	"github.com/chartpilot/chartpilot/internal/hooks"
	"github.com/chartpilot/chartpilot/internal/kinds"
	"github.com/chartpilot/chartpilot/internal/redact"
	"github.com/chartpilot/chartpilot/internal/source"
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
	// DefaultServiceAccount, when set, is the ServiceAccount (in each
	// resource's namespace) Helm runs as when neither a Tenant nor the watch
	// names one, and locks the operator down: nothing runs as the manager.
	DefaultServiceAccount string
	// Holder names this process on the revisions it starts (see Holder).
	Holder Holder
	// DigestKey keys the values digests shown in status, events and history
	// (HMAC-SHA256): status is read by roles that cannot read Secrets, and
	// a plain hash of the values would let them test guesses of a secret
	// value. Empty: a key made at random per process.
	DigestKey []byte
	// KeepStoredAPIs turns off the rewrite of stored manifests that name
	// API versions the cluster no longer serves (RewriteAPIs).
	KeepStoredAPIs bool

	deps     *dependents
	initOnce sync.Once
	keyOnce  sync.Once
	secrets  secretReads
	mem      memory
	// unavailable holds the resources whose workloads are unavailable
	// (WorkloadsAvailable=False), for the gauge.
	unavailableMu sync.Mutex
	unavailable   map[types.NamespacedName]bool
	slots         slots
	// sourceRefresh rate-limits refreshes of the source asked for by resources.
	sourceRefresh refreshLimiter
	// kick wakes every resource of the kind (a source's versions changed);
	// wake reconciles one resource (a queued upgrade whose slot freed).
	kick chan event.GenericEvent
	wake chan event.GenericEvent
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

// Reconcile runs one pass for a resource: read it, check what needs no
// release (deletion, pause, finalizer, name), then reconcile its release.
func (r *Reconciler) Reconcile(ctx context.Context, req ctrl.Request) (res ctrl.Result, retErr error) {
	start := r.now()
	r.initOnce.Do(wiring{r}.init)
	if err := ctx.Err(); err != nil {
		return ctrl.Result{}, err // shutting down: start nothing new
	}
	// A pass that has begun a Helm action runs to its end: a shutdown
	// (SIGTERM) does not cut the action off half-way, which would leave a
	// failed revision for the next leader to roll back. The action's own
	// timeout bounds the pass, and the manager's graceful shutdown waits
	// longer than that. Before its action, a shutdown ends the pass.
	ctx, cancel := passContext(ctx, PassTimeout(r.Watch))
	defer cancel()
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
	if r.mem.behind(req.NamespacedName, obj.GetResourceVersion()) {
		// The cache has not yet caught up with this process's own last
		// write: a pass on it would act on (and write over) older state.
		// Its event follows shortly; this is a fallback.
		return ctrl.Result{RequeueAfter: 250 * time.Millisecond}, nil
	}
	// What the hooks of this pass look up (the tenant of the namespace) is
	// looked up once.
	ctx = hooks.WithPassMemo(ctx)
	p := r.newPass(req.NamespacedName, obj)
	p.stopped = func() bool { return endedByStop(ctx) }
	defer func() { res, retErr = r.finish(ctx, p, start, res, retErr) }()

	if obj.GetDeletionTimestamp() != nil {
		return r.finalize(ctx, p)
	}
	if res, done, err := r.preflight(ctx, p); done || err != nil {
		return res, err
	}
	res, err := r.reconcileRelease(ctx, p)
	if err != nil {
		return res, err
	}
	res = storageGrowth{r}.followStorage(ctx, p, res)
	return reporter{r}.kindStatus(ctx, p, res)
}

// Acting reports whether this process is acting on key's release: it
// holds an upgrade slot, its health gate waits on the new revision's
// workloads, or the status of a settling action is not yet written.
// The status alone does not say so (it is written once an action has
// settled): other controllers of the same resources ask here.
func (r *Reconciler) Acting(key types.NamespacedName) bool {
	r.initOnce.Do(wiring{r}.init)
	m := r.mem.get(key)
	return m.awaiting || m.owed != nil || r.slots.holds(key)
}

// PassTimeout bounds one pass of a watch's resources: its Helm action
// (watch timeout) and the reads and writes around it.
func PassTimeout(w watches.Watch) time.Duration {
	t := w.Timeout
	if t <= 0 {
		t = watches.DefaultTimeout
	}
	return t + time.Minute
}

// preflight handles what needs no release: a paused resource, the
// finalizer, a name Helm cannot use. done ends the pass.
func (r *Reconciler) preflight(ctx context.Context, p *pass) (ctrl.Result, bool, error) {
	obj := p.obj
	if obj.GetAnnotations()[v1alpha1.AnnotationPause] == "true" {
		setCondition(p.status, p.obj, v1alpha1.ConditionReconciling, metav1.ConditionFalse, "Paused", "chartpilot.dev/pause is set: no action is taken until it is removed")
		return ctrl.Result{}, true, nil
	}
	if !controllerutil.ContainsFinalizer(obj, v1alpha1.Finalizer) {
		patch := client.MergeFromWithOptions(obj.DeepCopy(), client.MergeFromWithOptimisticLock{})
		controllerutil.AddFinalizer(obj, v1alpha1.Finalizer)
		if err := r.Client.Patch(ctx, obj, patch); err != nil {
			return ctrl.Result{}, true, fmt.Errorf("adding finalizer: %w", err)
		}
		p.fresh = true
		r.mem.wrote(p.key, obj.GetResourceVersion())
	}
	if len(obj.GetName()) > maxReleaseName {
		reporter{r}.stall(p, "NameTooLong", fmt.Sprintf("metadata.name: Helm release names are limited to %d characters; this one has %d: use a shorter name", maxReleaseName, len(obj.GetName())))
		return ctrl.Result{}, true, nil
	}
	return ctrl.Result{}, false, nil
}

// reconcileRelease is the release's pipeline: desired → (caches: records
// → observeRecords → gates → nextAction, for what ends on the caches) →
// fresh read and history → observe → gates → nextAction → run.
func (r *Reconciler) reconcileRelease(ctx context.Context, p *pass) (ctrl.Result, error) {
	d := r.desire(ctx, p, chartVersions{r}.deployedFromCache(ctx, p))
	if d.stopped() {
		return r.stop(p, d), nil
	}
	driftDue := r.mem.takeDrift(p.key, p.requested) && r.Watch.WatchDependentResources
	if res, done := r.fromCaches(ctx, p, d, driftDue); done {
		return res, nil
	}
	d, history, err := r.observeFresh(ctx, p, d)
	if r.stallUntrusted(p, err) {
		return ctrl.Result{}, nil
	}
	if err != nil {
		return ctrl.Result{}, err
	}
	if d.stopped() {
		return r.stop(p, d), nil
	}
	o := observe(history, string(p.obj.GetUID()), d.digest, r.mayAdopt(ctx, p, history))
	p.log.V(1).Info("Observed release", "state", o.State, "digest", d.digest)
	if o.Latest != nil && o.State != StateUnmanaged && o.State != StateConflict {
		// status.release always says what the newest revision is.
		reporter{r}.setReleaseInfo(p, o.Latest)
		if r.stallUntrusted(p, r.checkScope(p.key.Namespace, manifestsOf(o)...)) {
			return ctrl.Result{}, nil
		}
	}
	if rec := firstUntrusted(history); rec != nil {
		return r.untrustedRecords(ctx, p, d, o, rec)
	}
	c := r.gatesFor(ctx, p, d, o, history, driftDue)
	return r.run(ctx, p, d, o, history, c)
}

// run carries out the action nextAction chooses.
func (r *Reconciler) run(ctx context.Context, p *pass, d *desired, o Observation, history []*helm.Release, c choice) (ctrl.Result, error) {
	if o.State == StateInSync {
		r.watchObjects(ctx, p, o.Latest)
	}
	f := &fullPass{p: p, d: d, o: o, history: history, c: &c}
	for i := 0; i < maxChoices; i++ {
		f.a = nextAction(o, c.gates)
		res, next, err := stepFor(f.a).full(ctx, r, f)
		if !next {
			return res, err
		}
	}
	return ctrl.Result{}, fmt.Errorf("the pass chose %d actions without ending (the last %s): a step passed its gate without changing it", maxChoices, f.a)
}

// finish writes the pass's outcome: Ready summarised from the other
// conditions, the status written once if it changed, metrics.
func (r *Reconciler) finish(ctx context.Context, p *pass, start time.Time, res ctrl.Result, err error) (ctrl.Result, error) {
	if p.reserved {
		r.slots.end(p.key) // reserved for an upgrade the full pass did not begin
	}
	if endedByStop(ctx) {
		// Nothing was begun that the next pass does not redo; what it
		// would write now could not be written on a cancelled context.
		return ctrl.Result{}, nil
	}
	result := "success"
	switch {
	case err != nil:
		result = "error"
	case res.RequeueAfter > 0:
		result = "requeue"
	}
	if w := p.refreshWait; w > 0 && err == nil && (res.RequeueAfter == 0 || res.RequeueAfter > w) {
		res.RequeueAfter = w // come back for the refresh this resource asked for
	}
	reconcileTotal.WithLabelValues(r.Watch.GVK.Kind, result).Inc()
	reconcileDuration.WithLabelValues(r.Watch.GVK.Kind, result).Observe(time.Since(start).Seconds())
	if p.obj.GetDeletionTimestamp() != nil && !controllerutil.ContainsFinalizer(p.obj, v1alpha1.Finalizer) {
		return res, err // gone once the finalizer is off
	}
	// observedGeneration moves with a pass that ended, not one that erred
	// before it changed anything.
	if err == nil || !apiEqual(p.orig, p.status) {
		summarise(p.status, p.obj)
	}
	if r.owe(p, &res, err) {
		return res, nil
	}
	if werr := (reporter{r}).writeStatus(ctx, p); werr != nil {
		err = errors.Join(err, werr)
	}
	if err != nil {
		// Retried by the controller's rate limiter (milliseconds at first);
		// controller-runtime ignores a requeue time given with an error.
		return ctrl.Result{}, redact.Error(err)
	}
	return res, nil
}

// owe keeps the status of a pass that deployed a revision, or found it
// still settling, in memory instead of writing it, for at most owedMax
// (the next look is due by then): the next pass starts from it and writes
// all their changes at once, which saves one or two status writes per
// install and upgrade whose workloads are ready within owedMax of the
// action. A restart in between loses only the owed history entry (the
// release's own history keeps the revision), and the next process writes
// everything else again from what it observes.
func (r *Reconciler) owe(p *pass, res *ctrl.Result, err error) bool {
	if !p.settling || err != nil || p.extras != nil || res.RequeueAfter <= 0 || p.obj.GetDeletionTimestamp() != nil {
		return false
	}
	now, owe := r.now(), false
	redactStatus(p.status)
	st := p.status.DeepCopy()
	r.mem.with(p.key, func(m *memo) {
		since := m.owedSince
		if m.owed == nil {
			since = now
		}
		left := r.owedFor() - now.Sub(since)
		if left <= 0 {
			return
		}
		owe = true
		m.owed, m.owedUID, m.owedSince = st, p.obj.GetUID(), since
		// The next look comes by the time the status must be written.
		res.RequeueAfter = min(res.RequeueAfter, left)
	})
	return owe
}

// owedFor is how long a status may be owed: owedMax, or a quarter of the
// health timeout when that is shorter, so that a release that is going to
// fail its health gate is seen settling first.
func (r *Reconciler) owedFor() time.Duration {
	if t := r.Watch.HealthTimeout / 4; t > 0 && t < owedMax {
		return t
	}
	return owedMax
}

// forget drops what this process remembers of a resource that is gone.
func (r *Reconciler) forget(key types.NamespacedName) {
	reporter{r}.setInfoSeries(key, [3]string{})
	reporter{r}.setAPISeries(key, nil)
	r.mem.forget(key)
	r.slots.forget(key)
	healthGate{r}.setUnavailable(key, false)
	r.sourceRefresh.forget(key)
}

// setWaiting records why key waits ("" for not waiting); a queued
// resource holds a place in the upgrade queue.
func (r *Reconciler) setWaiting(key types.NamespacedName, reason string) {
	r.mem.setWaiting(key, reason)
	if reason == reasonQueued {
		r.slots.enqueue(key)
	} else {
		r.slots.dequeue(key)
	}
}

// oneLine keeps an error message to a single line for conditions and
// events, without the values input was rejected for (redact.Text).
func oneLine(s string) string {
	s = strings.Join(strings.Fields(redact.Text(s)), " ")
	if len(s) > 1024 {
		s = s[:1021] + "..."
	}
	return s
}
