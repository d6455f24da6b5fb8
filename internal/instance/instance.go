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
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/go-logr/logr"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/client-go/kubernetes"
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

// MovedMarker is the file, beside a data directory, that says its data was
// moved there from the cluster's primary with writes stopped (a major
// upgrade): with no live primary, the member that has it leads, whichever
// member the Lease names, and it is never rewound onto another's timeline.
func MovedMarker(dataDir string) string { return filepath.Clean(dataDir) + ".moved" }

// Config is one member of a cluster.
type Config struct {
	// Cluster names the cluster (its Leases: CLUSTER-primary, CLUSTER-MEMBER).
	Cluster, Namespace, Member string
	Client                     kubernetes.Interface
	// Pod, when set, is the member's pod: it carries v1alpha1.LabelMemberRole=primary while
	// the member is primary, so that the read-write Service follows it.
	Pod string
	// Bin holds the PostgreSQL binaries; DataDir the data directory;
	// SocketDir the server's socket; LogDir the server's log.
	Bin, DataDir, SocketDir, LogDir string
	// ConfigFile and HBAFile, when set, are the server's postgresql.conf
	// and pg_hba.conf (a chart's ConfigMap); the manager's own settings
	// are given on the command line over them. Empty: the data
	// directory's, with the manager's settings included and its
	// replication line added.
	ConfigFile, HBAFile string
	// Address is where the other members and clients reach this server
	// (host:port); ListenAddress and Port what it listens on.
	Address, ListenAddress string
	Port                   int
	// User is the superuser, also used for replication; Password its
	// password (empty with trust); HostAuth the pg_hba method for other
	// hosts (scram-sha-256; trust only on a private test network);
	// ReplicationNetwork the CIDR members connect from.
	User, Password, HostAuth, ReplicationNetwork string
	// Credential runs the server as another user (nil: this process's).
	Credential *syscall.Credential
	// LeaseDuration is how long a primary's Lease lasts unrenewed;
	// RenewDeadline how long a primary tries to renew before it fences
	// itself (less than LeaseDuration); Period the loop's period.
	LeaseDuration, RenewDeadline, Period time.Duration
	// Synchronous is the number of synchronous standbys (0 or 1).
	Synchronous int
	// MaxLagBytes: a standby further behind the last primary's position
	// than this does not promote (0: no limit).
	MaxLagBytes int64
	Log         logr.Logger
	// Now is the clock (tests).
	Now func() time.Time
}

func (c *Config) defaults() {
	if c.LeaseDuration == 0 {
		c.LeaseDuration = 10 * time.Second
	}
	if c.RenewDeadline == 0 {
		c.RenewDeadline = c.LeaseDuration * 2 / 3
	}
	if c.Period == 0 {
		c.Period = time.Second
	}
	if c.User == "" {
		c.User = "postgres"
	}
	if c.HostAuth == "" {
		c.HostAuth = "scram-sha-256"
	}
	if c.ReplicationNetwork == "" {
		c.ReplicationNetwork = "0.0.0.0/0"
	}
	if c.Now == nil {
		c.Now = time.Now
	}
}

// Check reports the first configuration error, naming the flag.
func (c *Config) Check() error {
	switch {
	case c.Cluster == "" || c.Namespace == "" || c.Member == "":
		return errors.New("--cluster, --namespace and --member are required")
	case c.Address == "":
		return errors.New("--address (host:port the other members reach this server at) is required")
	case checkAddress(c.Address) != nil:
		return fmt.Errorf("--address: %w", checkAddress(c.Address))
	case c.DataDir == "" || c.Bin == "":
		return errors.New("--data-dir and --bin are required")
	case c.RenewDeadline >= c.LeaseDuration:
		return fmt.Errorf("--renew-deadline %s must be shorter than --lease-duration %s: a primary must stop before its lease can pass to another", c.RenewDeadline, c.LeaseDuration)
	case c.Synchronous < 0 || c.Synchronous > 1:
		return fmt.Errorf("--synchronous %d: 0 or 1", c.Synchronous)
	}
	return nil
}

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
	// following is the primary's address this standby was pointed at.
	following string
	// podLabelled is the pod's role label as last written (nil: unknown).
	podLabelled *bool
	// unlabel is the old primary's pod whose role label a promotion could
	// not remove yet: the primary tries again at each renewal.
	unlabel string
	// waitingFor is the reason last logged for not promoting.
	waitingFor string
	// reported is the position this member last reported.
	reported uint64
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

// member is what a member's Lease says.
type member struct {
	name, address, role string
	lsn                 uint64
	timeline            uint64
	// positioned: the member reported a position and a timeline.
	positioned bool
	settled    bool
	// synchronous: the standbys acknowledging commits (a primary's).
	synchronous []string
	// at is when the member last reported; fresh, within a Lease duration.
	at    time.Time
	fresh bool
}

// ahead reports whether position (timeline, lsn) a is newer than b.
func ahead(aTimeline, aLSN, bTimeline, bLSN uint64) bool {
	if aTimeline != bTimeline {
		return aTimeline > bTimeline
	}
	return aLSN > bLSN
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
	switch {
	case !m.pg.initialized():
		m.cfg.Log.Info("Cloning from the primary", "primary", holder)
		if err := m.pg.basebackup(p.address); err != nil {
			return err
		}
	case !m.pg.isStandby():
		// This data was a primary's: rewind it onto the new timeline.
		m.pg.stop(false)
		m.cfg.Log.Info("Rewinding onto the new primary", "primary", holder)
		if err := m.pg.rewind(p.address); err != nil {
			return err
		}
	}
	if m.following != p.address || !m.pg.running() {
		if err := m.pg.follow(p.address); err != nil && m.pg.running() {
			return err
		}
		m.following = p.address
	}
	if !m.pg.running() {
		if err := m.pg.start(ctx); err != nil {
			return err
		}
	}
	m.setRole(RoleStandby)
	return nil
}

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

// event records an event on the member's pod.
func (m *Manager) event(ctx context.Context, reason, msg string) {
	if m.cfg.Pod == "" {
		return
	}
	now := metav1.NewTime(m.cfg.Now())
	ev := &corev1.Event{
		ObjectMeta:     metav1.ObjectMeta{GenerateName: m.cfg.Pod + ".", Namespace: m.cfg.Namespace},
		InvolvedObject: corev1.ObjectReference{Kind: "Pod", APIVersion: "v1", Namespace: m.cfg.Namespace, Name: m.cfg.Pod},
		Reason:         reason, Message: msg, Type: corev1.EventTypeNormal,
		FirstTimestamp: now, LastTimestamp: now, Count: 1,
		Source: corev1.EventSource{Component: "chartpilot-instance"},
	}
	if _, err := m.cfg.Client.CoreV1().Events(m.cfg.Namespace).Create(ctx, ev, metav1.CreateOptions{}); err != nil {
		m.cfg.Log.Info("Recording an event failed", "error", err.Error())
	}
}

func find(ms []member, name string) (member, bool) {
	for _, o := range ms {
		if o.name == name {
			return o, true
		}
	}
	return member{}, false
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

// members reads every member's Lease.
func (m *Manager) members(ctx context.Context) ([]member, error) {
	list, err := m.cfg.Client.CoordinationV1().Leases(m.cfg.Namespace).List(ctx, metav1.ListOptions{LabelSelector: v1alpha1.LabelCluster + "=" + m.cfg.Cluster})
	if err != nil {
		return nil, err
	}
	var out []member
	for i := range list.Items {
		l := &list.Items[i]
		if l.Name == m.primaryLease() {
			continue
		}
		o := m.parseMember(l)
		// A Lease that carries the cluster's label is not a member unless
		// it is named for its holder (anyone who may create Leases in the
		// namespace can label one).
		if o.name == "" || l.Name != m.memberLease(o.name) {
			continue
		}
		out = append(out, o)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].name < out[j].name })
	return out, nil
}

func (m *Manager) readMember(ctx context.Context, name string) (member, error) {
	l, err := m.cfg.Client.CoordinationV1().Leases(m.cfg.Namespace).Get(ctx, m.memberLease(name), metav1.GetOptions{})
	if err != nil {
		return member{}, fmt.Errorf("reading member %s: %w", name, err)
	}
	return m.parseMember(l), nil
}

// checkAddress accepts host:port only, the host a DNS name or an IP
// address and the port a number: nothing that could add a keyword to a
// connection string or an argument to a command.
func checkAddress(address string) error {
	host, port, err := net.SplitHostPort(address)
	if err != nil {
		return fmt.Errorf("%q is not host:port", clipAddress(address))
	}
	if n, err := strconv.Atoi(port); err != nil || n < 1 || n > 65535 {
		return fmt.Errorf("%q: the port is not a number from 1 to 65535", clipAddress(address))
	}
	if net.ParseIP(host) == nil && len(validation.IsDNS1123Subdomain(host)) > 0 {
		return fmt.Errorf("%q: the host is neither an IP address nor a DNS name", clipAddress(address))
	}
	return nil
}

func clipAddress(a string) string {
	if len(a) > 80 {
		return a[:80] + "…"
	}
	return a
}

func (m *Manager) parseMember(l *coordinationv1.Lease) member {
	o := member{name: ptr.Deref(l.Spec.HolderIdentity, ""), address: l.Annotations[v1alpha1.AnnotationMemberAddress], role: l.Annotations[v1alpha1.AnnotationMemberRole]}
	if err := checkAddress(o.address); err != nil {
		// Never followed, cloned or rewound from: the address goes into
		// primary_conninfo and command lines.
		m.cfg.Log.Info("Ignored a member's address", "lease", l.Name, "error", err.Error())
		o.address = ""
	}
	lsn, err1 := parseLSN(l.Annotations[v1alpha1.AnnotationMemberLSN])
	tli, err2 := strconv.ParseUint(l.Annotations[v1alpha1.AnnotationMemberTimeline], 10, 32)
	o.lsn, o.timeline, o.positioned = lsn, tli, err1 == nil && err2 == nil
	o.settled = l.Annotations[v1alpha1.AnnotationMemberSettled] == "true"
	if v := l.Annotations[v1alpha1.AnnotationSynchronousStandby]; v != "" {
		o.synchronous = strings.Split(v, ",")
	}
	if l.Spec.RenewTime != nil {
		o.at = l.Spec.RenewTime.Time
		o.fresh = m.cfg.Now().Sub(o.at) < m.cfg.LeaseDuration
	}
	return o
}

// report writes this member's Lease: address, role and position.
func (m *Manager) report(ctx context.Context) {
	primary := m.role == RolePrimary
	ann := map[string]string{v1alpha1.AnnotationMemberAddress: m.cfg.Address, v1alpha1.AnnotationMemberRole: m.role}
	if m.pg.running() {
		if l, err := m.pg.lsn(primary); err == nil {
			ann[v1alpha1.AnnotationMemberLSN] = formatLSN(l)
			ann[v1alpha1.AnnotationMemberSettled] = strconv.FormatBool(l == m.reported)
			m.reported = l
		}
		if t, err := m.pg.timeline(primary); err == nil {
			ann[v1alpha1.AnnotationMemberTimeline] = strconv.FormatUint(t, 10)
		}
		if primary && m.cfg.Synchronous > 0 {
			if names, err := m.pg.synchronousStandbys(); err == nil && names != "" {
				ann[v1alpha1.AnnotationSynchronousStandby] = names
			}
		}
	}
	leases := m.cfg.Client.CoordinationV1().Leases(m.cfg.Namespace)
	now := metav1.MicroTime{Time: m.cfg.Now()}
	l, err := leases.Get(ctx, m.memberLease(m.cfg.Member), metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		_, _ = leases.Create(ctx, &coordinationv1.Lease{
			ObjectMeta: metav1.ObjectMeta{Name: m.memberLease(m.cfg.Member), Namespace: m.cfg.Namespace, Labels: map[string]string{v1alpha1.LabelCluster: m.cfg.Cluster}, Annotations: ann},
			Spec:       coordinationv1.LeaseSpec{HolderIdentity: ptr.To(m.cfg.Member), RenewTime: &now},
		}, metav1.CreateOptions{})
		return
	}
	if err != nil {
		return
	}
	// The synchronous standby named last stays named until another is,
	// while this member is (or may again be, after a restart) the primary:
	// the commits it acknowledged are still only certain to be there.
	if _, ok := ann[v1alpha1.AnnotationSynchronousStandby]; !ok && m.role != RoleStandby && l.Annotations[v1alpha1.AnnotationSynchronousStandby] != "" {
		ann[v1alpha1.AnnotationSynchronousStandby] = l.Annotations[v1alpha1.AnnotationSynchronousStandby]
	}
	l.Annotations = ann
	l.Spec.HolderIdentity = ptr.To(m.cfg.Member)
	l.Spec.RenewTime = &now
	_, _ = leases.Update(ctx, l, metav1.UpdateOptions{})
}

// labelPod moves v1alpha1.LabelMemberRole=primary onto (or off) the member's pod, which
// the read-write Service selects.
func (m *Manager) labelPod(ctx context.Context, primary bool) {
	if m.cfg.Pod == "" || (m.podLabelled != nil && *m.podLabelled == primary) {
		return
	}
	if m.patchRole(ctx, m.cfg.Pod, primary) {
		m.podLabelled = &primary
	}
}

// patchRole sets or removes a member pod's role label (the pods of the
// members share the member's names).
func (m *Manager) patchRole(ctx context.Context, pod string, primary bool) bool {
	value := "null"
	if primary {
		value = strconv.Quote(RolePrimary)
	}
	patch := fmt.Sprintf(`{"metadata":{"labels":{%q:%s}}}`, v1alpha1.LabelMemberRole, value)
	if _, err := m.cfg.Client.CoreV1().Pods(m.cfg.Namespace).Patch(ctx, pod, types.MergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil && !apierrors.IsNotFound(err) {
		m.cfg.Log.Info("Labelling a pod failed", "pod", pod, "error", err.Error())
		return false
	}
	return true
}
