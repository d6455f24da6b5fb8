package backup

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"

	"github.com/robfig/cron/v3"

	"github.com/chartpilot/chartpilot/internal/api/v1alpha1"
	"github.com/chartpilot/chartpilot/internal/controller/patch"
	"github.com/chartpilot/chartpilot/internal/jobspec"
)

// keepFailed is how many failed scheduled Backups are kept (older ones are
// deleted; a failed Backup holds no data).
const keepFailed = 3

// maxCatchUp bounds the schedule times walked to find the newest one
// missed (a year of a schedule every minute).
const maxCatchUp = 600_000

// ScheduleReconciler makes the scheduled Backups of each Postgres with a
// spec.backup: one Backup per schedule time, never two at once, one for
// all the times missed while the operator was down. It deletes the
// scheduled Backups retention no longer keeps (their Jobs prune the data
// by the same rule), and reports status.backup and LastBackupSucceeded.
type ScheduleReconciler struct {
	Deps
}

// SetupWithManager builds the controller: Postgres and the Backups it owns.
func (r *ScheduleReconciler) SetupWithManager(mgr ctrl.Manager) error {
	withDefaults(&r.Now, nil)
	return ctrl.NewControllerManagedBy(mgr).Named("backupschedule").For(&v1alpha1.Postgres{}).Owns(&v1alpha1.Backup{}).Owns(&batchv1.Job{}).
		WithOptions(options(r.SkipNameValidation)).Complete(r)
}

// Reconcile makes what the schedule of one Postgres asks for now.
func (r *ScheduleReconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	pg := &v1alpha1.Postgres{}
	if err := r.Client.Get(ctx, req.NamespacedName, pg); err != nil {
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	before := pg.DeepCopy()
	sb := pg.Spec.Backup
	if sb == nil {
		pg.Status.Backup = nil
		apimeta.RemoveStatusCondition(&pg.Status.Conditions, v1alpha1.ConditionLastBackupSucceeded)
		return ctrl.Result{}, r.write(ctx, before, pg)
	}
	sched, err := cron.ParseStandard(sb.Schedule)
	if err != nil {
		msg := fmt.Sprintf("spec.backup.schedule %q: %v: give 5 fields (minute hour day-of-month month day-of-week), e.g. \"30 2 * * *\"", sb.Schedule, err)
		if c := apimeta.FindStatusCondition(pg.Status.Conditions, v1alpha1.ConditionLastBackupSucceeded); c == nil || c.Reason != "InvalidSchedule" || c.Message != msg {
			r.Recorder.Event(pg, corev1.EventTypeWarning, "InvalidSchedule", msg)
		}
		r.condition(pg, metav1.ConditionFalse, "InvalidSchedule", msg)
		return ctrl.Result{}, r.write(ctx, before, pg)
	}

	list := &v1alpha1.BackupList{}
	if err := r.Client.List(ctx, list, client.InNamespace(pg.Namespace)); err != nil {
		return ctrl.Result{}, err
	}
	var mine, byTarget []*v1alpha1.Backup
	for i := range list.Items {
		b := &list.Items[i]
		if b.Spec.Target.Kind != "Postgres" || b.Spec.Target.Name != pg.Name || b.MethodOf() != v1alpha1.BackupLogical {
			// Base backups belong to the WAL archive: neither drilled
			// nor counted here.
			continue
		}
		byTarget = append(byTarget, b)
		if scheduled(b) && b.DeletionTimestamp == nil {
			mine = append(mine, b)
		}
	}
	sort.Slice(mine, func(i, j int) bool { return scheduledAt(mine[i]).After(scheduledAt(mine[j])) })

	now := r.Now()
	anchor := pg.CreationTimestamp.Time
	active := false
	for _, b := range mine {
		if t := scheduledAt(b); t.After(anchor) {
			anchor = t
		}
		if p := b.Status.Phase; p == "" || p == v1alpha1.BackupPending || p == v1alpha1.BackupRunning {
			active = true
		}
	}
	due, missed := dueTime(sched, anchor, now)
	if !due.IsZero() && !sb.Suspend && !active {
		b, err := r.create(ctx, pg, due)
		if err != nil {
			return ctrl.Result{}, err
		}
		if b != nil {
			msg := fmt.Sprintf("Backup %s for the schedule time %s", b.Name, due.UTC().Format(time.RFC3339))
			if missed > 1 {
				msg += fmt.Sprintf(" (one backup for %d schedule times missed)", missed)
			}
			r.Recorder.Event(pg, corev1.EventTypeNormal, "BackupScheduled", msg)
			mine = append([]*v1alpha1.Backup{b}, mine...)
			byTarget = append(byTarget, b)
		}
	}
	if err := r.retain(ctx, sb.Retention, mine, now); err != nil {
		return ctrl.Result{}, err
	}
	r.report(pg, sched, mine, byTarget, now)
	if prev := before.Status.Backup; prev != nil {
		st := pg.Status.Backup
		st.VerifyJob, st.LastVerifyTime, st.LastVerifiedBackup, st.LastVerifyResult = prev.VerifyJob, prev.LastVerifyTime, prev.LastVerifiedBackup, prev.LastVerifyResult
		st.PruneJob, st.LastPruneTime, st.LastPruneResult, st.Archive = prev.PruneJob, prev.LastPruneTime, prev.LastPruneResult, prev.Archive
	}
	nextVerify, err := r.drill(ctx, pg, now)
	if err != nil {
		return ctrl.Result{}, err
	}
	nextBase, err := r.baseBackups(ctx, pg, list.Items, now)
	if err != nil {
		return ctrl.Result{}, err
	}
	nextPrune, err := r.prune(ctx, pg, now)
	if err != nil {
		return ctrl.Result{}, err
	}
	if err := r.write(ctx, before, pg); err != nil {
		return ctrl.Result{}, err
	}
	var next time.Time
	if n := pg.Status.Backup.NextScheduleTime; n != nil {
		next = n.Time
	}
	return wakeAt(now, next, nextVerify, nextBase, nextPrune), nil
}

// wakeAt asks to be called again at the earliest of times (zero ones left
// out), at least a second from now; nothing when all are zero.
func wakeAt(now time.Time, times ...time.Time) ctrl.Result {
	var next time.Time
	for _, t := range times {
		if !t.IsZero() && (next.IsZero() || t.Before(next)) {
			next = t
		}
	}
	if next.IsZero() {
		return ctrl.Result{}
	}
	return ctrl.Result{RequeueAfter: max(next.Sub(now), time.Second)}
}

// dueTime is the newest schedule time after anchor and not after now, and
// how many schedule times there were in that span (zero time and 0: none).
func dueTime(s cron.Schedule, anchor, now time.Time) (time.Time, int) {
	var due time.Time
	n := 0
	for t := s.Next(anchor); !t.IsZero() && !t.After(now) && n < maxCatchUp; t = s.Next(t) {
		due = t
		n++
	}
	return due, n
}

func scheduledAt(b *v1alpha1.Backup) time.Time {
	t, err := time.Parse(time.RFC3339, b.Annotations[v1alpha1.AnnotationScheduledAt])
	if err != nil {
		return b.CreationTimestamp.Time
	}
	return t
}

// create makes the Backup of schedule time due, owned by pg; nil when it
// exists already (made before a restart).
func (r *ScheduleReconciler) create(ctx context.Context, pg *v1alpha1.Postgres, due time.Time) (*v1alpha1.Backup, error) {
	b := &v1alpha1.Backup{
		ObjectMeta: metav1.ObjectMeta{
			Namespace:   pg.Namespace,
			Name:        pg.Name + "-" + due.UTC().Format("200601021504"),
			Labels:      map[string]string{v1alpha1.LabelScheduledBy: pg.Name},
			Annotations: map[string]string{v1alpha1.AnnotationScheduledAt: due.UTC().Format(time.RFC3339)},
		},
		Spec: v1alpha1.BackupSpec{Target: v1alpha1.BackupTarget{Kind: "Postgres", Name: pg.Name}, Store: pg.Spec.Backup.Store},
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

// retain deletes the scheduled Backups (newest first in mine) that keep
// does not keep, by the rule the Jobs prune the data with: beyond Count or
// older than MaxAge, never the newest completed one; and failed ones
// beyond the newest keepFailed.
func (r *ScheduleReconciler) retain(ctx context.Context, keep *v1alpha1.BackupRetention, mine []*v1alpha1.Backup, now time.Time) error {
	completed, failed := 0, 0
	for _, b := range mine {
		var drop bool
		switch b.Status.Phase {
		case v1alpha1.BackupCompleted:
			completed++
			if keep != nil && completed > 1 {
				beyondCount := keep.Count > 0 && completed > keep.Count
				tooOld := keep.MaxAge != nil && keep.MaxAge.Duration > 0 && now.Sub(scheduledAt(b)) > keep.MaxAge.Duration
				drop = beyondCount || tooOld
			}
		case v1alpha1.BackupFailed:
			failed++
			drop = failed > keepFailed
		}
		if !drop {
			continue
		}
		if err := r.Client.Delete(ctx, b, client.Preconditions{UID: &b.UID}); err != nil && !apierrors.IsNotFound(err) {
			return fmt.Errorf("deleting Backup %s, which retention does not keep: %w", b.Name, err)
		}
	}
	return nil
}

// report fills status.backup and LastBackupSucceeded.
func (r *ScheduleReconciler) report(pg *v1alpha1.Postgres, sched cron.Schedule, mine, byTarget []*v1alpha1.Backup, now time.Time) {
	st := &v1alpha1.PostgresBackupStatus{}
	if len(mine) > 0 {
		t := metav1.NewTime(scheduledAt(mine[0]))
		st.LastScheduleTime = &t
	}
	if !pg.Spec.Backup.Suspend {
		t := metav1.NewTime(sched.Next(now))
		st.NextScheduleTime = &t
	}
	sort.Slice(byTarget, func(i, j int) bool { return byTarget[j].CreationTimestamp.Before(&byTarget[i].CreationTimestamp) })
	var lastDone *v1alpha1.Backup
	for _, b := range byTarget {
		if st.LastBackup == "" {
			st.LastBackup, st.LastBackupPhase = b.Name, b.Status.Phase
		}
		if b.Status.CompletedAt == nil {
			continue
		}
		if lastDone == nil || b.Status.CompletedAt.After(lastDone.Status.CompletedAt.Time) {
			lastDone = b
		}
		if b.Status.Phase == v1alpha1.BackupCompleted && (st.LastSuccessTime == nil || b.Status.CompletedAt.After(st.LastSuccessTime.Time)) {
			st.LastSuccessfulBackup, st.LastSuccessTime = b.Name, b.Status.CompletedAt
		}
	}
	pg.Status.Backup = st
	switch {
	case lastDone == nil:
		r.condition(pg, metav1.ConditionUnknown, "NoBackupYet", "no backup has finished yet")
	case lastDone.Status.Phase == v1alpha1.BackupCompleted:
		r.condition(pg, metav1.ConditionTrue, "BackupCompleted", fmt.Sprintf("Backup %s completed at %s (%d bytes)", lastDone.Name, lastDone.Status.CompletedAt.UTC().Format(time.RFC3339), lastDone.Status.Size))
	default:
		r.condition(pg, metav1.ConditionFalse, "BackupFailed", fmt.Sprintf("Backup %s failed: %s", lastDone.Name, lastDone.Status.Message))
	}
}

func (r *ScheduleReconciler) condition(pg *v1alpha1.Postgres, status metav1.ConditionStatus, reason, msg string) {
	apimeta.SetStatusCondition(&pg.Status.Conditions, metav1.Condition{Type: v1alpha1.ConditionLastBackupSucceeded, Status: status,
		Reason: reason, Message: msg, ObservedGeneration: pg.Generation})
}

// write patches status.backup and the condition when they changed, with
// optimistic locking: the release reconciler writes the same status, and
// a view from a stale cache must not undo its newer conditions.
func (r *ScheduleReconciler) write(ctx context.Context, before, pg *v1alpha1.Postgres) error {
	_, err := patch.Status(ctx, r.Client, before, pg, "status.backup")
	return err
}

// drill runs the restore drills of spec.backup.verify: when one is due
// and none runs, a Job of the agent (`chartpilot backup verify`) restores
// the newest completed backup into a throwaway database of the server;
// its end is recorded in status.backup. It returns when the next is due.
func (r *ScheduleReconciler) drill(ctx context.Context, pg *v1alpha1.Postgres, now time.Time) (time.Time, error) {
	sb, st := pg.Spec.Backup, pg.Status.Backup
	if sb.Verify == "" {
		return time.Time{}, nil
	}
	vs, err := cron.ParseStandard(sb.Verify)
	if err != nil {
		msg := fmt.Sprintf("spec.backup.verify %q: %v: give 5 fields or @daily, @weekly", sb.Verify, err)
		if st.LastVerifyResult != msg {
			r.Recorder.Event(pg, corev1.EventTypeWarning, "InvalidSchedule", msg)
		}
		st.LastVerifyResult = msg
		return time.Time{}, nil
	}
	if st.VerifyJob != "" {
		return vs.Next(now), r.followDrill(ctx, pg)
	}
	anchor := pg.CreationTimestamp.Time
	if st.LastVerifyTime != nil {
		anchor = st.LastVerifyTime.Time
	}
	due, _ := dueTime(vs, anchor, now)
	if due.IsZero() || st.LastSuccessfulBackup == "" {
		return vs.Next(now), nil
	}
	b := &v1alpha1.Backup{}
	if err := r.Client.Get(ctx, types.NamespacedName{Namespace: pg.Namespace, Name: st.LastSuccessfulBackup}, b); err != nil {
		return vs.Next(now), client.IgnoreNotFound(err)
	}
	store, why, _ := resolveStore(ctx, r.Client, r.Reader, b.Namespace, b.Spec.Store)
	released := apimeta.FindStatusCondition(pg.Status.Conditions, v1alpha1.ConditionReleased)
	if store == nil || released == nil || released.Status != metav1.ConditionTrue || pg.Status.Endpoints == nil {
		if why == "" {
			why = "the release is not deployed"
		}
		st.LastVerifyResult = "Waiting: " + why
		return now.Add(time.Minute), nil
	}
	name := fmt.Sprintf("verify-%s-%s", truncate(pg.Name, 40), due.UTC().Format("200601021504"))
	job := jobspec.Drill{Backup: b, Target: pg, Store: store.spec, Name: name,
		Images: jobspec.Images{Agent: r.Image, Postgres: r.PostgresImage}, Deadline: DefaultDeadline}.Job()
	if refusal, err := r.startJob(ctx, pg, job); err != nil {
		return time.Time{}, err
	} else if refusal != "" {
		st.LastVerifyResult = "Failed: " + refusal
		return now.Add(time.Minute), nil
	}
	t := metav1.NewTime(due)
	st.VerifyJob, st.LastVerifyTime, st.LastVerifyResult = name, &t, "Running: Job "+name+" restores Backup "+b.Name+" into a throwaway server"
	r.Recorder.Event(pg, corev1.EventTypeNormal, "BackupVerifyStarted", st.LastVerifyResult)
	return vs.Next(now), nil
}

func truncate(s string, n int) string {
	if len(s) > n {
		return s[:n]
	}
	return s
}

// startJob creates job, owned by pg, as pg's identity. refusal is why the
// API server refused it to that identity (not an error: the status says
// so, and the schedule tries again later).
func (r *ScheduleReconciler) startJob(ctx context.Context, pg *v1alpha1.Postgres, job *batchv1.Job) (refusal string, err error) {
	if err := controllerutil.SetControllerReference(pg, job, r.Client.Scheme()); err != nil {
		return "", err
	}
	if err := r.Identity.createJob(ctx, r.Client, asUnstructured(pg), job); err != nil {
		var ref *refused
		if !errors.As(err, &ref) {
			return "", err
		}
		return ref.msg, nil
	}
	return "", nil
}

// jobEnd is what became of a Job the schedule follows.
type jobEnd int

const (
	jobRunning jobEnd = iota
	jobGone           // deleted before it finished
	jobFailed
	jobComplete
)

// followJob reads the Job namespace/name the schedule started and says
// whether it ended, and how.
func (r *ScheduleReconciler) followJob(ctx context.Context, namespace, name string) (*batchv1.Job, jobEnd, error) {
	job := &batchv1.Job{}
	if err := getJob(ctx, r.Client, r.Reader, types.NamespacedName{Namespace: namespace, Name: name}, job); err != nil {
		if apierrors.IsNotFound(err) {
			return nil, jobGone, nil
		}
		return nil, jobRunning, err
	}
	switch {
	case jobCondition(job, batchv1.JobFailed):
		return job, jobFailed, nil
	case jobCondition(job, batchv1.JobComplete):
		return job, jobComplete, nil
	}
	return job, jobRunning, nil
}

// followDrill records the end of the running drill.
func (r *ScheduleReconciler) followDrill(ctx context.Context, pg *v1alpha1.Postgres) error {
	st := pg.Status.Backup
	job, end, err := r.followJob(ctx, pg.Namespace, st.VerifyJob)
	switch end {
	case jobGone:
		st.VerifyJob, st.LastVerifyResult = "", "Failed: Job "+st.VerifyJob+" was deleted before it finished"
	case jobFailed:
		msg := podMessage(ctx, r.Reader, job)
		st.LastVerifyResult = fmt.Sprintf("Failed: Job %s could not restore Backup %s: %s (kubectl logs job/%s)", job.Name, job.Labels[v1alpha1.LabelBackup], msg, job.Name)
		r.Recorder.Event(pg, corev1.EventTypeWarning, "BackupVerifyFailed", st.LastVerifyResult)
		verifyFailures.WithLabelValues(pg.Namespace, "Postgres", pg.Name).Inc()
		st.VerifyJob = ""
	case jobComplete:
		var rep struct {
			SHA256 string `json:"sha256"`
			Tables *int   `json:"tables"`
		}
		if err := json.Unmarshal([]byte(podMessage(ctx, r.Reader, job)), &rep); err != nil || rep.SHA256 == "" || rep.Tables == nil {
			st.LastVerifyResult = fmt.Sprintf("Failed: Job %s ended without reporting what it restored", job.Name)
			r.Recorder.Event(pg, corev1.EventTypeWarning, "BackupVerifyFailed", st.LastVerifyResult)
			verifyFailures.WithLabelValues(pg.Namespace, "Postgres", pg.Name).Inc()
		} else {
			st.LastVerifiedBackup = job.Labels[v1alpha1.LabelBackup]
			st.LastVerifyResult = fmt.Sprintf("Succeeded: Backup %s (sha256 %s) restored whole into a throwaway server with %d tables", st.LastVerifiedBackup, rep.SHA256, *rep.Tables)
			r.Recorder.Event(pg, corev1.EventTypeNormal, "BackupVerified", st.LastVerifyResult)
			verifyLastSuccess.WithLabelValues(pg.Namespace, "Postgres", pg.Name).Set(float64(r.Now().Unix()))
		}
		st.VerifyJob = ""
	}
	return err
}
