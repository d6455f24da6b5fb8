// Package anomalies reports, on each resource of a watched kind that asks
// for it, whether its release's pods behave unlike themselves (package
// anomaly scores them): the Anomalous condition, an event when it is
// raised and when it clears, and the scores as metrics.
package anomalies

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/selection"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/record"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/metrics"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/source"

	"github.com/chartpilot/chartpilot/internal/anomaly"
	"github.com/chartpilot/chartpilot/internal/api/v1alpha1"
	"github.com/chartpilot/chartpilot/internal/controller/patch"
)

// InstanceLabel names a pod's Helm release (the chart convention every
// chart here follows); only pods that carry it are cached.
const InstanceLabel = "app.kubernetes.io/instance"

var scoreGauge = prometheus.NewGaugeVec(prometheus.GaugeOpts{
	Name: "chartpilot_anomaly_score",
	Help: "How far a release's latest window lies above its own normal, per signal (median absolute deviations; 3.5 and above is anomalous).",
}, []string{"kind", "namespace", "name", "signal"})

func init() { metrics.Registry.MustRegister(scoreGauge) }

// NewPodCache is the cache of the pods the detectors read: only those
// with InstanceLabel, and of each only what scoring reads (its release,
// restarts and readiness), so that a cluster's pods cost little memory.
// The manager starts it (mgr.Add).
func NewPodCache(cfg *rest.Config, scheme *runtime.Scheme) (cache.Cache, error) {
	req, err := labels.NewRequirement(InstanceLabel, selection.Exists, nil)
	if err != nil {
		return nil, err
	}
	return cache.New(cfg, cache.Options{Scheme: scheme, ByObject: map[client.Object]cache.ByObject{
		&corev1.Pod{}: {Label: labels.NewSelector().Add(*req), Transform: trimPod},
	}})
}

// trimPod keeps what Detector reads of a pod.
func trimPod(o any) (any, error) {
	p, ok := o.(*corev1.Pod)
	if !ok {
		return o, nil
	}
	out := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{
		Name: p.Name, Namespace: p.Namespace, UID: p.UID, ResourceVersion: p.ResourceVersion, CreationTimestamp: p.CreationTimestamp,
		Labels: map[string]string{InstanceLabel: p.Labels[InstanceLabel]}, DeletionTimestamp: p.DeletionTimestamp,
	}}
	out.Status.Phase = p.Status.Phase
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			out.Status.Conditions = []corev1.PodCondition{{Type: c.Type, Status: c.Status}}
		}
	}
	var restarts int32
	for _, list := range [][]corev1.ContainerStatus{p.Status.InitContainerStatuses, p.Status.ContainerStatuses} {
		for _, cs := range list {
			restarts += cs.RestartCount
		}
	}
	out.Status.ContainerStatuses = []corev1.ContainerStatus{{Name: "all", RestartCount: restarts}}
	return out, nil
}

// Detector follows the releases of one watched kind.
type Detector struct {
	GVK      schema.GroupVersionKind
	Settings anomaly.Settings
	// Client reads the resources (cached) and writes their status; Pods
	// is NewPodCache's cache.
	Client   client.Client
	Pods     cache.Cache
	Recorder record.EventRecorder
	// Acting reports whether the release reconciler of this process acts
	// on a resource's release (its status says so only once the action
	// settled); nil: the status alone decides.
	Acting func(types.NamespacedName) bool
	Now    func() time.Time
	// SeveralInProcess names the controller per instance (tests).
	SeveralInProcess bool

	mu       sync.Mutex
	trackers map[types.NamespacedName]*tracker
}

// tracker is one release's anomaly.Tracker with its own lock: one
// release's look never waits on another's.
type tracker struct {
	mu sync.Mutex
	t  *anomaly.Tracker
}

// SetupWithManager runs the detector: woken by its resources' changes
// and by their pods' restarts and readiness changes, and while something
// lies in the latest window, every quarter window.
func (d *Detector) SetupWithManager(mgr ctrl.Manager) error {
	d.Settings = d.Settings.WithDefaults()
	d.trackers = map[types.NamespacedName]*tracker{}
	obj := &unstructured.Unstructured{}
	obj.SetGroupVersionKind(d.GVK)
	toRelease := handler.TypedEnqueueRequestsFromMapFunc(func(_ context.Context, p *corev1.Pod) []reconcile.Request {
		return []reconcile.Request{{NamespacedName: types.NamespacedName{Namespace: p.Namespace, Name: p.Labels[InstanceLabel]}}}
	})
	return ctrl.NewControllerManagedBy(mgr).
		Named("anomalies-" + strings.ToLower(d.GVK.Kind) + "." + d.GVK.Group).
		For(obj).
		WatchesRawSource(source.Kind(d.Pods, &corev1.Pod{}, toRelease, podChanged())).
		WithOptions(controller.Options{MaxConcurrentReconciles: 2, SkipNameValidation: &d.SeveralInProcess}).
		Complete(d)
}

// podChanged passes a pod's creation, deletion, and the updates that
// change its restarts or readiness.
func podChanged() predicate.TypedPredicate[*corev1.Pod] {
	return predicate.TypedFuncs[*corev1.Pod]{
		UpdateFunc: func(e event.TypedUpdateEvent[*corev1.Pod]) bool {
			a, b := podOf(e.ObjectOld), podOf(e.ObjectNew)
			return a.Restarts != b.Restarts || a.Ready != b.Ready
		},
	}
}

func podOf(p *corev1.Pod) anomaly.Pod {
	out := anomaly.Pod{UID: p.UID, Created: p.CreationTimestamp.Time}
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			out.Ready = c.Status == corev1.ConditionTrue
		}
	}
	for _, cs := range p.Status.ContainerStatuses {
		out.Restarts += cs.RestartCount
	}
	return out
}

func (d *Detector) now() time.Time {
	if d.Now != nil {
		return d.Now()
	}
	return time.Now()
}

// Reconcile observes one release's pods and reports the verdict.
func (d *Detector) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	obj := &unstructured.Unstructured{}
	obj.SetGroupVersionKind(d.GVK)
	if err := d.Client.Get(ctx, req.NamespacedName, obj); err != nil || obj.GetDeletionTimestamp() != nil {
		if err == nil || apierrors.IsNotFound(err) {
			d.forget(req.NamespacedName)
			return ctrl.Result{}, nil
		}
		return ctrl.Result{}, err
	}
	list := &corev1.PodList{}
	if err := d.Pods.List(ctx, list, client.InNamespace(req.Namespace), client.MatchingLabels{InstanceLabel: req.Name}); err != nil {
		return ctrl.Result{}, err
	}
	pods := make([]anomaly.Pod, 0, len(list.Items))
	for i := range list.Items {
		p := &list.Items[i]
		// A pod being deleted, or finished (a Job's, an evicted one), is
		// no longer one whose readiness says anything.
		if p.DeletionTimestamp == nil && p.Status.Phase != corev1.PodSucceeded && p.Status.Phase != corev1.PodFailed {
			pods = append(pods, podOf(p))
		}
	}
	now := d.now()
	acting := acting(obj) || d.Acting != nil && d.Acting(req.NamespacedName)
	d.mu.Lock()
	t, ok := d.trackers[req.NamespacedName]
	if !ok {
		t = &tracker{t: anomaly.NewTracker(d.Settings, now)}
		d.trackers[req.NamespacedName] = t
	}
	d.mu.Unlock()
	t.mu.Lock()
	t.t.Observe(now, pods, acting)
	verdicts := t.t.Evaluate(now)
	active := t.t.Active(now)
	t.mu.Unlock()

	for _, v := range verdicts {
		scoreGauge.WithLabelValues(d.GVK.Kind, req.Namespace, req.Name, string(v.Signal)).Set(v.Score)
	}
	worst, anomalous := anomaly.Worst(verdicts)
	if acting {
		anomalous = false // an action replaces pods: the health gate judges it
	}
	res := ctrl.Result{}
	if active || anomalous {
		res.RequeueAfter = d.Settings.Window / 4
	}
	return res, d.report(ctx, obj, worst, anomalous)
}

// acting reports whether the release is being installed, upgraded or
// rolled back, or its spec changed and the change is not yet acted on.
func acting(obj *unstructured.Unstructured) bool {
	conds := v1alpha1.ReadReleaseStatus(obj).Conditions
	if apimeta.IsStatusConditionTrue(conds, v1alpha1.ConditionReconciling) {
		return true
	}
	ready := apimeta.FindStatusCondition(conds, v1alpha1.ConditionReady)
	return ready == nil || ready.ObservedGeneration != obj.GetGeneration()
}

// report sets the Anomalous condition: True naming the worst signal when
// raised (its figures as they were then: the message is not rewritten at
// every look), False once within the normal again. An event marks each
// change.
func (d *Detector) report(ctx context.Context, obj *unstructured.Unstructured, worst anomaly.Verdict, anomalous bool) error {
	st := v1alpha1.ReadReleaseStatus(obj)
	if raw, _, _ := unstructured.NestedSlice(obj.Object, "status", "conditions"); len(raw) != len(st.Conditions) {
		// A status this cannot read is not written over: its conditions
		// would be lost with it.
		return fmt.Errorf("reading the conditions of %s: they do not decode; the Anomalous condition is left as it is", obj.GetName())
	}
	var prev *metav1.Condition
	if c := apimeta.FindStatusCondition(st.Conditions, v1alpha1.ConditionAnomalous); c != nil {
		cp := *c // st.Conditions is changed below
		prev = &cp
	}
	c := metav1.Condition{Type: v1alpha1.ConditionAnomalous, Status: metav1.ConditionFalse, Reason: "WithinNormal",
		Message: "restarts, readiness changes and time unready are within this release's own normal", ObservedGeneration: obj.GetGeneration()}
	if anomalous {
		c.Status, c.Reason, c.Message = metav1.ConditionTrue, reasonOf(worst.Signal), worst.String()
		if prev != nil && prev.Status == metav1.ConditionTrue && prev.Reason == c.Reason {
			c.Message = prev.Message
		}
	}
	if prev != nil && prev.Status == c.Status && prev.Reason == c.Reason && prev.Message == c.Message && prev.ObservedGeneration == c.ObservedGeneration {
		return nil
	}
	before := obj.DeepCopy()
	apimeta.SetStatusCondition(&st.Conditions, c)
	raw := make([]any, 0, len(st.Conditions))
	for i := range st.Conditions {
		m, err := runtime.DefaultUnstructuredConverter.ToUnstructured(&st.Conditions[i])
		if err != nil {
			return err
		}
		raw = append(raw, m)
	}
	if err := unstructured.SetNestedSlice(obj.Object, raw, "status", "conditions"); err != nil {
		return err
	}
	if _, err := patch.Status(ctx, d.Client, before, obj, "the Anomalous condition"); err != nil {
		if apierrors.IsConflict(err) || apierrors.IsNotFound(err) {
			return nil // looked at again at the next event or look
		}
		return err
	}
	switch {
	case anomalous && (prev == nil || prev.Status != metav1.ConditionTrue || prev.Reason != c.Reason):
		d.Recorder.Event(obj, corev1.EventTypeWarning, "AnomalyDetected", c.Message)
	case !anomalous && prev != nil && prev.Status == metav1.ConditionTrue:
		d.Recorder.Event(obj, corev1.EventTypeNormal, "AnomalyCleared", "back within this release's own normal after: "+prev.Message)
	}
	return nil
}

func reasonOf(s anomaly.Signal) string {
	switch s {
	case anomaly.Restarts:
		return "RestartsAboveNormal"
	case anomaly.ReadinessChanges:
		return "ReadinessChangesAboveNormal"
	default:
		return "UnreadyAboveNormal"
	}
}

// forget drops a resource's tracker and series.
func (d *Detector) forget(key types.NamespacedName) {
	d.mu.Lock()
	delete(d.trackers, key)
	d.mu.Unlock()
	for _, s := range anomaly.Signals {
		scoreGauge.DeleteLabelValues(d.GVK.Kind, key.Namespace, key.Name, string(s))
	}
}
