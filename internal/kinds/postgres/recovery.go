package postgres

import (
	"context"
	"encoding/json"
	"fmt"
	"regexp"
	"sort"
	"strings"

	"github.com/prometheus/client_golang/prometheus"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/metrics"

	"github.com/chartpilot/chartpilot/internal/api/v1alpha1"
)

// RecoverContainer is the chart's init container of pod 0 that makes the
// first data from a WAL archive (bootstrap.recovery).
const RecoverContainer = "recover"

// recoveryStatus is status.recovery of a Postgres with
// spec.bootstrap.recovery, read from pod 0's recover container: its state,
// and the outcome it writes as its termination message. A completed
// recovery is kept as it was (later pods skip it). nil without
// spec.bootstrap.recovery.
func recoveryStatus(ctx context.Context, c client.Reader, obj *unstructured.Unstructured, pg *v1alpha1.Postgres) (*v1alpha1.PostgresRecoveryStatus, error) {
	if pg.Spec.Bootstrap == nil || pg.Spec.Bootstrap.Recovery == nil {
		return nil, nil
	}
	if prev := pg.Status.Recovery; prev != nil && prev.Phase == v1alpha1.RecoveryCompleted {
		return prev, nil
	}
	rec := pg.Spec.Bootstrap.Recovery
	st := &v1alpha1.PostgresRecoveryStatus{Phase: v1alpha1.RecoveryPending, Target: recoveryTarget(rec), Archive: recoveryArchive(pg)}
	pod := &corev1.Pod{}
	name := obj.GetName() + "-0"
	err := c.Get(ctx, types.NamespacedName{Namespace: obj.GetNamespace(), Name: name}, pod)
	switch {
	case apierrors.IsNotFound(err):
		st.Message = "waiting for pod " + name + ", which recovers before its server starts"
		return st, nil
	case err != nil:
		return nil, fmt.Errorf("reading pod %s: %w", name, err)
	}
	var cs *corev1.ContainerStatus
	for i := range pod.Status.InitContainerStatuses {
		if pod.Status.InitContainerStatuses[i].Name == RecoverContainer {
			cs = &pod.Status.InitContainerStatuses[i]
		}
	}
	if cs == nil {
		st.Message = "pod " + name + " has not started its " + RecoverContainer + " container yet"
		return st, nil
	}
	term := cs.State.Terminated
	if term == nil && cs.State.Running == nil {
		term = cs.LastTerminationState.Terminated // waiting to be restarted
	}
	switch {
	case cs.State.Running != nil:
		st.Phase, st.Message = v1alpha1.RecoveryRunning, "pod "+name+" recovers from the archive"
	case term != nil:
		readOutcome(st, term)
	default:
		st.Message = "pod " + name + "'s " + RecoverContainer + " container waits to start"
	}
	return st, nil
}

// readOutcome fills st from the recover container's end: the agent's
// outcome (JSON) as its termination message, else the message's last line.
func readOutcome(st *v1alpha1.PostgresRecoveryStatus, term *corev1.ContainerStateTerminated) {
	var out struct {
		Phase               string `json:"phase"`
		Message             string `json:"message"`
		Target              string `json:"target"`
		Base                string `json:"base"`
		Timeline            int64  `json:"timeline"`
		LastTransactionTime string `json:"lastTransactionTime"`
	}
	if err := json.Unmarshal([]byte(term.Message), &out); err != nil {
		out.Message = lastLine(term.Message)
	}
	st.Message = clip(out.Message, 1024)
	if out.Target != "" {
		st.Target = out.Target
	}
	st.BaseBackup, st.Timeline, st.LastTransactionTime = out.Base, out.Timeline, out.LastTransactionTime
	if term.ExitCode == 0 {
		st.Phase = v1alpha1.RecoveryCompleted
		if out.Phase == "Skipped" {
			st.Phase, st.Message = v1alpha1.RecoverySkipped, "the recovery did not run: "+st.Message
		}
		return
	}
	st.Phase = v1alpha1.RecoveryFailed
	if st.Message == "" {
		st.Message = fmt.Sprintf("the %s container ended with exit code %d", RecoverContainer, term.ExitCode)
	}
	st.Message += " (the kubelet tries again; the server does not start until the recovery succeeds)"
}

// recoveryArchive names the archive a recovery reads: KIND/STORE:PREFIX.
func recoveryArchive(pg *v1alpha1.Postgres) string {
	rec := pg.Spec.Bootstrap.Recovery
	ref := rec.Store
	if ref == nil && pg.Spec.Backup != nil {
		ref = &pg.Spec.Backup.Store
	}
	prefix := rec.Prefix
	if prefix == "" {
		prefix = pg.Namespace + "/" + rec.Source
	}
	prefix += "/pg" + strings.SplitN(strings.TrimSpace(pg.Spec.Version), ".", 2)[0]
	if ref == nil {
		return prefix
	}
	kind := ref.Kind
	if kind == "" {
		kind = "BackupStore"
	}
	return kind + "/" + ref.Name + ":" + prefix
}

// recoveryTarget says what a recovery stops at, as the agent does.
func recoveryTarget(r *v1alpha1.PostgresRecovery) string {
	switch {
	case r.TargetTime != "":
		return "time " + r.TargetTime
	case r.TargetLSN != "":
		return "LSN " + r.TargetLSN
	case r.TargetXID != "":
		return "transaction " + r.TargetXID
	}
	return "the end of the archive"
}

func lastLine(s string) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return strings.TrimSpace(lines[len(lines)-1])
}

func clip(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}

// archiveBehindFiles is how many files may wait to be archived before the
// archiving is Behind: more than the agent uploads at once, several times.
const archiveBehindFiles = 16

// readArchiving fills status.archiving and the archiving metrics from the
// members' Leases (label chartpilot.dev/cluster=NAME, one list), which
// their instance managers annotate with their servers' archiving: the
// metrics are the primary's; the state is Failing when any member's
// newest attempt failed (standbys archive too), Behind when the
// primary's files wait. A report that does not parse, or names no WAL
// file, is left out. Only a Postgres with spec.backup.walArchive and a
// known primary.
func readArchiving(ctx context.Context, c client.Reader, obj *unstructured.Unstructured, pg *v1alpha1.Postgres, st *v1alpha1.PostgresStatus) error {
	if pg.Spec.Backup == nil || pg.Spec.Backup.WALArchive == nil || st.Primary == "" {
		archiveMetrics.forget(obj.GetNamespace(), obj.GetName())
		return nil
	}
	leases := &coordinationv1.LeaseList{}
	if err := c.List(ctx, leases, client.InNamespace(obj.GetNamespace()), client.MatchingLabels{v1alpha1.LabelCluster: obj.GetName()}); err != nil {
		return fmt.Errorf("listing the members' Leases: %w", err)
	}
	member := regexp.MustCompile("^" + regexp.QuoteMeta(obj.GetName()) + "-[0-9]{1,3}$")
	reports := map[string]v1alpha1.ArchiveReport{}
	for _, l := range leases.Items {
		m := ptr.Deref(l.Spec.HolderIdentity, "")
		if l.Name != obj.GetName()+"-"+m || !member.MatchString(m) {
			continue
		}
		if r, ok := parseArchiveReport(l.Annotations[v1alpha1.AnnotationMemberArchive]); ok {
			reports[m] = r
		}
	}
	primary, ok := reports[st.Primary]
	if !ok {
		return nil
	}
	archiveMetrics.set(obj.GetNamespace(), obj.GetName(), primary)
	st.Archiving = archivingState(primary, st.Primary)
	if st.Archiving.State != v1alpha1.ArchivingFailing {
		names := make([]string, 0, len(reports))
		for m := range reports {
			names = append(names, m)
		}
		sort.Strings(names)
		for _, m := range names {
			if s := archivingState(reports[m], m); s.State == v1alpha1.ArchivingFailing {
				s.Message = "standby " + m + ": " + s.Message
				st.Archiving = s
				break
			}
		}
	}
	return nil
}

// walFileName is a file of pg_wal the archive holds: a segment, a
// timeline's history, a partial segment or a backup's history.
var walFileName = regexp.MustCompile(`^([0-9A-F]{24}(\.partial|\.[0-9A-F]{8}\.backup)?|[0-9A-F]{8}\.history)$`)

// parseArchiveReport reads a member's annotation; false when it is not
// one an instance manager writes.
func parseArchiveReport(raw string) (v1alpha1.ArchiveReport, bool) {
	var r v1alpha1.ArchiveReport
	if raw == "" || len(raw) > 1024 || json.Unmarshal([]byte(raw), &r) != nil {
		return r, false
	}
	for _, name := range []string{r.WAL, r.FailedWAL} {
		if name != "" && !walFileName.MatchString(name) {
			return r, false
		}
	}
	if r.At < 0 || r.FailedAt < 0 || r.Failed < 0 || r.Pending < 0 {
		return r, false
	}
	return r, true
}

// archiveMetrics are the primaries' archiving figures.
var archiveMetrics = newArchiveGauges()

type archiveGauges struct {
	lastArchived, lastFailed, failures, pending *prometheus.GaugeVec
}

func newArchiveGauges() archiveGauges {
	labels := []string{"namespace", "name"}
	a := archiveGauges{
		lastArchived: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "chartpilot_postgres_wal_last_archived_timestamp_seconds",
			Help: "When the primary of a Postgres last archived a WAL file (Unix time)."}, labels),
		lastFailed: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "chartpilot_postgres_wal_last_archive_failure_timestamp_seconds",
			Help: "When archiving a WAL file of the primary of a Postgres last failed (Unix time; 0: never since its server started)."}, labels),
		failures: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "chartpilot_postgres_wal_archive_failures",
			Help: "Failed attempts to archive WAL files since the primary's server started."}, labels),
		pending: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "chartpilot_postgres_wal_archive_pending_files",
			Help: "WAL files of the primary of a Postgres waiting to be archived."}, labels),
	}
	metrics.Registry.MustRegister(a.lastArchived, a.lastFailed, a.failures, a.pending)
	return a
}

func (a archiveGauges) set(ns, name string, r v1alpha1.ArchiveReport) {
	a.lastArchived.WithLabelValues(ns, name).Set(float64(r.At))
	a.lastFailed.WithLabelValues(ns, name).Set(float64(r.FailedAt))
	a.failures.WithLabelValues(ns, name).Set(float64(r.Failed))
	a.pending.WithLabelValues(ns, name).Set(float64(r.Pending))
}

func (a archiveGauges) forget(ns, name string) {
	for _, v := range []*prometheus.GaugeVec{a.lastArchived, a.lastFailed, a.failures, a.pending} {
		v.DeleteLabelValues(ns, name)
	}
}

// Conditions is the Postgres kind's own condition: ContinuousArchiving,
// from status.archiving (removed when the Postgres does not archive or no
// member reported yet).
func Conditions(fields map[string]any) map[string]*metav1.Condition {
	a, _ := fields["archiving"].(map[string]any)
	if a == nil {
		return map[string]*metav1.Condition{v1alpha1.ConditionContinuousArchiving: nil}
	}
	state, _ := a["state"].(string)
	msg, _ := a["message"].(string)
	c := &metav1.Condition{Status: metav1.ConditionTrue, Reason: "Archiving", Message: "every WAL file closed is archived"}
	if member, _ := a["member"].(string); member != "" {
		c.Message += " (as " + member + ", the primary, reports)"
	}
	switch state {
	case v1alpha1.ArchivingFailing:
		c.Status, c.Reason, c.Message = metav1.ConditionFalse, "ArchiveFailing", msg
	case v1alpha1.ArchivingBehind:
		c.Status, c.Reason, c.Message = metav1.ConditionFalse, "ArchiveBehind", msg
	}
	return map[string]*metav1.Condition{v1alpha1.ConditionContinuousArchiving: c}
}

// archivingState is the state a member's archive report says.
func archivingState(r v1alpha1.ArchiveReport, member string) *v1alpha1.PostgresArchivingStatus {
	s := &v1alpha1.PostgresArchivingStatus{State: v1alpha1.ArchivingOK, Member: member}
	switch {
	case r.FailedAt > 0 && r.FailedAt >= r.At:
		s.State = v1alpha1.ArchivingFailing
		s.Message = fmt.Sprintf("archiving %s failed; the server keeps its WAL until it is stored: see the wal-agent container's log of pod %s", r.FailedWAL, member)
	case r.Pending > archiveBehindFiles:
		s.State = v1alpha1.ArchivingBehind
		s.Message = fmt.Sprintf("more than %d WAL files wait to be archived: the store does not keep up, and the newest recoverable point falls behind", archiveBehindFiles)
	}
	return s
}
