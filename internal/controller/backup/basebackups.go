package backup

import (
	"context"
	"fmt"
	"sort"
	"time"

	"github.com/robfig/cron/v3"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"

	"github.com/chartpilot/chartpilot/internal/api/v1alpha1"
)

// keepBaseBackups is how many completed scheduled physical Backups are
// kept as objects (their data stays until the archive's own pruning).
const keepBaseBackups = 7

// baseRetry is how long after a failed base backup the next is taken when
// the archive has none (otherwise the schedule's next time).
const baseRetry = 15 * time.Minute

// baseBackups takes the scheduled base backups of pg's WAL archive (into
// status.backup's base-backup fields): one as soon as the archive of pg's
// major has none and pg serves (a new archive, or the new major's after a
// major upgrade), then one at each time of
// spec.backup.walArchive.baseBackupSchedule. It returns when to look
// again (zero: nothing scheduled). all are pg's namespace's Backups.
func (r *ScheduleReconciler) baseBackups(ctx context.Context, pg *v1alpha1.Postgres, all []v1alpha1.Backup, now time.Time) (time.Time, error) {
	sb := pg.Spec.Backup
	if sb.WALArchive == nil {
		return time.Time{}, nil
	}
	spec := sb.WALArchive.BaseBackupSchedule
	if spec == "" {
		spec = v1alpha1.DefaultBaseBackupSchedule
	}
	sched, err := cron.ParseStandard(spec)
	if err != nil {
		r.Recorder.Event(pg, corev1.EventTypeWarning, "InvalidSchedule", fmt.Sprintf("spec.backup.walArchive.baseBackupSchedule %q: %v: give 5 fields (minute hour day-of-month month day-of-week), e.g. \"0 0 * * *\"", spec, err))
		return time.Time{}, nil
	}
	var mine []*v1alpha1.Backup
	var current *v1alpha1.Backup // the newest completed base backup of pg's major
	active := false
	for i := range all {
		b := &all[i]
		if b.Spec.Target.Kind != "Postgres" || b.Spec.Target.Name != pg.Name || b.MethodOf() != v1alpha1.BackupPhysical {
			continue
		}
		if p := b.Status.Phase; p == "" || p == v1alpha1.BackupPending || p == v1alpha1.BackupRunning {
			active = true
		}
		if b.Status.Phase == v1alpha1.BackupCompleted && majorOf(b.Status.DatabaseVersion) == majorOf(pg.Spec.Version) &&
			(current == nil || b.Status.CompletedAt.After(current.Status.CompletedAt.Time)) {
			current = b
		}
		if scheduled(b) && b.DeletionTimestamp == nil {
			mine = append(mine, b)
		}
	}
	sort.Slice(mine, func(i, j int) bool { return scheduledAt(mine[i]).After(scheduledAt(mine[j])) })
	st := pg.Status.Backup
	st.LastBaseBackup, st.LastBaseBackupTime = "", nil
	if current != nil {
		st.LastBaseBackup, st.LastBaseBackupTime = current.Name, current.Status.CompletedAt
	}
	next := sched.Next(now)
	st.NextBaseBackupTime = &metav1.Time{Time: next}
	if sb.Suspend {
		st.NextBaseBackupTime = nil
		return time.Time{}, nil
	}
	var due time.Time
	switch {
	case active:
	case current == nil:
		// At once, but not again within baseRetry of a failed one.
		if len(mine) > 0 && mine[0].Status.Phase == v1alpha1.BackupFailed && mine[0].Status.CompletedAt != nil {
			if retry := mine[0].Status.CompletedAt.Add(baseRetry); retry.After(now) {
				return retry, r.retain(ctx, &v1alpha1.BackupRetention{Count: keepBaseBackups}, mine, now)
			}
		}
		if serving(pg) {
			due = now.Truncate(time.Minute)
		}
	default:
		anchor := current.CreationTimestamp.Time
		if len(mine) > 0 && scheduledAt(mine[0]).After(anchor) {
			anchor = scheduledAt(mine[0])
		}
		due, _ = dueTime(sched, anchor, now)
	}
	if !due.IsZero() {
		b, err := r.createBase(ctx, pg, due)
		if err != nil {
			return time.Time{}, err
		}
		if b != nil {
			why := "the schedule time " + due.UTC().Format(time.RFC3339)
			if current == nil {
				why = "the archive of PostgreSQL " + majorOf(pg.Spec.Version) + " has no base backup yet"
			}
			r.Recorder.Event(pg, corev1.EventTypeNormal, "BaseBackupScheduled", fmt.Sprintf("Backup %s (physical) for %s", b.Name, why))
			mine = append([]*v1alpha1.Backup{b}, mine...)
		}
	}
	return next, r.retain(ctx, &v1alpha1.BackupRetention{Count: keepBaseBackups}, mine, now)
}

// createBase makes the physical Backup of time due, owned by pg; nil when
// it exists already (made before a restart).
func (r *ScheduleReconciler) createBase(ctx context.Context, pg *v1alpha1.Postgres, due time.Time) (*v1alpha1.Backup, error) {
	b := &v1alpha1.Backup{
		ObjectMeta: metav1.ObjectMeta{
			Namespace:   pg.Namespace,
			Name:        truncate(pg.Name, 40) + "-base-" + due.UTC().Format("200601021504"),
			Labels:      map[string]string{v1alpha1.LabelScheduledBy: pg.Name},
			Annotations: map[string]string{v1alpha1.AnnotationScheduledAt: due.UTC().Format(time.RFC3339)},
		},
		Spec: v1alpha1.BackupSpec{Target: v1alpha1.BackupTarget{Kind: "Postgres", Name: pg.Name}, Store: pg.Spec.Backup.Store, Method: v1alpha1.BackupPhysical},
	}
	if b.Spec.Store.Kind == "" {
		b.Spec.Store.Kind = "BackupStore"
	}
	if err := controllerutil.SetControllerReference(pg, b, r.Client.Scheme()); err != nil {
		return nil, err
	}
	if err := r.Client.Create(ctx, b); err != nil {
		if apierrors.IsAlreadyExists(err) {
			return nil, nil
		}
		return nil, fmt.Errorf("creating Backup %s: %w", b.Name, err)
	}
	return b, nil
}
