package storage

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/record"
	statsv1alpha1 "k8s.io/kubelet/pkg/apis/stats/v1alpha1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/predicate"

	"github.com/chartpilot/chartpilot/internal/api/v1alpha1"
	"github.com/chartpilot/chartpilot/internal/controller/patch"
	"github.com/chartpilot/chartpilot/internal/hooks"
	"github.com/chartpilot/chartpilot/internal/kinds"
)

// DefaultInterval is how often the volumes of a resource that asks for
// automatic growth are looked at.
const DefaultInterval = time.Minute

// AutoExpander grows the volumes of one watched kind's resources.
type AutoExpander struct {
	GVK schema.GroupVersionKind
	// Storage reads a resource's size and automatic growth.
	Storage func(obj *unstructured.Unstructured) kinds.Storage
	// Kind and Hooks check a grown resource as admission would (tenant
	// limits); Chart names the chart for them.
	Kind  kinds.Kind
	Hooks []*hooks.Hook
	Chart func() (name, version string)
	// Client reads the watched kind (cached) and writes it; APIReader lists
	// a release's StatefulSets and pods.
	Client    client.Client
	APIReader client.Reader
	// Nodes reaches the kubelets' statistics (the core API's REST client).
	Nodes    rest.Interface
	Recorder record.EventRecorder
	// Interval between two looks at a resource (DefaultInterval).
	Interval time.Duration
	Now      func() time.Time
	// SeveralInProcess names the controller per instance (tests).
	SeveralInProcess bool
}

// SetupWithManager runs the controller. It is woken by spec and
// annotation changes, then looks again every Interval.
func (a *AutoExpander) SetupWithManager(mgr ctrl.Manager) error {
	obj := &unstructured.Unstructured{}
	obj.SetGroupVersionKind(a.GVK)
	return ctrl.NewControllerManagedBy(mgr).
		Named("autoexpand-"+strings.ToLower(a.GVK.Kind)).
		For(obj, builder.WithPredicates(predicate.Or(predicate.GenerationChangedPredicate{}, predicate.AnnotationChangedPredicate{}))).
		WithOptions(controller.Options{MaxConcurrentReconciles: 2, SkipNameValidation: &a.SeveralInProcess}).
		Complete(a)
}

func (a *AutoExpander) now() time.Time {
	if a.Now != nil {
		return a.Now()
	}
	return time.Now()
}

func (a *AutoExpander) interval() time.Duration {
	if a.Interval > 0 {
		return a.Interval
	}
	return DefaultInterval
}

// Reconcile looks at one resource's volumes once.
func (a *AutoExpander) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	obj := &unstructured.Unstructured{}
	obj.SetGroupVersionKind(a.GVK)
	if err := a.Client.Get(ctx, req.NamespacedName, obj); err != nil {
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	if obj.GetDeletionTimestamp() != nil {
		return ctrl.Result{}, nil
	}
	st := a.Storage(obj)
	if st.AutoExpandErr != nil {
		return ctrl.Result{}, a.report(ctx, obj, nil, verdict{reason: "Invalid", msg: st.AutoExpandErr.Error()})
	}
	if st.AutoExpand == nil || !st.AutoExpand.Enabled {
		return ctrl.Result{}, a.report(ctx, obj, nil, verdict{})
	}
	s, err := parseSettings(st.AutoExpand, st.AutoExpandField)
	if err != nil {
		return ctrl.Result{}, a.report(ctx, obj, nil, verdict{reason: "Invalid", msg: err.Error()})
	}
	if !settled(obj) {
		return ctrl.Result{RequeueAfter: a.interval()}, nil // an action is in flight: look after it
	}
	size, err := resource.ParseQuantity(st.Size)
	if err != nil {
		return ctrl.Result{}, a.report(ctx, obj, nil, verdict{reason: "Invalid", msg: fmt.Sprintf("%s: %q is not a quantity", st.SizeField, st.Size)})
	}
	fullest, used, err := a.fullest(ctx, obj)
	if err != nil {
		v := verdict{reason: "NoStatistics", msg: err.Error(), recheck: a.interval()}
		return ctrl.Result{RequeueAfter: v.recheck}, a.report(ctx, obj, nil, v)
	}
	status := readStorageStatus(obj)
	v := decide(s, size, fullest, used, status.LastExpansion, a.now(), a.interval())
	if v.grow {
		if refusal := a.admitted(ctx, obj, st, v.to); refusal != "" {
			v = verdict{reason: "LimitReached", warn: true, recheck: a.interval(),
				msg: fmt.Sprintf("%s is %d%% used, but %s %s would be refused: %s", fullest, used, st.SizeField, v.to.String(), refusal)}
		}
	}
	if v.grow {
		grown, err := a.grow(ctx, obj, st, v.to)
		if err != nil {
			if apierrors.IsConflict(err) {
				return ctrl.Result{RequeueAfter: time.Second}, nil
			}
			v = verdict{reason: "Refused", warn: true, recheck: a.interval(), msg: fmt.Sprintf("%s %s → %s was refused: %v", st.SizeField, size.String(), v.to.String(), err)}
		} else {
			obj = grown
			status.LastExpansion = &v1alpha1.StorageExpansion{At: metav1.NewTime(a.now()), From: size.String(), To: v.to.String(), UsedPercent: used}
		}
	}
	if abs(status.UsedPercent-used) >= 5 || status.Fullest != fullest || v.grow {
		status.UsedPercent, status.Fullest = used, fullest
	}
	return ctrl.Result{RequeueAfter: v.recheck}, a.report(ctx, obj, status, v)
}

func abs(n int32) int32 {
	if n < 0 {
		return -n
	}
	return n
}

// settled reports whether the release is Ready on the current spec and no
// volume is still growing: only then are the volumes' figures those of
// the size asked for.
func settled(obj *unstructured.Unstructured) bool {
	conds := conditionsOf(obj)
	ready := apimeta.FindStatusCondition(conds, v1alpha1.ConditionReady)
	if ready == nil || ready.Status != metav1.ConditionTrue || ready.ObservedGeneration != obj.GetGeneration() {
		return false
	}
	return !apimeta.IsStatusConditionTrue(conds, v1alpha1.ConditionStorageResizing)
}

func conditionsOf(obj *unstructured.Unstructured) []metav1.Condition {
	return v1alpha1.ReadReleaseStatus(obj).Conditions
}

func readStorageStatus(obj *unstructured.Unstructured) *v1alpha1.StorageStatus {
	st := &v1alpha1.StorageStatus{}
	if raw, ok, _ := unstructured.NestedMap(obj.Object, "status", "storage"); ok {
		_ = runtime.DefaultUnstructuredConverter.FromUnstructured(raw, st)
	}
	return st
}

// admitted runs the watch's validators (tenant limits) on the resource as
// it would be with size to; it returns the refusal, "" when admitted.
func (a *AutoExpander) admitted(ctx context.Context, obj *unstructured.Unstructured, st kinds.Storage, to resource.Quantity) string {
	grown := obj.DeepCopy()
	if err := unstructured.SetNestedField(grown.Object, to.String(), strings.Split(st.SizeField, ".")...); err != nil {
		return err.Error()
	}
	var name, version string
	if a.Chart != nil {
		name, version = a.Chart()
	}
	hobj, _, err := a.Kind.Object(grown, name, version)
	if err != nil {
		return err.Error()
	}
	for _, h := range a.Hooks {
		if h.Validator == nil {
			continue
		}
		if err := h.Validator.Validate(ctx, hobj); err != nil {
			if rej, ok := hooks.AsRejection(err); ok {
				return fmt.Sprintf("%s (%s)", rej.Message, rej.Reason)
			}
			return fmt.Sprintf("hook %s: %v", h.Name, err)
		}
	}
	return ""
}

// grow writes the new size into the resource's spec (optimistically
// locked: a concurrent edit wins and the next look decides again).
func (a *AutoExpander) grow(ctx context.Context, obj *unstructured.Unstructured, st kinds.Storage, to resource.Quantity) (*unstructured.Unstructured, error) {
	grown := obj.DeepCopy()
	if err := unstructured.SetNestedField(grown.Object, to.String(), strings.Split(st.SizeField, ".")...); err != nil {
		return nil, err
	}
	if err := a.Client.Patch(ctx, grown, client.MergeFromWithOptions(obj, client.MergeFromWithOptimisticLock{})); err != nil {
		return nil, err
	}
	return grown, nil
}

// report writes status.storage and the StorageAutoExpand condition when
// they change (v.reason "" removes the condition), with an event for a
// growth and for a new warning.
func (a *AutoExpander) report(ctx context.Context, obj *unstructured.Unstructured, st *v1alpha1.StorageStatus, v verdict) error {
	before := obj.DeepCopy()
	conds := conditionsOf(obj)
	var prev *metav1.Condition
	if c := apimeta.FindStatusCondition(conds, v1alpha1.ConditionStorageAutoExpand); c != nil {
		cp := *c // conds is changed below
		prev = &cp
	}
	if v.reason == "" {
		if prev == nil {
			return nil
		}
		apimeta.RemoveStatusCondition(&conds, v1alpha1.ConditionStorageAutoExpand)
	} else {
		status := metav1.ConditionFalse
		if v.status {
			status = metav1.ConditionTrue
		}
		apimeta.SetStatusCondition(&conds, metav1.Condition{Type: v1alpha1.ConditionStorageAutoExpand, Status: status, Reason: v.reason, Message: v.msg, ObservedGeneration: obj.GetGeneration()})
	}
	raw := make([]any, 0, len(conds))
	for i := range conds {
		m, err := runtime.DefaultUnstructuredConverter.ToUnstructured(&conds[i])
		if err != nil {
			return err
		}
		raw = append(raw, m)
	}
	if err := unstructured.SetNestedSlice(obj.Object, raw, "status", "conditions"); err != nil {
		return err
	}
	if st != nil {
		m, err := runtime.DefaultUnstructuredConverter.ToUnstructured(st)
		if err != nil {
			return err
		}
		if err := unstructured.SetNestedMap(obj.Object, m, "status", "storage"); err != nil {
			return err
		}
	}
	changed := prev == nil || v.reason == "" || prev.Reason != v.reason || prev.Message != v.msg || prev.ObservedGeneration != obj.GetGeneration()
	if !changed && st != nil {
		old, _, _ := unstructured.NestedMap(before.Object, "status", "storage")
		now, _, _ := unstructured.NestedMap(obj.Object, "status", "storage")
		b1, _ := json.Marshal(old)
		b2, _ := json.Marshal(now)
		changed = string(b1) != string(b2)
	}
	if !changed {
		return nil
	}
	if v.announce {
		a.Recorder.Event(obj, corev1.EventTypeNormal, "StorageAutoExpanded", v.msg)
	} else if v.warn && (prev == nil || prev.Reason != v.reason) {
		a.Recorder.Event(obj, corev1.EventTypeWarning, "StorageAutoExpand"+v.reason, v.msg)
	}
	if _, err := patch.Status(ctx, a.Client, before, obj, "status"); err != nil && !apierrors.IsConflict(err) && !apierrors.IsNotFound(err) {
		return err
	}
	return nil // a conflict or a deleted object: looked at again at the next event or interval
}

// fullest finds the fullest volume of the release's StatefulSets: each
// pod's claims, read from the statistics of the kubelet of its node.
func (a *AutoExpander) fullest(ctx context.Context, obj *unstructured.Unstructured) (string, int32, error) {
	ns := obj.GetNamespace()
	sets := &appsv1.StatefulSetList{}
	if err := a.APIReader.List(ctx, sets, client.InNamespace(ns), client.MatchingLabels{v1alpha1.LabelRelease: obj.GetName()}); err != nil {
		return "", 0, fmt.Errorf("listing the release's StatefulSets: %w", err)
	}
	// claims per pod, and the pods per node.
	want := map[string][]string{}
	nodes := map[string][]string{}
	for _, sts := range sets.Items {
		if len(sts.Spec.VolumeClaimTemplates) == 0 || sts.Spec.Selector == nil {
			continue
		}
		sel, err := metav1.LabelSelectorAsSelector(sts.Spec.Selector)
		if err != nil {
			continue
		}
		pods := &corev1.PodList{}
		if err := a.APIReader.List(ctx, pods, client.InNamespace(ns), client.MatchingLabelsSelector{Selector: sel}); err != nil {
			return "", 0, fmt.Errorf("listing the pods of StatefulSet %s: %w", sts.Name, err)
		}
		for _, p := range pods.Items {
			// Only the StatefulSet's own pods (owner UID, an ordinal below
			// its replicas): anyone who may create pods in the namespace
			// can give one its labels and a node of their choosing, and
			// each node named is a kubelet the manager reads.
			if p.Spec.NodeName == "" || !ownedMember(&p, &sts) {
				continue
			}
			for _, t := range sts.Spec.VolumeClaimTemplates {
				want[p.Name] = append(want[p.Name], t.Name+"-"+p.Name)
			}
			nodes[p.Spec.NodeName] = append(nodes[p.Spec.NodeName], p.Name)
		}
	}
	if len(want) == 0 {
		return "", 0, errors.New("no running pod of the release has a volume from a StatefulSet's volumeClaimTemplates")
	}
	var (
		best    string
		bestPct int32 = -1
		missing []string
	)
	for _, node := range sortedKeys(nodes) {
		sum, err := a.summary(ctx, node)
		if err != nil {
			missing = append(missing, fmt.Sprintf("node %s: %v", node, err))
			continue
		}
		for _, podName := range nodes[node] {
			for _, claim := range want[podName] {
				pct, ok := volumeUse(sum, ns, podName, claim)
				if !ok {
					missing = append(missing, fmt.Sprintf("claim %s: not in the statistics of node %s", claim, node))
					continue
				}
				if pct > bestPct || (pct == bestPct && claim < best) {
					best, bestPct = claim, pct
				}
			}
		}
	}
	if bestPct < 0 {
		return "", 0, fmt.Errorf("no volume statistics from the kubelets: %s", strings.Join(missing, "; "))
	}
	return best, bestPct, nil
}

// ownedMember reports whether p is one of sts's pods: controlled by it and
// named for one of its ordinals.
func ownedMember(p *corev1.Pod, sts *appsv1.StatefulSet) bool {
	owner := metav1.GetControllerOf(p)
	if owner == nil || owner.UID != sts.UID || owner.Kind != "StatefulSet" {
		return false
	}
	ordinal, ok := strings.CutPrefix(p.Name, sts.Name+"-")
	n, err := strconv.Atoi(ordinal)
	replicas := int32(1)
	if sts.Spec.Replicas != nil {
		replicas = *sts.Spec.Replicas
	}
	return ok && err == nil && n >= 0 && n < int(replicas) && strconv.Itoa(n) == ordinal
}

// summary reads a node's kubelet statistics through the API server's node proxy.
func (a *AutoExpander) summary(ctx context.Context, node string) (*statsv1alpha1.Summary, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	raw, err := a.Nodes.Get().AbsPath("/api/v1/nodes", node, "proxy", "stats", "summary").DoRaw(ctx)
	if err != nil {
		return nil, fmt.Errorf("reading /stats/summary through the node proxy: %w", err)
	}
	sum := &statsv1alpha1.Summary{}
	if err := json.Unmarshal(raw, sum); err != nil {
		return nil, fmt.Errorf("decoding /stats/summary: %w", err)
	}
	return sum, nil
}

// volumeUse is the percentage used of a pod's volume backed by claim.
func volumeUse(sum *statsv1alpha1.Summary, namespace, pod, claim string) (int32, bool) {
	for _, p := range sum.Pods {
		if p.PodRef.Namespace != namespace || p.PodRef.Name != pod {
			continue
		}
		for _, v := range p.VolumeStats {
			if v.PVCRef == nil || v.PVCRef.Name != claim || v.UsedBytes == nil || v.CapacityBytes == nil || *v.CapacityBytes == 0 {
				continue
			}
			return int32(*v.UsedBytes * 100 / *v.CapacityBytes), true
		}
	}
	return 0, false
}

func sortedKeys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}
