package release

import (
	"context"
	"fmt"
	"strconv"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"

	"github.com/chartpilot/chartpilot/internal/api/v1alpha1"
	"github.com/chartpilot/chartpilot/internal/helm"
)

// lockRecheck is how often a pending revision held by a live replica is
// looked at again.
const lockRecheck = 10 * time.Second

// Holder names this process: its identity and, with leader election, the
// Lease it holds. It is written on every revision chartpilot starts.
type Holder struct {
	Identity string
	// LeaseNamespace and LeaseName: the leader election Lease ("" without
	// leader election, when this is the only replica by the admin's word).
	LeaseNamespace, LeaseName string
	// LeaseDuration is the leader election lease duration.
	LeaseDuration time.Duration
}

// labels are the holder labels of an action started now.
func (h Holder) labels(now time.Time) map[string]string {
	return map[string]string{
		v1alpha1.LabelHolder:        labelSafe(h.Identity),
		v1alpha1.LabelHolderLease:   labelSafe(h.LeaseName),
		v1alpha1.LabelHolderLeaseNS: labelSafe(h.LeaseNamespace),
		v1alpha1.LabelStartedAt:     strconv.FormatInt(now.Unix(), 10),
	}
}

// lockInfo is what a pending revision says of its holder.
type lockInfo struct {
	holder, lease, leaseNamespace string
	startedAt                     time.Time
}

func lockOf(rel *helm.Release) lockInfo {
	l := lockInfo{holder: rel.Labels[v1alpha1.LabelHolder], lease: rel.Labels[v1alpha1.LabelHolderLease], leaseNamespace: rel.Labels[v1alpha1.LabelHolderLeaseNS]}
	if s, err := strconv.ParseInt(rel.Labels[v1alpha1.LabelStartedAt], 10, 64); err == nil {
		l.startedAt = time.Unix(s, 0)
	}
	return l
}

// leaseState is a Lease as read, nil when there is none.
type leaseState struct {
	holder  string
	expires time.Time
}

// lockLive decides whether the holder of a pending revision may still be
// working on it. It is not when: the revision is older than maxAge (the
// action's timeout plus a lease duration: the action has ended, one way or
// the other); it names no holder (written before holders were recorded), or
// this process (passes for one resource never overlap, so no action of ours
// runs on it); its holder has no Lease and this operator runs without
// leader election (the admin's word that it is the only replica); or its
// holder no longer holds its Lease. recheck says when to look again.
func lockLive(l lockInfo, self Holder, lease *leaseState, now time.Time, maxAge time.Duration) (live bool, recheck time.Duration) {
	age := now.Sub(l.startedAt)
	switch {
	case l.startedAt.IsZero() || age >= maxAge, l.holder == "", l.holder == labelSafe(self.Identity):
		return false, 0
	case l.lease == "" && self.LeaseName == "":
		return false, 0
	case l.lease == "":
		return true, min(maxAge-age, lockRecheck)
	case lease == nil || lease.holder != l.holder || !now.Before(lease.expires):
		return false, 0
	}
	return true, min(maxAge-age, lease.expires.Sub(now), lockRecheck)
}

// lockHolderLive reads the Lease a pending revision's holder names (one GET,
// only for a pending revision) and decides with lockLive.
func (r *Reconciler) lockHolderLive(ctx context.Context, rel *helm.Release) (bool, time.Duration, lockInfo) {
	l := lockOf(rel)
	var lease *leaseState
	if l.lease != "" && l.leaseNamespace != "" {
		obj := &coordinationv1.Lease{}
		reader := r.APIReader
		if reader == nil {
			reader = r.Client
		}
		if err := reader.Get(ctx, types.NamespacedName{Namespace: l.leaseNamespace, Name: l.lease}, obj); err == nil && obj.Spec.HolderIdentity != nil && obj.Spec.RenewTime != nil && obj.Spec.LeaseDurationSeconds != nil {
			lease = &leaseState{
				holder:  labelSafe(*obj.Spec.HolderIdentity),
				expires: obj.Spec.RenewTime.Add(time.Duration(*obj.Spec.LeaseDurationSeconds) * time.Second),
			}
		}
	}
	live, recheck := lockLive(l, r.Holder, lease, r.now(), r.Watch.Timeout+r.Holder.LeaseDuration)
	return live, recheck, l
}

// waitForLock leaves a revision that a live replica holds alone.
func (r *Reconciler) waitForLock(p *pass, o Observation, c choice) ctrl.Result {
	msg := fmt.Sprintf("revision %d is %s by %s (lease %s/%s), which is alive: it is not unlocked until that action ends or its holder is gone (at the latest %s)",
		o.Latest.Revision, o.Latest.Status, c.lock.holder, c.lock.leaseNamespace, c.lock.lease,
		c.lock.startedAt.Add(r.Watch.Timeout+r.Holder.LeaseDuration).UTC().Format(time.RFC3339))
	setCondition(p.status, p.obj, v1alpha1.ConditionReconciling, metav1.ConditionTrue, "LockHeld", msg)
	return ctrl.Result{RequeueAfter: max(c.lockRecheck, time.Second)}
}
