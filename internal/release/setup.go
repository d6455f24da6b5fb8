package release

import (
	"context"
	"fmt"
	"maps"
	"net/http"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/selection"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/rest"
	toolscache "k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/workqueue"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/source"

	"github.com/chartpilot/chartpilot/internal/api/v1alpha1"
	"github.com/chartpilot/chartpilot/internal/helm"
	"github.com/chartpilot/chartpilot/internal/redact"
	"github.com/chartpilot/chartpilot/internal/watches"
)

// objectCacheWait bounds a read of the object cache for Helm (an informer
// still syncing is not waited for longer: the read goes to the API server).
const objectCacheWait = 10 * time.Second

// CacheByObject restricts the manager's cache of each watched kind to the
// watch's selector, so an operator shard caches only the resources it owns,
// and keeps the resources compacted (see compactField): the manager's
// client must read them through NewClient.
func CacheByObject(ws []watches.Watch) map[client.Object]cache.ByObject {
	out := map[client.Object]cache.ByObject{}
	for _, w := range ws {
		u := &unstructured.Unstructured{}
		u.SetGroupVersionKind(w.GVK)
		out[u] = cache.ByObject{Label: w.Selector, Transform: compactObject}
	}
	return out
}

// NewClient is the manager's client (a client.NewClientFunc): reads from
// the cache come back whole from compacted objects (CacheByObject).
func NewClient(cfg *rest.Config, opts client.Options) (client.Client, error) {
	if opts.Cache != nil && opts.Cache.Reader != nil {
		opts.Cache.Reader = compactReader{Reader: opts.Cache.Reader}
	}
	return client.New(cfg, opts)
}

// Shared holds what all reconcilers of one manager share: the Helm client and
// two caches: the metadata of Helm's release records (owner=helm; not their
// contents), and the objects of chartpilot's releases (label
// chartpilot.dev/release), kept compacted and read whole (compactCache).
type Shared struct {
	Helm       *helm.Client
	Dynamic    dynamic.Interface
	Releases   cache.Cache
	Dependents cache.Cache
	// watchedKinds are the kinds Dependents has an informer of (started by
	// a controller's watch of its releases' objects): Helm's reads are
	// answered from the cache for these only, and never start an informer.
	watchedKinds *sync.Map
	// SkipNameValidation allows several managers in one process (tests).
	SkipNameValidation bool
	// DigestKey keys the digests shown in status (see Reconciler.DigestKey).
	DigestKey []byte
}

// recordNameIndex indexes the release records' cache by release name.
const recordNameIndex = "chartpilot.dev/record-release-name"

// NewShared builds the shared clients and caches and adds the caches to mgr.
func NewShared(mgr manager.Manager) (*Shared, error) {
	cfg := mgr.GetConfig()
	hc, err := helm.NewClient(cfg, redact.Logger(mgr.GetLogger().WithName("helm")))
	if err != nil {
		return nil, err
	}
	dyn, err := dynamic.NewForConfig(cfg)
	if err != nil {
		return nil, err
	}
	newCache := func(sel labels.Selector, transform toolscache.TransformFunc) (cache.Cache, error) {
		return cache.New(cfg, cache.Options{
			HTTPClient:           mgr.GetHTTPClient(),
			Scheme:               mgr.GetScheme(),
			Mapper:               mgr.GetRESTMapper(),
			DefaultLabelSelector: sel,
			DefaultTransform:     transform,
		})
	}
	// Only the records' metadata is ever read: Helm's records and the
	// chunks of records too large for one Secret.
	owners, err := labels.NewRequirement(helm.StorageLabelOwner, selection.In, []string{helm.StorageOwnerHelm, helm.StorageOwnerChunk})
	if err != nil {
		return nil, err
	}
	releases, err := newCache(labels.NewSelector().Add(*owners), cache.TransformStripManagedFields())
	if err != nil {
		return nil, err
	}
	hasRelease, err := labels.NewRequirement(v1alpha1.LabelRelease, selection.Exists, nil)
	if err != nil {
		return nil, err
	}
	// Whole objects, kept compacted (see compactField) and read through
	// compactCache.
	rawDeps, err := newCache(labels.NewSelector().Add(*hasRelease), compactObject)
	if err != nil {
		return nil, err
	}
	deps := compactCache{Cache: rawDeps}
	if err := mgr.Add(releases); err != nil {
		return nil, err
	}
	if err := mgr.Add(rawDeps); err != nil {
		return nil, err
	}
	// The records are indexed by release name: a history read looks at
	// its release's records only, not at every record in the namespace.
	record := &metav1.PartialObjectMetadata{}
	record.SetGroupVersionKind(corev1.SchemeGroupVersion.WithKind("Secret"))
	if err := releases.IndexField(context.Background(), record, recordNameIndex, func(o client.Object) []string {
		return []string{o.GetLabels()[helm.StorageLabelName]}
	}); err != nil {
		return nil, err
	}
	// Release history comes from the records' metadata cache, each body
	// read at most once per version.
	hc.UseRecordIndex(func(ctx context.Context, namespace string, match map[string]string) ([]metav1.ObjectMeta, error) {
		list := &metav1.PartialObjectMetadataList{}
		list.SetGroupVersionKind(corev1.SchemeGroupVersion.WithKind("SecretList"))
		opts := []client.ListOption{client.InNamespace(namespace), client.MatchingLabels(match)}
		if name, ok := match[helm.StorageLabelName]; ok {
			opts = append(opts, client.MatchingFields{recordNameIndex: name})
		}
		if err := releases.List(ctx, list, opts...); err != nil {
			return nil, err
		}
		out := make([]metav1.ObjectMeta, len(list.Items))
		for i := range list.Items {
			out[i] = list.Items[i].ObjectMeta
		}
		return out, nil
	})
	// Helm's reads of a release's objects (the state an upgrade is merged
	// into) come from the same cache the health gate and drift checks read.
	// Only kinds already watched: a read of another kind (a chart's
	// lookup of a Secret, say) would start an informer of whole objects of
	// that kind, and wait for it, on a context that never ends; when the
	// manager was stopping, that wait never ended either.
	kinds := &sync.Map{}
	hc.UseObjectCache(func(req *http.Request, gvk schema.GroupVersionKind, namespace, name string) (*unstructured.Unstructured, bool) {
		if _, ok := kinds.Load(gvk); !ok {
			return nil, false
		}
		ctx, cancel := context.WithTimeout(req.Context(), objectCacheWait)
		defer cancel()
		u := &unstructured.Unstructured{}
		u.SetGroupVersionKind(gvk)
		if err := deps.Get(ctx, client.ObjectKey{Namespace: namespace, Name: name}, u); err != nil {
			return nil, false
		}
		return u, true
	})
	return &Shared{Helm: hc, Dynamic: dyn, Releases: releases, Dependents: deps, watchedKinds: kinds}, nil
}

// SetupWithManager builds the controller of r's kind.
func (r *Reconciler) SetupWithManager(mgr manager.Manager, sh *Shared) error {
	wiring{r}.useManager(mgr, sh)
	u := &unstructured.Unstructured{}
	u.SetGroupVersionKind(r.Watch.GVK)
	primary := predicate.Or(
		predicate.GenerationChangedPredicate{},
		predicate.AnnotationChangedPredicate{},
		predicate.LabelChangedPredicate{},
		deletionPredicate(),
	)
	name := strings.ToLower(r.Watch.GVK.Kind + "." + r.Watch.GVK.Group)
	c, err := ctrl.NewControllerManagedBy(mgr).
		Named(name).
		For(u, builder.WithPredicates(primary)).
		WithOptions(controller.Options{MaxConcurrentReconciles: r.Watch.MaxConcurrentReconciles, SkipNameValidation: &sh.SkipNameValidation}).
		Build(r)
	if err != nil {
		return fmt.Errorf("building controller for %s: %w", r.Watch, err)
	}
	r.initOnce.Do(wiring{r}.init)
	if err := (wiring{r}).watchRecordsAndCanaries(mgr, c, sh); err != nil {
		return err
	}
	if err := (wiring{r}).watchWakeUps(mgr, c); err != nil {
		return err
	}
	if r.Watch.WatchDependentResources {
		r.deps = &dependents{cache: sh.Dependents, ctrl: c, watched: map[schema.GroupVersionKind]bool{}, shared: sh.watchedKinds}
	}
	for _, h := range r.Hooks {
		if h.Watcher == nil {
			continue
		}
		if err := h.Watcher.Watch(mgr, c, (wiring{r}).enqueueNamespaces); err != nil {
			return fmt.Errorf("hook %s watches for %s: %w", h.Name, r.Watch, err)
		}
	}
	return nil
}

// useManager takes the shared clients and the manager's defaults for what
// the caller left unset.
func (r wiring) useManager(mgr manager.Manager, sh *Shared) {
	r.Helm = sh.Helm
	r.Dynamic = sh.Dynamic
	r.Releases = sh.Releases
	if r.DigestKey == nil {
		r.DigestKey = sh.DigestKey
	}
	if r.Client == nil {
		r.Client = mgr.GetClient()
	}
	if r.APIReader == nil {
		r.APIReader = mgr.GetAPIReader()
	}
	if r.Recorder == nil {
		// The core/v1 event recorder: kubectl describe and every event
		// consumer in the field read these. Moving to events.k8s.io is a
		// later change of this one line and the Recorder type.
		r.Recorder = mgr.GetEventRecorderFor("chartpilot") //nolint:staticcheck // see above
	}
	if r.Log.GetSink() == nil {
		r.Log = mgr.GetLogger().WithName("release").WithValues("kind", r.Watch.GVK.Kind)
	}
}

// watchRecordsAndCanaries: a change of a release record (deleted by hand,
// or left by another process) reconciles its owner; a canary's status
// change (Ready on a new version, or rolled back) wakes the resources
// waiting for the canaries, instead of their polls.
func (r wiring) watchRecordsAndCanaries(mgr manager.Manager, c controller.Controller, sh *Shared) error {
	secret := &metav1.PartialObjectMetadata{}
	secret.SetGroupVersionKind(corev1.SchemeGroupVersion.WithKind("Secret"))
	if err := c.Watch(source.Kind(sh.Releases, client.Object(secret), handler.EnqueueRequestsFromMapFunc(r.mapReleaseRecord), r.releaseRecordPredicate())); err != nil {
		return err
	}
	canary := &unstructured.Unstructured{}
	canary.SetGroupVersionKind(r.Watch.GVK)
	return c.Watch(source.Kind(mgr.GetCache(), client.Object(canary), handler.EnqueueRequestsFromMapFunc(r.waitingForCanaries), canaryStatusPredicate()))
}

// watchWakeUps adds the channels that wake resources: one queued upgrade
// whose slot freed, or every resource when the source's versions changed
// (or it recovered), which is how a published chart rolls out.
func (r wiring) watchWakeUps(mgr manager.Manager, c controller.Controller) error {
	r.wake = make(chan event.GenericEvent, 1024)
	if err := c.Watch(source.Channel(r.wake, &handler.EnqueueRequestForObject{})); err != nil {
		return err
	}
	if r.Source.Interval() == 0 {
		return nil
	}
	r.kick = make(chan event.GenericEvent)
	if err := c.Watch(source.Channel(r.kick, handler.EnqueueRequestsFromMapFunc(func(ctx context.Context, _ client.Object) []reconcile.Request {
		return r.enqueueNamespaces(ctx, nil)
	}))); err != nil {
		return err
	}
	return mgr.Add(manager.RunnableFunc(r.refreshLoop))
}

// init sets up the upgrade slots and the per-resource memory with their
// metrics; it runs once, before the first pass.
func (r wiring) init() {
	// One redaction step between any error and the events and logs.
	if r.Recorder != nil {
		r.Recorder = redactingRecorder{r.Recorder}
	}
	r.Log = redact.Logger(r.Log)
	r.slots.max = r.Watch.MaxConcurrentUpgrades
	r.slots.wake = r.wakeOne
	r.slots.inUse = func(n int) { upgradesInProgress.WithLabelValues(r.Watch.GVK.Kind).Set(float64(n)) }
	r.mem.onWaiting = func(counts map[string]int) {
		for why, n := range counts {
			rolloutWaiting.WithLabelValues(r.Watch.GVK.Kind, why).Set(float64(n))
		}
	}
}

// enqueueNamespaces lists requests for every resource of this kind in the
// namespaces (all namespaces when nil), from the cache.
func (r wiring) enqueueNamespaces(ctx context.Context, namespaces []string) []reconcile.Request {
	list := &unstructured.UnstructuredList{}
	list.SetGroupVersionKind(r.Watch.GVK.GroupVersion().WithKind(r.Watch.GVK.Kind + "List"))
	var out []reconcile.Request
	listIn := func(opts ...client.ListOption) {
		if err := r.Client.List(ctx, list, opts...); err != nil {
			return
		}
		for _, u := range list.Items {
			out = append(out, reconcile.Request{NamespacedName: types.NamespacedName{Namespace: u.GetNamespace(), Name: u.GetName()}})
		}
	}
	if namespaces == nil {
		listIn()
		return out
	}
	for _, ns := range namespaces {
		listIn(client.InNamespace(ns))
	}
	return out
}

func deletionPredicate() predicate.Predicate {
	return predicate.Funcs{UpdateFunc: func(e event.UpdateEvent) bool {
		return e.ObjectNew.GetDeletionTimestamp() != nil && e.ObjectOld.GetDeletionTimestamp() == nil
	}}
}

// mapReleaseRecord maps a release Secret to the resource that owns it.
func (r wiring) mapReleaseRecord(_ context.Context, o client.Object) []reconcile.Request {
	l := o.GetLabels()
	if l[helm.StorageLabelName] == "" {
		return nil
	}
	// A record that names no kind was made by hand or by another tool: the
	// resource of this kind with the release's name, if any, looks at it.
	if kind := l[v1alpha1.LabelOwnerKind]; kind != "" && kind != r.ownerKind() {
		return nil
	}
	return []reconcile.Request{{NamespacedName: types.NamespacedName{Namespace: o.GetNamespace(), Name: l[helm.StorageLabelName]}}}
}

// releaseRecordPredicate passes a record's deletion, and its creation or
// change unless this process wrote that version: chartpilot's own actions
// need no echo, but a record made, changed or deleted by someone else must
// be looked at now, not at the next periodic pass. Every event of a chunk
// of a record passes: a chunk missing, changed or put back changes whether
// the record can be read (only releases too large for one Secret have
// chunks).
func (r wiring) releaseRecordPredicate() predicate.Predicate {
	foreign := func(o client.Object) bool {
		if o.GetLabels()[helm.StorageLabelOwner] == helm.StorageOwnerChunk {
			return true
		}
		return r.Helm == nil || !r.Helm.WroteRecord(o.GetNamespace(), o.GetName(), o.GetResourceVersion())
	}
	return predicate.Funcs{
		CreateFunc:  func(e event.CreateEvent) bool { return foreign(e.Object) },
		UpdateFunc:  func(e event.UpdateEvent) bool { return foreign(e.ObjectNew) },
		DeleteFunc:  func(event.DeleteEvent) bool { return true },
		GenericFunc: func(event.GenericEvent) bool { return false },
	}
}

// dependents adds, on demand, a metadata-only watch for each kind of object
// the releases of one controller contain.
type dependents struct {
	cache   cache.Cache
	ctrl    controller.Controller
	mu      sync.Mutex
	watched map[schema.GroupVersionKind]bool
	// shared is Shared.watchedKinds (nil in tests that build no Shared).
	shared *sync.Map
}

// ensure watches every kind of object in manifest.
func (d *dependents) ensure(_ context.Context, r *Reconciler, manifest string) error {
	objs, err := parseManifest(manifest)
	if err != nil {
		return err
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, o := range objs {
		gvk := o.GroupVersionKind()
		if d.watched[gvk] {
			continue
		}
		// Whole objects (without managed fields): the health gate and drift
		// checks read them from here instead of from the API server.
		m := &unstructured.Unstructured{}
		m.SetGroupVersionKind(gvk)
		if err := d.ctrl.Watch(source.Kind(d.cache, client.Object(m), (wiring{r}).dependentHandler())); err != nil {
			return fmt.Errorf("watching %s: %w", gvk, err)
		}
		d.watched[gvk] = true
		if d.shared != nil {
			d.shared.Store(gvk, true)
		}
	}
	return nil
}

// ownerOf maps an object of a release to its owner, if it is of this kind.
func (r wiring) ownerOf(o client.Object) (types.NamespacedName, bool) {
	owner := o.GetAnnotations()[v1alpha1.AnnotationOwner]
	kind, rest, ok := strings.Cut(owner, "/")
	if !ok || kind != r.ownerKind() {
		return types.NamespacedName{}, false
	}
	ns, name, ok := strings.Cut(rest, "/")
	if !ok {
		return types.NamespacedName{}, false
	}
	return types.NamespacedName{Namespace: ns, Name: name}, true
}

// dependentHandler turns events of a release's objects into reconciles:
// changes that may be drift (deletions, spec/generation changes, label
// changes, any change of objects without a generation) flag a drift check;
// status-only updates wake an owner whose health gate is waiting when the
// object's kstatus changed (InProgress to Current or Failed, say), or one
// whose workload became available or stopped being so (kstatus Current or
// not), so that a settled fleet ignores the rest. Creations (the initial list and
// chartpilot's own creates) are ignored.
func (r wiring) dependentHandler() handler.TypedEventHandler[client.Object, reconcile.Request] {
	return handler.TypedFuncs[client.Object, reconcile.Request]{
		UpdateFunc: func(_ context.Context, e event.TypedUpdateEvent[client.Object], q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
			key, ok := r.ownerOf(e.ObjectNew)
			if !ok {
				return
			}
			o, n := e.ObjectOld, e.ObjectNew
			if o.GetGeneration() != n.GetGeneration() || !labels.Equals(o.GetLabels(), n.GetLabels()) ||
				(n.GetGeneration() == 0 && o.GetResourceVersion() != n.GetResourceVersion()) {
				r.mem.with(key, func(m *memo) { m.driftDue = true })
				q.Add(reconcile.Request{NamespacedName: key})
				return
			}
			if r.mem.get(key).awaiting {
				// The gate names what it waits for by kind and name only,
				// so an update that leaves the object's kstatus as it was
				// (a replica count on the way) changes nothing it decides.
				if kstatusChanged(o, n) || !maps.Equal(o.GetAnnotations(), n.GetAnnotations()) {
					q.Add(reconcile.Request{NamespacedName: key})
				}
				return
			}
			if availabilityChanged(o, n) || r.mem.get(key).unavailable {
				r.mem.with(key, func(m *memo) { m.workloadsDue = true })
				q.Add(reconcile.Request{NamespacedName: key})
			}
		},
		DeleteFunc: func(_ context.Context, e event.TypedDeleteEvent[client.Object], q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
			if key, ok := r.ownerOf(e.Object); ok {
				r.mem.with(key, func(m *memo) { m.driftDue = true })
				q.Add(reconcile.Request{NamespacedName: key})
			}
		},
	}
}

// refreshLoop refreshes a remote chart source on its interval (the first
// time at once) and wakes every resource when its versions changed or it
// became reachable again.
func (r wiring) refreshLoop(ctx context.Context) error {
	var lastErr error
	first := true
	t := time.NewTimer(0)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
		changed, err := r.Source.Refresh(ctx)
		switch {
		case err != nil && (lastErr == nil || first):
			r.Log.Info("Chart source unreachable; releases stay on what they have", "source", r.Source.String(), "error", err.Error())
		case err == nil && lastErr != nil:
			r.Log.Info("Chart source reachable again", "source", r.Source.String())
		}
		if changed || first || (err == nil) != (lastErr == nil) {
			r.Log.V(1).Info("Chart source refreshed", "source", r.Source.String(), "changed", changed)
			select {
			case r.kick <- event.GenericEvent{Object: &metav1.PartialObjectMetadata{}}:
			case <-ctx.Done():
				return nil
			}
		}
		lastErr, first = err, false
		t.Reset(r.Source.Interval())
	}
}

// canaryStatusPredicate passes status changes of canaries.
func canaryStatusPredicate() predicate.Predicate {
	return predicate.Funcs{
		CreateFunc:  func(event.CreateEvent) bool { return false },
		DeleteFunc:  func(e event.DeleteEvent) bool { return e.Object.GetLabels()[v1alpha1.LabelCanary] == "true" },
		GenericFunc: func(event.GenericEvent) bool { return false },
		UpdateFunc: func(e event.UpdateEvent) bool {
			if e.ObjectNew.GetLabels()[v1alpha1.LabelCanary] != "true" && e.ObjectOld.GetLabels()[v1alpha1.LabelCanary] != "true" {
				return false
			}
			o, ok1 := e.ObjectOld.(*unstructured.Unstructured)
			n, ok2 := e.ObjectNew.(*unstructured.Unstructured)
			if ok1 && ok2 {
				var err1, err2 error
				o, err1 = expanded(o)
				n, err2 = expanded(n)
				ok1, ok2 = err1 == nil, err2 == nil
			}
			return !ok1 || !ok2 || !equality.Semantic.DeepEqual(o.Object["status"], n.Object["status"]) ||
				e.ObjectOld.GetLabels()[v1alpha1.LabelCanary] != e.ObjectNew.GetLabels()[v1alpha1.LabelCanary]
		},
	}
}

// waitingForCanaries lists the resources whose upgrade waits on canaries.
func (r wiring) waitingForCanaries(context.Context, client.Object) []reconcile.Request {
	var out []reconcile.Request
	for _, key := range r.mem.waitingFor(reasonCanaries, reasonHalted) {
		out = append(out, reconcile.Request{NamespacedName: key})
	}
	return out
}

// wakeOne reconciles one resource (a queued upgrade whose slot freed)
// without blocking: when the channel is full the resource's own poll
// picks it up.
func (r wiring) wakeOne(key types.NamespacedName) {
	obj := &metav1.PartialObjectMetadata{}
	obj.SetNamespace(key.Namespace)
	obj.SetName(key.Name)
	select {
	case r.wake <- event.GenericEvent{Object: obj}:
		r.Log.V(1).Info("Woke a queued upgrade", "resource", key.String())
	default:
	}
}

// kickAll reconciles every resource of the kind (after an on-demand
// refresh found new versions).
func (r wiring) kickAll(ctx context.Context) {
	if r.kick == nil {
		return
	}
	select {
	case r.kick <- event.GenericEvent{Object: &metav1.PartialObjectMetadata{}}:
	case <-ctx.Done():
	}
}
