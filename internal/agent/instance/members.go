package instance

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"sort"
	"strconv"
	"strings"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/utils/ptr"

	"github.com/chartpilot/chartpilot/internal/api/v1alpha1"
)

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

// event records a Normal event on the member's pod.
func (m *Manager) event(ctx context.Context, reason, msg string) {
	m.eventOf(ctx, corev1.EventTypeNormal, reason, msg)
}

// eventOf records an event of type typ on the member's pod.
func (m *Manager) eventOf(ctx context.Context, typ, reason, msg string) {
	if m.cfg.Pod == "" {
		return
	}
	now := metav1.NewTime(m.cfg.Now())
	ev := &corev1.Event{
		ObjectMeta:     metav1.ObjectMeta{GenerateName: m.cfg.Pod + ".", Namespace: m.cfg.Namespace},
		InvolvedObject: corev1.ObjectReference{Kind: "Pod", APIVersion: "v1", Namespace: m.cfg.Namespace, Name: m.cfg.Pod},
		Reason:         reason, Message: msg, Type: typ,
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

// members reads every member's Lease.
func (m *Manager) members(ctx context.Context) ([]member, error) {
	list, err := m.cfg.Client.CoordinationV1().Leases(m.cfg.Namespace).List(ctx, metav1.ListOptions{LabelSelector: v1alpha1.LabelCluster + "=" + m.cfg.Cluster})
	if err != nil {
		return nil, err
	}
	replicas := m.replicas(ctx)
	var out []member
	for i := range list.Items {
		l := &list.Items[i]
		if l.Name == m.primaryLease() {
			continue
		}
		o := m.parseMember(l)
		// A Lease that carries the cluster's label is not a member unless
		// it is named for its holder (anyone who may create Leases in the
		// namespace can label one), the holder is one of the cluster's
		// pods (CLUSTER-ORDINAL, below the StatefulSet's replicas when it
		// can be read: another cluster's members may create Leases, and
		// update only their own), and it was not renewed in the future (a
		// member that never expires would hold every election up).
		if o.name == "" || l.Name != m.memberLease(o.name) {
			continue
		}
		n, ok := m.ordinal(o.name)
		if !ok || replicas >= 0 && n >= replicas {
			m.cfg.Log.Info("Ignored a Lease that names no member of the cluster", "lease", l.Name, "replicas", replicas)
			continue
		}
		if o.at.After(m.cfg.Now().Add(m.cfg.LeaseDuration)) {
			m.cfg.Log.Info("Ignored a member's Lease renewed in the future", "lease", l.Name, "renewTime", o.at)
			continue
		}
		out = append(out, o)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].name < out[j].name })
	return out, nil
}

// ordinal is the ordinal of member name (CLUSTER-N, N written as the
// StatefulSet writes it).
func (m *Manager) ordinal(name string) (int, bool) {
	digits, ok := strings.CutPrefix(name, m.cfg.Cluster+"-")
	if !ok || digits == "" || len(digits) > 6 || digits != strings.TrimLeft(digits, "0") && digits != "0" {
		return 0, false
	}
	n, err := strconv.Atoi(digits)
	return n, err == nil && n >= 0
}

// replicas is the cluster's StatefulSet's replicas (named as the
// cluster), read at each election; -1 when it cannot be read (no
// StatefulSet, as in tests of the manager alone, or no right to read
// it): members are then not bounded.
func (m *Manager) replicas(ctx context.Context) int {
	sts, err := m.cfg.Client.AppsV1().StatefulSets(m.cfg.Namespace).Get(ctx, m.cfg.Cluster, metav1.GetOptions{})
	if err != nil {
		if !apierrors.IsNotFound(err) {
			m.cfg.Log.Info("Reading the StatefulSet's replicas failed: members are not bounded by it", "error", err.Error())
		}
		return -1
	}
	return int(ptr.Deref(sts.Spec.Replicas, 1))
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
		if a := m.archiving(ctx); a != "" {
			ann[v1alpha1.AnnotationMemberArchive] = a
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

// archiveEvery is how often a member reads its server's archiving.
const archiveEvery = 10 * time.Second

// archiveQuery reads pg_stat_archiver and the files waiting in
// archive_status as one JSON object (v1alpha1.ArchiveReport); no row when
// the server does not archive.
const archiveQuery = `SELECT json_build_object(
  'wal', coalesce(last_archived_wal, ''), 'at', coalesce(floor(extract(epoch FROM last_archived_time))::bigint, 0),
  'failed', failed_count, 'failedWAL', coalesce(last_failed_wal, ''), 'failedAt', coalesce(floor(extract(epoch FROM last_failed_time))::bigint, 0),
  'pending', (SELECT count(*) FROM pg_ls_archive_statusdir() WHERE name LIKE '%.ready'))::text
FROM pg_stat_archiver WHERE current_setting('archive_mode') <> 'off'`

// archiving is the server's archiving (JSON) for its Lease, read at most
// every archiveEvery; "" when it does not archive or cannot say. When its
// newest attempt starts failing, or succeeds again, an event on the pod
// says so.
func (m *Manager) archiving(ctx context.Context) string {
	now := m.cfg.Now()
	if now.Sub(m.archiveReadAt) < archiveEvery {
		return m.archive
	}
	m.archiveReadAt = now
	out, err := m.pg.query(archiveQuery)
	if err != nil {
		out = ""
	}
	m.archive = out
	var r v1alpha1.ArchiveReport
	if out == "" || json.Unmarshal([]byte(out), &r) != nil {
		return out
	}
	failing := r.FailedAt > 0 && r.FailedAt >= r.At
	switch {
	case failing && !m.archiveFailing:
		m.eventOf(ctx, corev1.EventTypeWarning, "WALArchiveFailing", fmt.Sprintf("archiving WAL file %s failed: the server keeps its WAL until it is stored; the wal-agent container's log says why", r.FailedWAL))
	case !failing && m.archiveFailing:
		m.eventOf(ctx, corev1.EventTypeNormal, "WALArchiveRecovered", fmt.Sprintf("archiving works again: %s stored", r.WAL))
	}
	m.archiveFailing = failing
	return out
}
