package release

import (
	"context"
	"encoding/json"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/dynamic"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/chartpilot/chartpilot/internal/api/v1alpha1"
	"github.com/chartpilot/chartpilot/internal/helm"
	"github.com/chartpilot/chartpilot/internal/volumes"
)

// Storage growth. The API server refuses every change of a StatefulSet's
// volumeClaimTemplates, so Helm alone cannot upgrade a release whose chart
// grows its volumes. Before such an upgrade the reconciler checks the
// growth (no shrink, no change of class, a class that expands), expands
// each existing claim of the StatefulSet, and deletes the StatefulSet
// object with orphan propagation: its pods keep running, the upgrade
// re-creates it with the new templates and the StatefulSet controller
// adopts them. Every step is idempotent, so whatever a crash interrupts
// the next pass finishes.

var (
	pvcGVR = corev1.SchemeGroupVersion.WithResource("persistentvolumeclaims")
	stsGVR = appsv1.SchemeGroupVersion.WithResource("statefulsets")
)

// orphanTimeout bounds the wait for a StatefulSet deleted with orphan
// propagation to be gone (the garbage collector releases its pods first).
const orphanTimeout = 30 * time.Second

// volumeTemplate is one volumeClaimTemplate of a StatefulSet.
type volumeTemplate struct {
	size  resource.Quantity
	class string // "" for the cluster's default
}

// claimTemplates reads the volumeClaimTemplates of each StatefulSet of a
// manifest: StatefulSet name → template name → template.
func claimTemplates(manifest string) (map[string]map[string]volumeTemplate, error) {
	objs, err := parseManifest(manifest)
	if err != nil {
		return nil, err
	}
	out := map[string]map[string]volumeTemplate{}
	for _, o := range objs {
		if o.GetKind() != "StatefulSet" || o.GroupVersionKind().Group != appsv1.GroupName {
			continue
		}
		sts := &appsv1.StatefulSet{}
		if err := runtime.DefaultUnstructuredConverter.FromUnstructured(o.Object, sts); err != nil {
			return nil, fmt.Errorf("StatefulSet %s: %w", o.GetName(), err)
		}
		tpls := map[string]volumeTemplate{}
		for _, t := range sts.Spec.VolumeClaimTemplates {
			vt := volumeTemplate{size: t.Spec.Resources.Requests[corev1.ResourceStorage]}
			if t.Spec.StorageClassName != nil {
				vt.class = *t.Spec.StorageClassName
			}
			tpls[t.Name] = vt
		}
		out[sts.Name] = tpls
	}
	return out, nil
}

// volumeGrowth is one template of one StatefulSet that grows, or that
// names the StorageClass its claims were given by default (pin).
type volumeGrowth struct {
	statefulSet, template string
	from, to              resource.Quantity
	pin                   string
}

func (g volumeGrowth) String() string {
	return fmt.Sprintf("StatefulSet %s volumeClaimTemplates[%s]", g.statefulSet, g.template)
}

func className(c string) string {
	if c == "" {
		return "the cluster's default"
	}
	return strconv.Quote(c)
}

// planGrowth compares the volumeClaimTemplates of the deployed and the new
// manifest: the templates that grow, or the refusal of a change no volume
// can follow (a shrink, another StorageClass). Templates added or removed
// are left to the upgrade (the API server refuses them with its message).
func planGrowth(deployed, next string) ([]volumeGrowth, *stallError) {
	before, err := claimTemplates(deployed)
	if err != nil {
		return nil, nil
	}
	after, err := claimTemplates(next)
	if err != nil {
		return nil, nil
	}
	var plan []volumeGrowth
	for sts, tpls := range after {
		for name, t := range tpls {
			old, ok := before[sts][name]
			if !ok {
				continue
			}
			g := volumeGrowth{statefulSet: sts, template: name, from: old.size, to: t.size}
			if t.class != old.class {
				if old.class != "" {
					return nil, classChange(g, old.class, t.class)
				}
				// From the default to a named class: no move if the
				// claims are on it (checked against each claim).
				g.pin = t.class
			}
			switch c := t.size.Cmp(old.size); {
			case c < 0:
				return nil, &stallError{"StorageShrink", fmt.Errorf("%s storage: %s → %s is a shrink, and volumes never shrink; nothing was changed: set it back to at least %s",
					g, old.size.String(), t.size.String(), old.size.String())}
			case c > 0 || g.pin != "":
				plan = append(plan, g)
			}
		}
	}
	sort.Slice(plan, func(i, j int) bool { return plan[i].String() < plan[j].String() })
	return plan, nil
}

func classChange(g volumeGrowth, from, to string) *stallError {
	return &stallError{"StorageClassChange", fmt.Errorf("%s storageClassName: %s → %s: volumes cannot move to another StorageClass; nothing was changed: set it back to %s (another class needs a new resource, restored from a backup)",
		g, className(from), className(to), className(from))}
}

// claimsOf returns the claims a StatefulSet made from a template
// (TEMPLATE-STATEFULSET-ORDINAL), whichever ordinals exist.
func claimsOf(claims []corev1.PersistentVolumeClaim, sts, template string) []*corev1.PersistentVolumeClaim {
	prefix := template + "-" + sts + "-"
	var out []*corev1.PersistentVolumeClaim
	for i := range claims {
		rest, ok := strings.CutPrefix(claims[i].Name, prefix)
		if !ok || rest == "" || strings.Trim(rest, "0123456789") != "" {
			continue
		}
		out = append(out, &claims[i])
	}
	return out
}

func listClaims(ctx context.Context, dyn dynamic.Interface, namespace string) ([]corev1.PersistentVolumeClaim, error) {
	list, err := dyn.Resource(pvcGVR).Namespace(namespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, fmt.Errorf("listing PersistentVolumeClaims: %w", err)
	}
	out := make([]corev1.PersistentVolumeClaim, len(list.Items))
	for i := range list.Items {
		if err := runtime.DefaultUnstructuredConverter.FromUnstructured(list.Items[i].Object, &out[i]); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// growVolumes runs before an upgrade. When the upgrade grows volumes of a
// StatefulSet, it checks every claim and its StorageClass, then expands
// the claims and deletes the StatefulSet object (orphaning its pods) so
// that the upgrade can re-create it. held ends the pass: a refusal (a
// Stalled condition, nothing changed) or a StatefulSet still being deleted.
func (r storageGrowth) growVolumes(ctx context.Context, p *pass, d *desired, o Observation, opts helm.ActionOptions) (ctrl.Result, bool, error) {
	plan, replace, stalled := r.planVolumes(ctx, p, d, o, opts)
	if stalled {
		return ctrl.Result{}, true, nil
	}
	if len(plan) == 0 && len(replace) == 0 {
		return ctrl.Result{}, false, nil
	}
	// From here the pass writes what it must follow through (a StatefulSet
	// deleted, claims grown): a stop no longer ends it.
	if err := commit(ctx); err != nil {
		return ctrl.Result{}, true, err
	}
	dyn, err := r.dynamicAs(d.identity)
	if err != nil {
		return ctrl.Result{}, true, err
	}
	for _, rp := range replace {
		gone, err := r.replaceStatefulSet(ctx, p, dyn, rp)
		if err != nil || !gone {
			return ctrl.Result{RequeueAfter: 2 * time.Second}, true, err
		}
	}
	if len(plan) == 0 {
		return ctrl.Result{}, false, nil
	}
	claims, err := listClaims(ctx, dyn, p.key.Namespace)
	if err != nil {
		return ctrl.Result{}, true, err
	}
	// Everything is checked before anything changes.
	type step struct {
		g     volumeGrowth
		claim *corev1.PersistentVolumeClaim
	}
	var steps []step
	classes := map[string]*storagev1.StorageClass{}
	for _, g := range plan {
		for _, c := range claimsOf(claims, g.statefulSet, g.template) {
			if have := c.Spec.Resources.Requests[corev1.ResourceStorage]; have.Cmp(g.to) > 0 {
				reporter{r.Reconciler}.stall(p, "StorageShrink", fmt.Sprintf("%s storage: claim %s already has %s, more than %s; volumes never shrink; nothing was changed: set the size to at least %s", g, c.Name, have.String(), g.to.String(), have.String()))
				return ctrl.Result{}, true, nil
			}
			if g.pin != "" && (c.Spec.StorageClassName == nil || *c.Spec.StorageClassName != g.pin) {
				reporter{r.Reconciler}.stall(p, "StorageClassChange", classChange(g, ptr.Deref(c.Spec.StorageClassName, ""), g.pin).Error()+" (claim "+c.Name+")")
				return ctrl.Result{}, true, nil
			}
			if have := c.Spec.Resources.Requests[corev1.ResourceStorage]; have.Cmp(g.to) >= 0 {
				steps = append(steps, step{g, c})
				continue
			}
			if refusal, err := r.checkExpandable(ctx, classes, g, c); err != nil || refusal != nil {
				if refusal != nil {
					reporter{r.Reconciler}.stall(p, refusal.reason, refusal.Error())
				}
				return ctrl.Result{}, true, err
			}
			steps = append(steps, step{g, c})
		}
	}
	var grown []string
	for _, s := range steps {
		if s.g.to.Cmp(s.g.from) <= 0 {
			continue // only the class is named
		}
		if have := s.claim.Spec.Resources.Requests[corev1.ResourceStorage]; have.Cmp(s.g.to) >= 0 {
			continue
		}
		patch, _ := json.Marshal(map[string]any{"spec": map[string]any{"resources": map[string]any{"requests": map[string]any{"storage": s.g.to.String()}}}})
		if _, err := dyn.Resource(pvcGVR).Namespace(p.key.Namespace).Patch(ctx, s.claim.Name, types.MergePatchType, patch, metav1.PatchOptions{FieldManager: fieldManager}); err != nil {
			return ctrl.Result{}, true, fmt.Errorf("expanding PersistentVolumeClaim %s: %w", s.claim.Name, err)
		}
		grown = append(grown, s.claim.Name)
	}
	if len(grown) > 0 {
		msg := fmt.Sprintf("expanding PersistentVolumeClaim(s) %s to %s", strings.Join(grown, ", "), describeGrowth(plan))
		r.event(p, corev1.EventTypeNormal, "StorageGrowing", msg)
		p.log.Info("Storage growing", "claims", grown)
	}
	setCondition(p.status, p.obj, v1alpha1.ConditionStorageResizing, metav1.ConditionTrue, "Growing", "growing "+describeGrowth(plan))
	for _, sts := range statefulSetsOf(plan) {
		gone, err := r.orphanStatefulSet(ctx, p, dyn, sts, plan)
		if err != nil {
			return ctrl.Result{}, true, err
		}
		if !gone {
			return ctrl.Result{RequeueAfter: 2 * time.Second}, true, nil
		}
	}
	return ctrl.Result{}, false, nil
}

// replacement is a StatefulSet whose volumeClaimTemplates are named
// differently in the new manifest: its pods mount other claims.
type replacement struct {
	statefulSet string
	from, to    []string
}

// planReplace lists the StatefulSets of both manifests whose claim
// templates are named differently (a template renamed, added or removed).
func planReplace(deployed, next string) []replacement {
	before, err := claimTemplates(deployed)
	if err != nil {
		return nil
	}
	after, err := claimTemplates(next)
	if err != nil {
		return nil
	}
	var out []replacement
	for _, sts := range sortedKeys(after) {
		old, ok := before[sts]
		if !ok {
			continue
		}
		from, to := sortedKeys(old), sortedKeys(after[sts])
		if strings.Join(from, ",") != strings.Join(to, ",") {
			out = append(out, replacement{statefulSet: sts, from: from, to: to})
		}
	}
	return out
}

// planVolumes is what the upgrade to d does to the volumes of the last
// good revision's StatefulSets: claims to grow, StatefulSets to replace
// (new claim templates). stalled: the growth is refused (reported).
func (r storageGrowth) planVolumes(ctx context.Context, p *pass, d *desired, o Observation, opts helm.ActionOptions) ([]volumeGrowth, []replacement, bool) {
	base := o.LastGood
	if base == nil {
		base = o.Latest
	}
	if base == nil || !strings.Contains(base.Manifest, "volumeClaimTemplates") {
		return nil, nil, false
	}
	next, err := r.Helm.As(d.identity).RenderUpgrade(ctx, d.chart, opts)
	if err != nil {
		return nil, nil, false // the upgrade itself reports it
	}
	plan, refusal := planGrowth(base.Manifest, next)
	if refusal != nil {
		reporter{r.Reconciler}.stall(p, refusal.reason, refusal.Error())
		return nil, nil, true
	}
	return plan, planReplace(base.Manifest, next), false
}

// replaceStatefulSet deletes a StatefulSet whose claim templates the
// upgrade renames, with its pods (foreground: the pods are gone before the
// StatefulSet is, so no pod of the old volumes runs beside one of the new),
// and reports whether it is gone. Claims are never deleted: the old ones
// stay for a person to remove. One already re-created with the new
// templates is kept.
func (r storageGrowth) replaceStatefulSet(ctx context.Context, p *pass, dyn dynamic.Interface, rp replacement) (bool, error) {
	res := dyn.Resource(stsGVR).Namespace(p.key.Namespace)
	live, err := res.Get(ctx, rp.statefulSet, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return true, nil
	}
	if err != nil {
		return false, fmt.Errorf("reading StatefulSet %s: %w", rp.statefulSet, err)
	}
	if live.GetDeletionTimestamp() == nil {
		sts := &appsv1.StatefulSet{}
		if err := runtime.DefaultUnstructuredConverter.FromUnstructured(live.Object, sts); err != nil {
			return false, err
		}
		var names []string
		for _, t := range sts.Spec.VolumeClaimTemplates {
			names = append(names, t.Name)
		}
		sort.Strings(names)
		if strings.Join(names, ",") == strings.Join(rp.to, ",") {
			return true, nil
		}
		uid := live.GetUID()
		fg := metav1.DeletePropagationForeground
		err := res.Delete(ctx, rp.statefulSet, metav1.DeleteOptions{PropagationPolicy: &fg, Preconditions: &metav1.Preconditions{UID: &uid}})
		if err != nil && !apierrors.IsNotFound(err) {
			return false, fmt.Errorf("deleting StatefulSet %s to re-create it on volumeClaimTemplates %v: %w", rp.statefulSet, rp.to, err)
		}
		msg := fmt.Sprintf("StatefulSet %s deleted with its pods, to be re-created on volumeClaimTemplates %v; the claims of %v are kept", rp.statefulSet, rp.to, rp.from)
		r.event(p, corev1.EventTypeNormal, "VolumesReplaced", msg)
		p.log.Info("Volumes replaced", "statefulSet", rp.statefulSet, "from", rp.from, "to", rp.to)
	}
	err = wait.PollUntilContextTimeout(ctx, 250*time.Millisecond, orphanTimeout, true, func(ctx context.Context) (bool, error) {
		_, err := res.Get(ctx, rp.statefulSet, metav1.GetOptions{})
		return apierrors.IsNotFound(err), nil
	})
	return err == nil, nil
}

// fieldManager names chartpilot's own writes outside Helm's.
const fieldManager = "chartpilot"

func describeGrowth(plan []volumeGrowth) string {
	parts := make([]string, 0, len(plan))
	for _, g := range plan {
		if g.to.Cmp(g.from) > 0 {
			parts = append(parts, fmt.Sprintf("%s: %s → %s", g, g.from.String(), g.to.String()))
		} else {
			parts = append(parts, fmt.Sprintf("%s: StorageClass %q named", g, g.pin))
		}
	}
	return strings.Join(parts, "; ")
}

func statefulSetsOf(plan []volumeGrowth) []string {
	var out []string
	for _, g := range plan {
		if len(out) == 0 || out[len(out)-1] != g.statefulSet {
			out = append(out, g.statefulSet)
		}
	}
	return out
}

// checkExpandable refuses a claim whose StorageClass cannot expand volumes.
func (r storageGrowth) checkExpandable(ctx context.Context, classes map[string]*storagev1.StorageClass, g volumeGrowth, c *corev1.PersistentVolumeClaim) (*stallError, error) {
	name := ""
	if c.Spec.StorageClassName != nil {
		name = *c.Spec.StorageClassName
	}
	sc, ok := classes[name]
	if !ok && name != "" {
		reader := r.APIReader
		if reader == nil {
			reader = r.Client
		}
		sc = &storagev1.StorageClass{}
		if err := reader.Get(ctx, client.ObjectKey{Name: name}, sc); err != nil {
			if !apierrors.IsNotFound(err) {
				return nil, fmt.Errorf("reading StorageClass %s: %w", name, err)
			}
			sc = nil
		}
		classes[name] = sc
	}
	if refusal := volumes.CheckExpansion(name, sc); refusal != nil {
		msg := refusal.Message(fmt.Sprintf("%s: claim %s, %s → %s", g, c.Name, g.from.String(), g.to.String()), "keep the size at "+g.from.String())
		return &stallError{"StorageNotExpandable", fmt.Errorf("%s; nothing was changed", msg)}, nil
	}
	return nil, nil
}

// orphanStatefulSet deletes a StatefulSet whose templates differ from the
// plan's, leaving its pods (and claims) in place, and reports whether it is
// gone. One already re-created with the new templates is kept.
func (r storageGrowth) orphanStatefulSet(ctx context.Context, p *pass, dyn dynamic.Interface, name string, plan []volumeGrowth) (bool, error) {
	res := dyn.Resource(stsGVR).Namespace(p.key.Namespace)
	live, err := res.Get(ctx, name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return true, nil
	}
	if err != nil {
		return false, fmt.Errorf("reading StatefulSet %s: %w", name, err)
	}
	if live.GetDeletionTimestamp() == nil {
		if !templatesDiffer(live, name, plan) {
			return true, nil
		}
		uid := live.GetUID()
		orphan := metav1.DeletePropagationOrphan
		err := res.Delete(ctx, name, metav1.DeleteOptions{PropagationPolicy: &orphan, Preconditions: &metav1.Preconditions{UID: &uid}})
		if err != nil && !apierrors.IsNotFound(err) {
			return false, fmt.Errorf("deleting StatefulSet %s (its pods kept) to re-create it with larger volumes: %w", name, err)
		}
		r.event(p, corev1.EventTypeNormal, "StorageGrowing", fmt.Sprintf("StatefulSet %s deleted with its pods kept, to be re-created with the larger volumeClaimTemplates", name))
	}
	err = wait.PollUntilContextTimeout(ctx, 250*time.Millisecond, orphanTimeout, true, func(ctx context.Context) (bool, error) {
		_, err := res.Get(ctx, name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return true, nil
		}
		return false, nil
	})
	return err == nil, nil
}

// templatesDiffer reports whether a live StatefulSet's templates are not yet
// the sizes the plan grows them to.
func templatesDiffer(live *unstructured.Unstructured, name string, plan []volumeGrowth) bool {
	sts := &appsv1.StatefulSet{}
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(live.Object, sts); err != nil {
		return true
	}
	for _, g := range plan {
		if g.statefulSet != name {
			continue
		}
		for _, t := range sts.Spec.VolumeClaimTemplates {
			if t.Name != g.template {
				continue
			}
			if t.Spec.Resources.Requests.Storage().Cmp(g.to) != 0 || (g.pin != "" && ptr.Deref(t.Spec.StorageClassName, "") != g.pin) {
				return true
			}
		}
	}
	return false
}

// followStorage reports, while StorageResizing is True, each claim's state
// against its StatefulSet's template in the deployed revision, and ends
// the condition (False, Resized) once every claim has its size.
func (r storageGrowth) followStorage(ctx context.Context, p *pass, res ctrl.Result) ctrl.Result {
	c := apimeta.FindStatusCondition(p.status.Conditions, v1alpha1.ConditionStorageResizing)
	if c == nil || c.Status != metav1.ConditionTrue || p.status.Release == nil || p.status.Release.Status != string(helm.StatusDeployed) {
		return res
	}
	rel, err := r.Helm.Revision(p.key.Namespace, p.key.Name, p.status.Release.Revision)
	if err != nil {
		return again(res, 5*time.Second)
	}
	tpls, err := claimTemplates(rel.Manifest)
	if err != nil {
		return res
	}
	reader := r.APIReader
	if reader == nil {
		reader = r.Client
	}
	list := &corev1.PersistentVolumeClaimList{}
	if err := reader.List(ctx, list, client.InNamespace(p.key.Namespace)); err != nil {
		return again(res, 5*time.Second)
	}
	var pending, done []string
	for _, sts := range sortedKeys(tpls) {
		for _, name := range sortedKeys(tpls[sts]) {
			want := tpls[sts][name].size
			for _, claim := range claimsOf(list.Items, sts, name) {
				if state, ok := claimResized(claim, want); ok {
					done = append(done, claim.Name)
				} else {
					pending = append(pending, fmt.Sprintf("%s: %s", claim.Name, state))
				}
			}
		}
	}
	if len(pending) > 0 {
		setCondition(p.status, p.obj, v1alpha1.ConditionStorageResizing, metav1.ConditionTrue, "Resizing", strings.Join(pending, "; "))
		return again(res, 5*time.Second)
	}
	msg := "every claim has its size"
	if len(done) > 0 {
		msg += ": " + strings.Join(done, ", ")
	}
	setCondition(p.status, p.obj, v1alpha1.ConditionStorageResizing, metav1.ConditionFalse, "Resized", msg)
	r.event(p, corev1.EventTypeNormal, "StorageResized", msg)
	return res
}

// claimResized reports whether a claim has at least want, or its state.
func claimResized(c *corev1.PersistentVolumeClaim, want resource.Quantity) (string, bool) {
	capacity := c.Status.Capacity[corev1.ResourceStorage]
	if capacity.Cmp(want) >= 0 {
		return capacity.String(), true
	}
	state := "waiting for the volume to grow"
	for _, cond := range c.Status.Conditions {
		if cond.Status == corev1.ConditionTrue {
			state = string(cond.Type)
		}
	}
	for _, s := range c.Status.AllocatedResourceStatuses {
		if s != "" {
			state = string(s)
		}
	}
	requested := c.Spec.Resources.Requests[corev1.ResourceStorage]
	return fmt.Sprintf("%s of %s, requested %s (%s)", capacity.String(), want.String(), requested.String(), state), false
}

func again(res ctrl.Result, after time.Duration) ctrl.Result {
	if res.RequeueAfter == 0 || res.RequeueAfter > after {
		res.RequeueAfter = after
	}
	return res
}

func sortedKeys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}
