package instance

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/chartpilot/chartpilot/internal/api/v1alpha1"
)

// elect takes an expired (or never held) Lease when this member should:
// the first member of a new cluster, or the most advanced healthy standby.
// The rule is decideElection's; elect gathers what it reads and carries
// out its step.
func (m *Manager) elect(ctx context.Context, lease *coordinationv1.Lease, previous string, now time.Time) error {
	m.labelPod(ctx, false)
	v := electionView{
		self: m.cfg.Member, role: m.role, previous: previous,
		transitions: ptr.Deref(lease.Spec.LeaseTransitions, 0),
		reported:    m.reported, synchronous: m.cfg.Synchronous,
		lastPrimaryLSN: m.lastPrimaryLSN, maxLagBytes: m.cfg.MaxLagBytes,
	}
	if v.role == RolePrimary {
		return m.fenceExpired() // before any request, which could fail
	}
	if lease.Spec.RenewTime != nil {
		v.expiredAt = lease.Spec.RenewTime.Add(time.Duration(ptr.Deref(lease.Spec.LeaseDurationSeconds, 0)) * time.Second)
	}
	var err error
	if v.members, err = m.members(ctx); err != nil {
		return err
	}
	v.initialized = m.pg.initialized()
	v.running = m.pg.running()
	if v.role == RoleStandby && v.running && !v.newCluster() { // the rule compares positions
		if v.lsn, err = m.pg.lsn(false); err != nil {
			return err
		}
		if v.timeline, err = m.pg.timeline(false); err != nil {
			return err
		}
	}
	step := decideElection(v)
	m.lastPrimaryLSN = max(m.lastPrimaryLSN, step.lastPrimaryLSN)
	switch step.action {
	case electNothing:
		return nil
	case electWait:
		m.waiting(step.reason, step.kv...)
		return nil
	case electFence:
		return m.fenceExpired()
	case electBootstrap:
		return m.bootstrap(ctx, lease, now)
	case electRestart:
		return m.restartWithoutPrimary(ctx, lease, previous, now)
	}
	m.waitingFor = ""
	return m.promote(ctx, lease, v, step, now)
}

// fenceExpired stops this primary's server: its own Lease ran out, it
// could not renew in time.
func (m *Manager) fenceExpired() error {
	m.fence()
	return errors.New("the primary's lease expired under this member: stopped its server")
}

// bootstrap takes the Lease and initialises a new cluster here.
func (m *Manager) bootstrap(ctx context.Context, lease *coordinationv1.Lease, now time.Time) error {
	if err := m.take(ctx, lease, now); err != nil {
		return err
	}
	m.cfg.Log.Info("Bootstrapping a new cluster")
	// initdb and the first start can take longer than a step on a busy
	// machine: they are not cut off at its deadline, which would leave
	// a server started under no role and a Lease no one renews.
	bctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Minute)
	defer cancel()
	if err := m.pg.initdb(); err != nil {
		return err
	}
	if err := m.pg.start(bctx); err != nil {
		return err
	}
	m.setRole(RolePrimary)
	if err := m.renewOwn(bctx); err != nil {
		return err
	}
	// Made before this member first reports itself primary: the standbys
	// that clone from it find the role.
	if err := m.pg.ensureReplicationRole(); err != nil {
		return err
	}
	m.roleCheckedAt = m.cfg.Now()
	return m.synchronous()
}

// promote takes the Lease, naming the last primary and the lag, and
// promotes this standby.
func (m *Manager) promote(ctx context.Context, lease *coordinationv1.Lease, v electionView, step electionStep, now time.Time) error {
	previous := v.previous
	if lease.Annotations == nil {
		lease.Annotations = map[string]string{}
	}
	lease.Annotations[v1alpha1.AnnotationPromotedFrom] = previous
	lease.Annotations[v1alpha1.AnnotationPromotedLagBytes] = strconv.FormatInt(step.lag, 10)
	if err := m.take(ctx, lease, now); err != nil {
		return err
	}
	var compared []string
	for _, o := range v.members {
		if o.name != m.cfg.Member && o.fresh && o.role == RoleStandby {
			compared = append(compared, fmt.Sprintf("%s at %d/%s", o.name, o.timeline, formatLSN(o.lsn)))
		}
	}
	m.cfg.Log.Info("Promoting: the primary's lease expired", "previous", previous, "timeline", v.timeline, "lsn", formatLSN(v.lsn), "lagBytes", step.lag, "standbys", compared)
	if _, err := m.pg.query("SELECT pg_promote(true, 60)"); err != nil {
		return fmt.Errorf("promoting: %w", err)
	}
	// The new timeline reaches the control file with a checkpoint: until
	// then pg_rewind, run by the old primary against this one, would see
	// one timeline and rewind nothing.
	if _, err := m.pg.query("CHECKPOINT"); err != nil {
		m.cfg.Log.Info("Checkpoint after promotion failed", "error", err.Error())
	}
	m.setRole(RolePrimary)
	m.renewed(now)
	// The read-write Service leaves the old primary's pod, then selects this one.
	if previous != "" && previous != m.cfg.Member && m.cfg.Pod != "" && !m.patchRole(ctx, previous, false) {
		m.unlabel = previous
	}
	m.labelPod(ctx, true)
	m.event(ctx, "Promoted", fmt.Sprintf("%s is the primary: the lease of %s expired; %d bytes behind it at promotion", m.cfg.Member, previous, step.lag))
	return m.synchronous()
}

// waiting logs why this standby does not promote yet, once per reason.
func (m *Manager) waiting(msg string, kv ...any) {
	if m.waitingFor == msg {
		return
	}
	m.waitingFor = msg
	m.cfg.Log.Info("Not promoting: "+msg, kv...)
}

// restartWithoutPrimary starts a member whose server is not running while
// no one holds the primary's Lease: the whole cluster was down longer than
// the Lease lasts. The last primary, with its data, takes the Lease back
// (no one promoted after it: the Lease still names it; a standby taking it
// at the same moment makes this take fail). A standby starts its server,
// replaying the WAL it has, so that it can be elected: the most advanced
// running standby promotes on a later step, as after any expiry.
func (m *Manager) restartWithoutPrimary(ctx context.Context, lease *coordinationv1.Lease, previous string, now time.Time) error {
	// A server running here under no role was started by a step that did
	// not finish (its start outlasted the step): it is taken up as it is.
	if !m.pg.initialized() || (m.role != RoleStopped && m.role != RoleFenced && m.role != "") {
		return nil
	}
	if m.pg.isStandby() {
		m.cfg.Log.Info("No primary: starting this standby's server to be elected", "previous", previous)
		if err := m.pg.start(ctx); err != nil {
			return err
		}
		m.setRole(RoleStandby)
		return nil
	}
	moved := m.moved()
	if previous != m.cfg.Member && !moved {
		return nil // a primary's data, but another was primary since: it rejoins once there is one
	}
	if err := m.take(ctx, lease, now); err != nil {
		return err
	}
	if moved {
		m.cfg.Log.Info("Taking the primary's lease: this member holds the data moved from the primary (a major upgrade)", "previous", previous)
		// The data was made elsewhere: this member's own settings.
		if err := m.pg.configure(m.cfg.DataDir); err != nil {
			return err
		}
	} else {
		m.cfg.Log.Info("Taking the primary's lease back: this member was the last primary and its lease expired while the cluster was down")
	}
	if err := m.pg.start(ctx); err != nil {
		return err
	}
	m.setRole(RolePrimary)
	m.clearMoved()
	m.renewed(now)
	m.labelPod(ctx, true)
	return m.synchronous()
}

// moved reports whether this member's data was moved here (MovedMarker).
func (m *Manager) moved() bool {
	_, err := os.Stat(MovedMarker(m.cfg.DataDir))
	return err == nil
}

// clearMoved removes the marker once this member leads with the moved data.
func (m *Manager) clearMoved() {
	if err := os.Remove(MovedMarker(m.cfg.DataDir)); err != nil && !os.IsNotExist(err) {
		m.cfg.Log.Info("Removing the moved-data marker failed", "error", err.Error())
	}
}

// take acquires the primary's Lease (optimistically: one member wins).
func (m *Manager) take(ctx context.Context, lease *coordinationv1.Lease, now time.Time) error {
	secs := int32(m.cfg.LeaseDuration / time.Second)
	lease.Spec.HolderIdentity = ptr.To(m.cfg.Member)
	lease.Spec.LeaseDurationSeconds = &secs
	lease.Spec.AcquireTime = &metav1.MicroTime{Time: now}
	lease.Spec.RenewTime = &metav1.MicroTime{Time: now}
	lease.Spec.LeaseTransitions = ptr.To(ptr.Deref(lease.Spec.LeaseTransitions, 0) + 1)
	_, err := m.cfg.Client.CoordinationV1().Leases(m.cfg.Namespace).Update(ctx, lease, metav1.UpdateOptions{})
	if err != nil {
		return fmt.Errorf("taking the primary's lease: %w", err)
	}
	m.renewed(now)
	return nil
}
