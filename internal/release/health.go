package release

import (
	"context"
	"fmt"
	"strings"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/cli-utils/pkg/kstatus/status"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/event"

	"github.com/chartpilot/chartpilot/internal/api/v1alpha1"
	"github.com/chartpilot/chartpilot/internal/helm"
)

// unhealthyPrefix marks a revision condemned because its workloads did not
// become ready in time; its inputs are not retried until they change or a
// new reconcile is requested.
const unhealthyPrefix = "chartpilot: unhealthy: "

// healthPoll is how often a release's workloads are looked at while they
// settle; status changes of its objects wake the gate sooner.
const healthPoll = 2 * time.Second

// queuedPoll is how often an upgrade waiting for a slot looks again on its
// own; a freed slot wakes it sooner (wakeQueuedLocked).
const queuedPoll = 30 * time.Second

// healthy returns whether revision rev of key was already seen healthy.
func (r *Reconciler) healthy(key types.NamespacedName, rev int) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return rev > 0 && r.healthyRev[key] == rev
}

// awaitingHealth reports whether the health gate of key is open: its
// release was deployed and its workloads were not yet seen ready.
func (r *Reconciler) awaitingHealth(key types.NamespacedName) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.awaiting[key]
}

func (r *Reconciler) setAwaiting(key types.NamespacedName, on bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.awaiting == nil {
		r.awaiting = map[types.NamespacedName]bool{}
	}
	if on {
		r.awaiting[key] = true
	} else {
		delete(r.awaiting, key)
	}
}

func (r *Reconciler) setHealthy(key types.NamespacedName, rev int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.healthyRev == nil {
		r.healthyRev = map[types.NamespacedName]int{}
	}
	r.healthyRev[key] = rev
	delete(r.awaiting, key)
	r.endUpgradeLocked(key)
}

// checkHealth is the health gate of an in-sync release: every object of the
// manifest must be Current by kstatus. While they settle the resource is
// Reconciling (so not Ready) and looked at again shortly; an upgrade whose
// workloads are not ready within healthTimeout is condemned, so that the next
// pass rolls it back.
func (r *Reconciler) checkHealth(ctx context.Context, p *pass, o Observation, history []*helm.Release) (ctrl.Result, bool, error) {
	rel := o.Latest
	pending, err := r.notReady(ctx, p.key.Namespace, rel.Manifest)
	if err != nil {
		return ctrl.Result{}, false, err
	}
	if len(pending) == 0 {
		r.setHealthy(p.key, rel.Revision)
		return ctrl.Result{}, true, nil
	}
	r.setAwaiting(p.key, true)
	if len(history) > 1 {
		// An upgrade still settling (e.g. found so after a restart) counts
		// against maxConcurrentUpgrades until it is healthy.
		r.holdSlot(p.key)
	}
	waited := r.now().Sub(rel.LastDeployed)
	msg := "waiting for " + strings.Join(pending, "; ")
	if waited < r.Watch.HealthTimeout {
		setCondition(p.status, p.obj, v1alpha1.ConditionReconciling, metav1.ConditionTrue, "Progressing", msg)
		r.setReleaseInfo(p, rel)
		summarise(p.status, p.obj)
		return ctrl.Result{RequeueAfter: healthPoll}, false, nil
	}
	var previous *helm.Release
	for i := len(history) - 1; i >= 0; i-- {
		if h := history[i]; h.Revision < rel.Revision && (h.Status == helm.StatusDeployed || h.Status == helm.StatusSuperseded) {
			previous = h
			break
		}
	}
	why := fmt.Sprintf("revision %d did not become ready within %s: %s", rel.Revision, r.Watch.HealthTimeout, strings.Join(pending, "; "))
	r.setAwaiting(p.key, false)
	if previous == nil {
		// A first install has nothing to go back to: it stays, and says why.
		r.endUpgrade(p.key)
		setCondition(p.status, p.obj, v1alpha1.ConditionReleased, metav1.ConditionFalse, "InstallUnhealthy", why)
		setCondition(p.status, p.obj, v1alpha1.ConditionReconciling, metav1.ConditionTrue, "InstallUnhealthy", why)
		summarise(p.status, p.obj)
		return ctrl.Result{RequeueAfter: 30 * time.Second}, false, nil
	}
	if err := r.Helm.As(p.identity).MarkFailed(p.key.Namespace, p.key.Name, rel.Revision, unhealthyPrefix+why); err != nil {
		return ctrl.Result{}, false, fmt.Errorf("condemning unhealthy revision: %w", err)
	}
	r.endUpgrade(p.key)
	r.failed(p, "Upgrade", "UpgradeFailed", fmt.Errorf("%s", why), rel)
	return ctrl.Result{RequeueAfter: 100 * time.Millisecond}, false, nil
}

// notReady lists the objects of manifest that kstatus does not call Current.
func (r *Reconciler) notReady(ctx context.Context, namespace, manifest string) ([]string, error) {
	objs, err := helm.ParseManifest(manifest)
	if err != nil {
		return nil, err
	}
	var out []string
	for _, want := range objs {
		ri, err := r.resourceFor(namespace, want)
		if err != nil {
			return nil, err
		}
		live, err := ri.Get(ctx, want.GetName(), metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			out = append(out, want.GetKind()+"/"+want.GetName()+" is missing")
			continue
		}
		if err != nil {
			return nil, err
		}
		res, err := status.Compute(live)
		if err != nil {
			continue // a kind kstatus cannot read is not a workload to wait for
		}
		if res.Status != status.CurrentStatus {
			out = append(out, fmt.Sprintf("%s/%s is %s: %s", want.GetKind(), want.GetName(), res.Status, res.Message))
		}
	}
	return out, nil
}

// beginUpgrade reserves one of maxConcurrentUpgrades for key; false means
// the fleet is at its bound and the upgrade must wait.
func (r *Reconciler) beginUpgrade(key types.NamespacedName) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.upgrading == nil {
		r.upgrading = map[types.NamespacedName]bool{}
	}
	if r.upgrading[key] {
		return true
	}
	if len(r.upgrading) >= r.Watch.MaxConcurrentUpgrades {
		return false
	}
	r.upgrading[key] = true
	upgradesInProgress.WithLabelValues(r.Watch.GVK.Kind).Set(float64(len(r.upgrading)))
	return true
}

// holdSlot counts key as upgrading even beyond the bound: its upgrade is
// already applied and settling, so new upgrades wait for it.
func (r *Reconciler) holdSlot(key types.NamespacedName) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.upgrading == nil {
		r.upgrading = map[types.NamespacedName]bool{}
	}
	if !r.upgrading[key] {
		r.upgrading[key] = true
		upgradesInProgress.WithLabelValues(r.Watch.GVK.Kind).Set(float64(len(r.upgrading)))
	}
}

// endUpgrade releases key's reservation.
func (r *Reconciler) endUpgrade(key types.NamespacedName) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.endUpgradeLocked(key)
}

func (r *Reconciler) endUpgradeLocked(key types.NamespacedName) {
	if r.upgrading[key] {
		delete(r.upgrading, key)
		upgradesInProgress.WithLabelValues(r.Watch.GVK.Kind).Set(float64(len(r.upgrading)))
		r.wakeQueuedLocked()
	}
}

// wakeQueuedLocked reconciles the longest-queued upgrades, one per free
// slot, instead of letting them poll; r.mu is held.
func (r *Reconciler) wakeQueuedLocked() {
	free := r.Watch.MaxConcurrentUpgrades - len(r.upgrading)
	for i := 0; r.wake != nil && i < free && i < len(r.queue); i++ {
		obj := &metav1.PartialObjectMetadata{}
		obj.SetNamespace(r.queue[i].Namespace)
		obj.SetName(r.queue[i].Name)
		select {
		case r.wake <- event.GenericEvent{Object: obj}:
			r.Log.V(1).Info("Woke a queued upgrade", "resource", r.queue[i].String(), "free", free, "queued", len(r.queue))
		default: // the channel is full: the resource's own poll picks it up
		}
	}
}

// queued reports an upgrade waiting for a free slot.
func (r *Reconciler) queued(p *pass) ctrl.Result {
	setCondition(p.status, p.obj, v1alpha1.ConditionReconciling, metav1.ConditionTrue, "UpgradeQueued",
		fmt.Sprintf("%d releases of this kind are upgrading (maxConcurrentUpgrades); this one waits its turn", r.Watch.MaxConcurrentUpgrades))
	summarise(p.status, p.obj)
	r.setWaiting(p.key, reasonQueued)
	// A freed slot wakes the longest-queued resources; the poll is a safety net.
	return ctrl.Result{RequeueAfter: queuedPoll}
}

// unhealthyFailure reports whether the newest failed revision of digest was
// condemned as unhealthy under the same reconcile-requested-at token: such
// inputs are not retried until they change or a new reconcile is requested.
func unhealthyFailure(history []*helm.Release, digest, requested string) (*helm.Release, bool) {
	for i := len(history) - 1; i >= 0; i-- {
		h := history[i]
		if h.Status == helm.StatusFailed && h.Labels[LabelDigest] == digest {
			if strings.HasPrefix(h.Description, unhealthyPrefix) && h.Labels[LabelRequestedAt] == requested {
				return h, true
			}
			return nil, false
		}
	}
	return nil, false
}
