package backup

import (
	"context"
	"errors"
	"fmt"
	"path"
	"sort"
	"strings"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"

	"github.com/chartpilot/chartpilot/internal/api/v1alpha1"
	"github.com/chartpilot/chartpilot/internal/controller/patch"
	"github.com/chartpilot/chartpilot/internal/jobspec"
	"github.com/chartpilot/chartpilot/internal/watches"
)

// PassthroughKind is a kind backed up as its watches.yaml backup block says.
type PassthroughKind struct {
	GVK    schema.GroupVersionKind
	Backup *watches.Backup
	// SizeValue is the values path of the data volume's size (the watch's
	// storage.sizeValue), read for a restore's claim.
	SizeValue []string
}

// KindsOf are the kinds of ws with a watches.yaml backup block, by kind.
func KindsOf(ws []watches.Watch) map[string]PassthroughKind {
	kinds := map[string]PassthroughKind{}
	for _, w := range ws {
		if w.Backup != nil {
			kinds[w.GVK.Kind] = PassthroughKind{GVK: w.GVK, Backup: w.Backup, SizeValue: w.StorageSizeValue}
		}
	}
	return kinds
}

// scheduled reports whether b was made by its target's schedule.
func scheduled(b *v1alpha1.Backup) bool {
	return b.Labels[v1alpha1.LabelScheduledBy] != "" && b.Labels[v1alpha1.LabelScheduledBy] == b.Spec.Target.Name
}

// StartGrace is how long a Backup waits for its target to be Ready and its
// store to be usable before it fails.
const StartGrace = 10 * time.Minute

// DefaultDeadline bounds a backup Job's run.
const DefaultDeadline = 6 * time.Hour

// BackupReconciler runs each Backup as a Job of the agent (`chartpilot
// backup run -- pg_dump -Fc`) in the Backup's namespace and reports what
// it stored. At most one backup of a target runs at a time; a Backup that
// cannot start (target not Ready, store not Ready, store not offered to
// the namespace) waits up to StartGrace, saying why, then fails. Nothing
// here deletes data from a store.
type BackupReconciler struct {
	Deps
	// Kinds are the passthrough kinds with a watches.yaml backup block.
	Kinds map[string]PassthroughKind
}

// SetupWithManager builds the controller: Backups and the Jobs they own.
func (r *BackupReconciler) SetupWithManager(mgr ctrl.Manager) error {
	withDefaults(&r.Now, &r.Deadline)
	return ctrl.NewControllerManagedBy(mgr).Named("backup").For(&v1alpha1.Backup{}).Owns(&batchv1.Job{}).
		WithOptions(options(r.SkipNameValidation)).Complete(r)
}

// Reconcile moves one Backup on: Pending → Running (its Job created) →
// Completed or Failed.
func (r *BackupReconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	b := &v1alpha1.Backup{}
	if err := r.Client.Get(ctx, req.NamespacedName, b); err != nil {
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	before := b.DeepCopy()
	var res ctrl.Result
	var err error
	switch b.Status.Phase {
	case v1alpha1.BackupCompleted, v1alpha1.BackupFailed:
		return ctrl.Result{}, nil
	case v1alpha1.BackupRunning:
		res, err = r.follow(ctx, b)
	default:
		res, err = r.start(ctx, b)
	}
	if err != nil {
		return ctrl.Result{}, err
	}
	// With the resourceVersion read: a pass on a stale copy (a Pending one
	// whose Running status, Job and location are already written) must
	// not write Pending or Failed over them.
	if _, err := patch.Status(ctx, r.Client, before, b, "status"); err != nil {
		if apierrors.IsConflict(err) {
			return ctrl.Result{Requeue: true}, nil
		}
		return ctrl.Result{}, err
	}
	return res, nil
}

// wait keeps b Pending with why (an event when it changes), or fails it
// once StartGrace has passed since it was created.
func (r *BackupReconciler) wait(b *v1alpha1.Backup, why string) ctrl.Result {
	if r.Now().Sub(b.CreationTimestamp.Time) >= StartGrace {
		r.fail(b, fmt.Sprintf("%s (waited %s)", why, StartGrace))
		return ctrl.Result{}
	}
	if b.Status.Phase != v1alpha1.BackupPending || b.Status.Message != why {
		r.Recorder.Event(b, corev1.EventTypeNormal, "BackupWaiting", why)
	}
	b.Status.Phase, b.Status.Message = v1alpha1.BackupPending, why
	return ctrl.Result{RequeueAfter: 15 * time.Second}
}

func (r *BackupReconciler) fail(b *v1alpha1.Backup, why string) {
	now := metav1.NewTime(r.Now().Truncate(time.Second))
	b.Status.Phase, b.Status.Message, b.Status.CompletedAt = v1alpha1.BackupFailed, why, &now
	r.Recorder.Event(b, corev1.EventTypeWarning, "BackupFailed", why)
	backupFailures.WithLabelValues(b.Namespace, b.Spec.Target.Kind, b.Spec.Target.Name, b.Spec.Store.Name).Inc()
}

// notReady says why a store is not usable now ("" when it is).
func notReady(kind, name string, generation int64, conds []metav1.Condition) string {
	c := apimeta.FindStatusCondition(conds, v1alpha1.ConditionReady)
	switch {
	case c == nil || c.ObservedGeneration != generation:
		return fmt.Sprintf("spec.store: %s %s has not been checked yet", kind, name)
	case c.Status != metav1.ConditionTrue:
		return fmt.Sprintf("spec.store: %s %s is not Ready (%s: %s)", kind, name, c.Reason, c.Message)
	}
	return ""
}

// target is what a Backup backs up, and how.
type target struct {
	obj                           *unstructured.Unstructured
	chartVersion, databaseVersion string
	// job builds the backup Job for a store and location.
	job func(st *resolvedStore, location string) *batchv1.Job
	// locate is where the backup goes in store st (nil: Location), or
	// why it cannot go there.
	locate func(st *resolvedStore) (location, fail string)
}

// serving reports whether pg serves as its release made it: Ready, or held
// only by the wait for its backup before a major upgrade (which waits for
// this very Backup: the release is as it was), released with its
// workloads available.
func serving(pg *v1alpha1.Postgres) bool {
	get := func(t string) *metav1.Condition { return apimeta.FindStatusCondition(pg.Status.Conditions, t) }
	ready := get(v1alpha1.ConditionReady)
	if ready == nil || ready.Status == metav1.ConditionTrue {
		return ready != nil
	}
	released, workloads := get(v1alpha1.ConditionReleased), get(v1alpha1.ConditionWorkloadsAvailable)
	return ready.Reason == conditionBeforeMajor && released != nil && released.Status == metav1.ConditionTrue &&
		(workloads == nil || workloads.Status != metav1.ConditionFalse)
}

// target finds b's target and checks that it is Ready; a reason to wait,
// or one to fail, otherwise.
func (r *BackupReconciler) target(ctx context.Context, b *v1alpha1.Backup) (*target, string, string, error) {
	kind, name := b.Spec.Target.Kind, b.Spec.Target.Name
	if kind == "Postgres" {
		pg := &v1alpha1.Postgres{}
		if err := r.Client.Get(ctx, types.NamespacedName{Namespace: b.Namespace, Name: name}, pg); err != nil {
			if apierrors.IsNotFound(err) {
				return nil, fmt.Sprintf("spec.target: Postgres %s/%s does not exist", b.Namespace, name), "", nil
			}
			return nil, "", "", err
		}
		if !serving(pg) || pg.Status.Endpoints == nil || pg.Status.Endpoints.ReadWrite == "" || pg.Status.Endpoints.Secret == "" {
			return nil, fmt.Sprintf("spec.target: Postgres %s is not Ready", pg.Name), "", nil
		}
		if why := jobspec.ServerUnverified(pg); why != "" {
			return nil, "spec.target: " + why, "", nil
		}
		t := &target{obj: asUnstructured(pg), databaseVersion: pg.Spec.Version, job: func(st *resolvedStore, location string) *batchv1.Job { return r.job(b, pg, st, location) }}
		if pg.Status.Release != nil {
			t.chartVersion = pg.Status.Release.ChartVersion
		}
		if b.MethodOf() == v1alpha1.BackupPhysical {
			if fail := r.physical(b, pg, t); fail != "" {
				return nil, "", fail, nil
			}
		}
		return t, "", "", nil
	}
	if b.MethodOf() != v1alpha1.BackupLogical {
		return nil, "", fmt.Sprintf("spec.method %s: only a Postgres has physical backups; a %s is backed up by its watches.yaml backup block (method logical)", b.Spec.Method, kind), nil
	}
	pk, ok := r.Kinds[kind]
	if !ok {
		known := []string{"Postgres"}
		for k := range r.Kinds {
			known = append(known, k)
		}
		sort.Strings(known)
		return nil, "", fmt.Sprintf("spec.target.kind %q: backups are made of %s (Postgres, and the kinds whose watches.yaml entry has a backup block)", kind, strings.Join(known, ", ")), nil
	}
	u := &unstructured.Unstructured{}
	u.SetGroupVersionKind(pk.GVK)
	if err := r.Client.Get(ctx, types.NamespacedName{Namespace: b.Namespace, Name: name}, u); err != nil {
		if apierrors.IsNotFound(err) {
			return nil, fmt.Sprintf("spec.target: %s %s/%s does not exist", kind, b.Namespace, name), "", nil
		}
		return nil, "", "", err
	}
	if !readyCondition(u) {
		return nil, fmt.Sprintf("spec.target: %s %s is not Ready", kind, name), "", nil
	}
	t := &target{obj: u, job: func(st *resolvedStore, location string) *batchv1.Job {
		return r.passthroughJob(b, u, pk.Backup, st, location)
	}}
	if rel := v1alpha1.ReadReleaseStatus(u).Release; rel != nil {
		t.chartVersion = rel.ChartVersion
	}
	return t, "", "", nil
}

// physical makes t a physical backup of pg: a base backup into pg's WAL
// archive, in the archive's store. The string says why b cannot be one.
func (r *BackupReconciler) physical(b *v1alpha1.Backup, pg *v1alpha1.Postgres, t *target) string {
	sb := pg.Spec.Backup
	if sb == nil || sb.WALArchive == nil {
		return fmt.Sprintf("spec.method physical: Postgres %s has no spec.backup.walArchive, and a base backup is of use only beside the WAL archive a recovery replays from it: set spec.backup.walArchive, or use method logical", pg.Name)
	}
	if storeKind(b.Spec.Store) != storeKind(sb.Store) || b.Spec.Store.Name != sb.Store.Name {
		return fmt.Sprintf("spec.store: a physical backup goes to the store of the WAL archive, %s %s (spec.backup.store of Postgres %s): name that store", storeKind(sb.Store), sb.Store.Name, pg.Name)
	}
	t.locate = func(st *resolvedStore) (string, string) {
		prefix, err := archivePrefix(pg, st)
		if err != nil {
			return "", err.Error()
		}
		return prefix + "/base/" + path.Base(Location(b)), ""
	}
	t.job = func(st *resolvedStore, location string) *batchv1.Job {
		prefix, _ := archivePrefix(pg, st)
		return jobspec.PostgresBaseBackup{Backup: b, Target: pg, Store: st.spec, Prefix: prefix, Name: JobName(b), Location: location,
			Images: jobspec.Images{Agent: r.Image, Postgres: r.PostgresImage}, Deadline: r.Deadline}.Job()
	}
	return ""
}

// storeKind is ref's kind, BackupStore when left out.
func storeKind(ref v1alpha1.StoreRef) string {
	if ref.Kind == "" {
		return "BackupStore"
	}
	return ref.Kind
}

func readyCondition(u *unstructured.Unstructured) bool {
	return apimeta.IsStatusConditionTrue(v1alpha1.ReadReleaseStatus(u).Conditions, v1alpha1.ConditionReady)
}

// start checks that b can run, then creates its Job.
func (r *BackupReconciler) start(ctx context.Context, b *v1alpha1.Backup) (ctrl.Result, error) {
	t, wait, fail, err := r.target(ctx, b)
	switch {
	case err != nil:
		return ctrl.Result{}, err
	case fail != "":
		r.fail(b, fail)
		return ctrl.Result{}, nil
	case wait != "":
		return r.wait(b, wait), nil
	}
	st, why, mayWait := resolveStore(ctx, r.Client, r.Reader, b.Namespace, b.Spec.Store)
	if st == nil {
		if !mayWait {
			r.fail(b, why)
			return ctrl.Result{}, nil
		}
		return r.wait(b, why), nil
	}
	list := &v1alpha1.BackupList{}
	if err := r.Client.List(ctx, list, client.InNamespace(b.Namespace)); err != nil {
		return ctrl.Result{}, err
	}
	for _, o := range list.Items {
		if o.Name != b.Name && o.Spec.Target == b.Spec.Target && o.Status.Phase == v1alpha1.BackupRunning {
			return r.wait(b, fmt.Sprintf("backup %s of the same %s is running; one runs at a time", o.Name, b.Spec.Target.Kind)), nil
		}
	}

	location := Location(b)
	if t.locate != nil {
		var fail string
		if location, fail = t.locate(st); fail != "" {
			r.fail(b, fail)
			return ctrl.Result{}, nil
		}
	}
	job := t.job(st, location)
	if err := controllerutil.SetControllerReference(b, job, r.Client.Scheme()); err != nil {
		return ctrl.Result{}, err
	}
	if err := r.Identity.createJob(ctx, r.Client, t.obj, job); err != nil {
		var ref *refused
		if errors.As(err, &ref) {
			r.fail(b, ref.msg)
			return ctrl.Result{}, nil
		}
		return ctrl.Result{}, err
	}
	now := metav1.NewTime(r.Now().Truncate(time.Second))
	b.Status = v1alpha1.BackupStatus{
		Phase: v1alpha1.BackupRunning, Job: job.Name, Location: location, StartedAt: &now,
		Message:         "Job " + job.Name + " backs " + b.Spec.Target.Kind + " " + b.Spec.Target.Name + " up",
		DatabaseVersion: t.databaseVersion, ChartVersion: t.chartVersion,
	}
	r.Recorder.Event(b, corev1.EventTypeNormal, "BackupStarted", fmt.Sprintf("Job %s backs %s %s up to %s", job.Name, b.Spec.Target.Kind, b.Spec.Target.Name, location))
	return ctrl.Result{}, nil
}

// asUnstructured is pg as the unstructured object identities are found for.
func asUnstructured(pg *v1alpha1.Postgres) *unstructured.Unstructured {
	m, _ := runtime.DefaultUnstructuredConverter.ToUnstructured(pg)
	u := &unstructured.Unstructured{Object: m}
	u.SetGroupVersionKind(v1alpha1.GroupVersion.WithKind("Postgres"))
	return u
}
