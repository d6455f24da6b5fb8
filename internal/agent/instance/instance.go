// Package instance is chartpilot's instance manager (`chartpilot instance`):
// it runs in each PostgreSQL pod around the server and holds, through a
// Kubernetes Lease per cluster, the primary role. The Lease's holder runs
// its server as the primary; the others run theirs as streaming standbys of
// it. When the holder stops renewing (its lease expires: not a guess), the
// most advanced healthy standby takes the Lease and promotes; the others
// follow it; the old primary, back, is rewound and rejoins as a standby. A
// primary that cannot renew its Lease stops its server before the Lease can
// expire (fencing), so two primaries never accept writes at once.
//
// Each member also keeps a Lease of its own (CLUSTER-MEMBER) whose
// annotations say where its server listens, its role and its WAL position,
// read by the others to choose the most advanced standby.
package instance

import (
	"context"
	"fmt"
	"sync/atomic"
	"syscall"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/chartpilot/chartpilot/internal/api/v1alpha1"
)

// Roles a member reports.
const (
	RolePrimary = "primary"
	RoleStandby = "standby"
	RoleStopped = "stopped"
	RoleFenced  = "fenced"
)

// Manager runs one member.
type Manager struct {
	cfg  Config
	pg   *server
	role string
	// lastRenew (Unix nanoseconds) and leading are shared with the fencing
	// watchdog, which stops the server even while the loop waits on the
	// API server.
	lastRenew atomic.Int64
	leading   atomic.Bool
	fenced    atomic.Bool
	// lastPrimaryLSN is the newest position the primary reported.
	lastPrimaryLSN uint64
	// following is the primary's address this standby was pointed at;
	// followingAs the role it streams as ("": not known, asked again);
	// probedAt when the primary was last asked which.
	following, followingAs string
	probedAt               time.Time
	// podLabelled is the pod's role label as last written (nil: unknown).
	podLabelled *bool
	// unlabel is the old primary's pod whose role label a promotion could
	// not remove yet: the primary tries again at each renewal.
	unlabel string
	// waitingFor is the reason last logged for not promoting.
	waitingFor string
	// reported is the position this member last reported.
	reported uint64
	// roleCheckedAt is when this primary last made sure of the
	// replication role (zero: not since it leads).
	roleCheckedAt time.Time
	// archive is the server's archiving as last read (JSON, "" when it
	// does not archive), archiveReadAt when.
	archive       string
	archiveReadAt time.Time
	// archiveFailing: the newest attempt to archive had failed at the
	// last read.
	archiveFailing bool
}

// New checks cfg and makes a Manager.
func New(cfg Config) (*Manager, error) {
	cfg.defaults()
	if err := cfg.Check(); err != nil {
		return nil, err
	}
	m := &Manager{cfg: cfg, role: RoleStopped}
	m.pg = &server{cfg: &m.cfg}
	return m, nil
}

// Run runs the member until ctx ends; the server is stopped (fast) then.
func (m *Manager) Run(ctx context.Context) error {
	if err := m.pg.writePassfile(!m.cfg.replicating()); err != nil {
		return err
	}
	defer m.pg.stop(false)
	go m.watchdog(ctx)
	t := time.NewTicker(m.cfg.Period)
	defer t.Stop()
	for {
		if err := m.tick(ctx); err != nil && ctx.Err() == nil {
			m.cfg.Log.Info("Instance step failed", "error", err.Error())
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

func (m *Manager) primaryLease() string { return m.cfg.Cluster + "-primary" }

func (m *Manager) memberLease(member string) string {
	return m.cfg.Cluster + "-" + member
}

// tick is one step: look at the primary's Lease and act on it.
func (m *Manager) tick(ctx context.Context) error {
	now := m.cfg.Now()
	if (m.role == RolePrimary || m.role == RoleStandby) && !m.pg.running() {
		// The server died (or was fenced): a primary's Lease must pass on;
		// a standby is started again, and meanwhile no one waits for its
		// position.
		m.setRole(RoleStopped)
	}
	ctx, cancel := context.WithTimeout(ctx, m.cfg.RenewDeadline/2+time.Second)
	defer cancel()
	leases := m.cfg.Client.CoordinationV1().Leases(m.cfg.Namespace)
	lease, err := leases.Get(ctx, m.primaryLease(), metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		lease, err = leases.Create(ctx, &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: m.primaryLease(), Namespace: m.cfg.Namespace, Labels: map[string]string{v1alpha1.LabelCluster: m.cfg.Cluster}}}, metav1.CreateOptions{})
		if apierrors.IsAlreadyExists(err) {
			return nil
		}
	}
	if err != nil {
		return m.unreachable(now, err)
	}
	holder := ptr.Deref(lease.Spec.HolderIdentity, "")
	expired := holder == "" || lease.Spec.RenewTime == nil ||
		now.After(lease.Spec.RenewTime.Add(time.Duration(ptr.Deref(lease.Spec.LeaseDurationSeconds, 0))*time.Second))
	switch {
	case holder == m.cfg.Member && !expired:
		err = m.lead(ctx, lease, now)
	case !expired:
		err = m.follow(ctx, holder)
	default:
		err = m.elect(ctx, lease, holder, now)
	}
	m.report(ctx)
	return err
}

// unreachable handles an API server that does not answer: a primary that
// has not renewed for RenewDeadline stops its server.
func (m *Manager) unreachable(now time.Time, err error) error {
	if m.role == RolePrimary && now.Sub(time.Unix(0, m.lastRenew.Load())) >= m.cfg.RenewDeadline {
		m.fence()
	}
	return fmt.Errorf("reading the primary's lease: %w", err)
}

// lead keeps the Lease and the server running as the primary.
func (m *Manager) lead(ctx context.Context, lease *coordinationv1.Lease, now time.Time) error {
	if m.role != RolePrimary {
		// Holding the Lease at start (a restart within its duration): the
		// server is the primary only if its data is not a standby's.
		if !m.pg.initialized() || m.pg.isStandby() {
			return m.release(ctx, lease)
		}
		if err := m.pg.start(ctx); err != nil {
			return err
		}
		m.setRole(RolePrimary)
		m.clearMoved()
	}
	lease.Spec.RenewTime = &metav1.MicroTime{Time: now}
	if _, err := m.cfg.Client.CoordinationV1().Leases(m.cfg.Namespace).Update(ctx, lease, metav1.UpdateOptions{}); err != nil {
		return m.unreachable(now, err)
	}
	m.renewed(now)
	if m.unlabel != "" && m.patchRole(ctx, m.unlabel, false) {
		m.unlabel = ""
	}
	m.labelPod(ctx, true)
	if now.Sub(m.roleCheckedAt) >= roleCheckEvery {
		// At once when it leads (after a promotion usually there
		// already, replicated from the old primary), then now and then:
		// a restored backup's roles or a changed password are repaired.
		if err := m.pg.ensureReplicationRole(); err != nil {
			return err
		}
		m.roleCheckedAt = now
	}
	return m.synchronous()
}

// renewOwn renews the primary's Lease if this member holds it (after a
// step that took long, such as a bootstrap).
func (m *Manager) renewOwn(ctx context.Context) error {
	leases := m.cfg.Client.CoordinationV1().Leases(m.cfg.Namespace)
	lease, err := leases.Get(ctx, m.primaryLease(), metav1.GetOptions{})
	if err != nil {
		return fmt.Errorf("reading the primary's lease: %w", err)
	}
	if ptr.Deref(lease.Spec.HolderIdentity, "") != m.cfg.Member {
		return nil
	}
	now := m.cfg.Now()
	lease.Spec.RenewTime = &metav1.MicroTime{Time: now}
	if _, err := leases.Update(ctx, lease, metav1.UpdateOptions{}); err != nil {
		return fmt.Errorf("renewing the primary's lease: %w", err)
	}
	m.renewed(now)
	return nil
}

// renewed records a renewal of the primary's Lease.
func (m *Manager) renewed(now time.Time) {
	m.lastRenew.Store(now.UnixNano())
	m.fenced.Store(false)
}

// setRole records the member's role (and tells the watchdog whether it leads).
func (m *Manager) setRole(role string) {
	if role != RolePrimary {
		m.roleCheckedAt = time.Time{} // checked again when it leads
	}
	m.role = role
	m.leading.Store(role == RolePrimary)
}

// fence stops the primary's server at once: its Lease may pass to another
// member soon, and two primaries must never accept writes together.
func (m *Manager) fence() {
	m.cfg.Log.Info("Fencing: the primary's lease was not renewed within the renew deadline; stopping the server before it can pass to another")
	m.pg.stop(true)
	m.setRole(RoleFenced)
}

// watchdog fences a primary whose renewals stopped, whatever the loop is
// waiting on: it signals the server directly.
func (m *Manager) watchdog(ctx context.Context) {
	t := time.NewTicker(50 * time.Millisecond)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if m.leading.Load() && time.Since(time.Unix(0, m.lastRenew.Load())) >= m.cfg.RenewDeadline && !m.fenced.Swap(true) {
			m.cfg.Log.Info("Fencing: no renewal of the primary's lease within the renew deadline; stopping the server")
			m.pg.signal(syscall.SIGQUIT)
		}
	}
}

// release gives the Lease up.
func (m *Manager) release(ctx context.Context, lease *coordinationv1.Lease) error {
	lease.Spec.HolderIdentity = nil
	_, err := m.cfg.Client.CoordinationV1().Leases(m.cfg.Namespace).Update(ctx, lease, metav1.UpdateOptions{})
	return err
}

// synchronous sets synchronous_standby_names for Synchronous: one
// standby at a time (FIRST, not ANY: the one the primary names is the one
// that has every acknowledged commit, see mayPromote).
func (m *Manager) synchronous() error {
	want := ""
	if m.cfg.Synchronous == 1 {
		want = "FIRST 1 (*)"
	}
	have, err := m.pg.query("SHOW synchronous_standby_names")
	if err != nil || have == want {
		return err
	}
	if _, err := m.pg.query(fmt.Sprintf("ALTER SYSTEM SET synchronous_standby_names = '%s'", want)); err != nil {
		return err
	}
	_, err = m.pg.query("SELECT pg_reload_conf()")
	return err
}

// follow runs the server as a standby of holder.
func (m *Manager) follow(ctx context.Context, holder string) error {
	m.labelPod(ctx, false)
	if m.role == RolePrimary {
		// Another holds the Lease: this server must stop writing now.
		m.cfg.Log.Info("Another member holds the primary's lease: stopping this primary", "holder", holder)
		m.pg.stop(true)
		m.setRole(RoleStopped)
	}
	p, err := m.readMember(ctx, holder)
	if apierrors.IsNotFound(err) {
		return nil // the new primary has not reported yet
	}
	if err != nil {
		return err
	}
	if p.address == "" || p.role != RolePrimary {
		return nil // the new primary has not started yet
	}
	m.lastPrimaryLSN = max(m.lastPrimaryLSN, p.lsn)
	if m.moved() {
		return nil // moved data is the cluster's newest: it waits for the Lease to expire and leads
	}
	// The role to replicate as, asked of the primary once per step and
	// only when it is needed.
	var as string
	user := func() (string, error) {
		if as != "" {
			return as, nil
		}
		u, err := m.pg.replicationUser(p.address)
		as = u
		return u, err
	}
	switch {
	case !m.pg.initialized():
		u, err := user()
		if err != nil {
			return err
		}
		m.cfg.Log.Info("Cloning from the primary", "primary", holder, "as", u)
		if err := m.pg.basebackup(p.address, u); err != nil {
			return err
		}
	case !m.pg.isStandby():
		// This data was a primary's: rewind it onto the new timeline.
		u, err := user()
		if err != nil {
			return err
		}
		m.pg.stop(false)
		m.cfg.Log.Info("Rewinding onto the new primary", "primary", holder, "as", u)
		if err := m.pg.rewind(p.address, u); err != nil {
			return err
		}
	}
	// A standby streaming as the superuser (the primary had no
	// replication role) asks again now and then.
	reprobe := m.cfg.replicating() && m.followingAs != m.cfg.ReplicationUser && m.cfg.Now().Sub(m.probedAt) >= reprobeEvery
	if m.following != p.address || !m.pg.running() || reprobe {
		u, err := user()
		m.probedAt = m.cfg.Now()
		if err != nil {
			// The primary did not answer: stream as the replication role
			// meanwhile (asked again shortly).
			m.cfg.Log.Info("Could not ask the primary which role to replicate as", "error", err.Error())
			u = m.cfg.User
			if m.cfg.replicating() {
				u = m.cfg.ReplicationUser
			}
			as = ""
		}
		if m.following != p.address || m.followingAs != as || !m.pg.running() {
			if err := m.pg.follow(p.address, u); err != nil && m.pg.running() {
				return err
			}
		}
		m.following, m.followingAs = p.address, as
	}
	if !m.pg.running() {
		if err := m.pg.start(ctx); err != nil {
			return err
		}
	}
	m.setRole(RoleStandby)
	return nil
}
