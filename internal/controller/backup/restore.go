package backup

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"

	"github.com/chartpilot/chartpilot/internal/api/v1alpha1"
	"github.com/chartpilot/chartpilot/internal/backup"
	"github.com/chartpilot/chartpilot/internal/controller/patch"
	"github.com/chartpilot/chartpilot/internal/hooks"
	"github.com/chartpilot/chartpilot/internal/jobspec"
)

// HookName is the name of the backup hook in watches.yaml.
const HookName = "backup"

// conditionBeforeMajor is the hook's condition, and the reason of its
// hold while the backup before a major upgrade runs.
const conditionBeforeMajor = "BackupBeforeMajorUpgrade"

// Hook is the backup hook: while a Postgres's spec.restore has not
// completed, its Restored condition is False, which keeps it not Ready
// (the release is installed meanwhile; RestoreReconciler fills it). And a
// PostgreSQL major upgrade of a Postgres with spec.backup waits for a
// fresh backup (see beforeMajor); c makes that Backup.
//
// With m, the major upgrade is then carried out (see Major): its values
// name the data's claim template, and the upgrade waits for the data to
// be on a new volume of the new major. Without m only the image changes.
//
// With pr, a new resource of a passthrough kind annotated
// chartpilot.dev/restore-from is restored before its first install (see
// Restores).
//
// With a, a Postgres with spec.backup.walArchive archives its WAL to its
// backup store (see Archive).
func Hook(c client.Client, m *Major, pr *Restores, a *Archive) *hooks.Hook {
	h := &hooks.Hook{
		Name:          HookName,
		ConditionType: conditionBeforeMajor,
		PreUpgrade: hooks.PreUpgradeFunc(func(ctx context.Context, obj hooks.Object, _, _ string) error {
			if err := beforeMajor(ctx, c, obj); err != nil || m == nil {
				return err
			}
			return m.carryOut(ctx, obj)
		}),
		ReportType: v1alpha1.ConditionRestored,
		Report: func(ctx context.Context, obj hooks.Object) *metav1.Condition {
			if obj.Resource == nil {
				return nil
			}
			if obj.Resource.GetKind() != "Postgres" {
				if pr == nil {
					return nil
				}
				return pr.report(ctx, obj.Resource)
			}
			spec, _ := obj.Resource.Object["spec"].(map[string]any)
			if _, ok := spec["restore"]; !ok {
				return nil
			}
			status, _ := obj.Resource.Object["status"].(map[string]any)
			rs, _ := status["restore"].(map[string]any)
			phase, _ := rs["phase"].(string)
			msg, _ := rs["message"].(string)
			switch phase {
			case v1alpha1.BackupCompleted:
				return &metav1.Condition{Status: metav1.ConditionTrue, Reason: "RestoreCompleted", Message: msg}
			case v1alpha1.BackupFailed:
				return &metav1.Condition{Status: metav1.ConditionFalse, Reason: "RestoreFailed", Message: msg + "; the database is left as the restore left it: delete the resource and its volumes, or remove spec.restore to use it as it is"}
			case "":
				msg = "the restore starts once the release is installed"
			}
			return &metav1.Condition{Status: metav1.ConditionFalse, Reason: "Restoring", Message: msg}
		},
	}
	var ws watchers
	var layers []hooks.ValuesFunc
	if m != nil {
		layers = append(layers, m.values)
		ws = append(ws, m)
	}
	if a != nil {
		layers = append(layers, a.values, a.recoveryValues)
		ws = append(ws, a)
	}
	if len(layers) > 0 {
		h.Values = mergeLayers(layers...)
	}
	if pr != nil {
		h.PreInstall = pr
		ws = append(ws, pr)
	}
	if len(ws) > 0 {
		h.Watcher = ws
	}
	return h
}

// RestoreReconciler carries out spec.restore of each Postgres, once: when
// its release is installed, a Job of the agent checks the backup's
// SHA-256 and restores it (roles, then every database); status.restore follows it, and
// the resource is asked for a pass when it ends (so Ready follows).
type RestoreReconciler struct {
	Deps
}

// SetupWithManager builds the controller: Postgres and the Jobs it owns.
func (r *RestoreReconciler) SetupWithManager(mgr ctrl.Manager) error {
	withDefaults(&r.Now, &r.Deadline)
	return ctrl.NewControllerManagedBy(mgr).Named("restore").For(&v1alpha1.Postgres{}).Owns(&batchv1.Job{}).
		WithOptions(options(r.SkipNameValidation)).Complete(r)
}

// RestoreJobName is the name of pg's restore Job.
func RestoreJobName(pg *v1alpha1.Postgres) string {
	return restoreJobName(pg.Namespace, pg.Name, pg.UID)
}

// Reconcile moves one restore on.
func (r *RestoreReconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	pg := &v1alpha1.Postgres{}
	if err := r.Client.Get(ctx, req.NamespacedName, pg); err != nil {
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	if pg.Spec.Restore == nil {
		return ctrl.Result{}, nil
	}
	st := pg.Status.Restore
	if st != nil && (st.Phase == v1alpha1.BackupCompleted || st.Phase == v1alpha1.BackupFailed) {
		return ctrl.Result{}, nil // once
	}
	before := pg.DeepCopy()
	if pg.Status.Restore == nil {
		pg.Status.Restore = &v1alpha1.PostgresRestoreStatus{Phase: v1alpha1.BackupPending}
	}
	res, err := r.step(ctx, pg)
	if err != nil {
		return ctrl.Result{}, err
	}
	if changed, err := patch.Status(ctx, r.Client, before, pg, "status.restore"); err != nil || !changed {
		return res, err
	}
	if p := pg.Status.Restore.Phase; p == v1alpha1.BackupCompleted || p == v1alpha1.BackupFailed || before.Status.Restore == nil {
		// The release reconciler does not run on status changes: ask it
		// for a pass, so that Restored (and Ready) follow.
		patch := fmt.Sprintf(`{"metadata":{"annotations":{%q:%q}}}`, v1alpha1.AnnotationReconcileRequestedAt, "restore-"+p+"-"+r.Now().UTC().Format(time.RFC3339))
		if err := r.Client.Patch(ctx, pg, client.RawPatch(types.MergePatchType, []byte(patch))); err != nil {
			return ctrl.Result{}, err
		}
	}
	return res, nil
}

func (r *RestoreReconciler) set(pg *v1alpha1.Postgres, phase, msg string) {
	st := pg.Status.Restore
	if st.Phase != phase || st.Message != msg {
		kind := corev1.EventTypeNormal
		if phase == v1alpha1.BackupFailed {
			kind = corev1.EventTypeWarning
		}
		r.Recorder.Event(pg, kind, "Restore"+phase, msg)
	}
	st.Phase, st.Message = phase, msg
	if phase == v1alpha1.BackupCompleted || phase == v1alpha1.BackupFailed {
		now := metav1.NewTime(r.Now().Truncate(time.Second))
		st.CompletedAt = &now
	}
}

// step starts the restore Job once the release is installed, or follows it.
func (r *RestoreReconciler) step(ctx context.Context, pg *v1alpha1.Postgres) (ctrl.Result, error) {
	st := pg.Status.Restore
	if st.Job != "" {
		return r.follow(ctx, pg)
	}
	released := apimeta.FindStatusCondition(pg.Status.Conditions, v1alpha1.ConditionReleased)
	if released == nil || released.Status != metav1.ConditionTrue || pg.Status.Endpoints == nil || pg.Status.Endpoints.ReadWrite == "" || pg.Status.Endpoints.Secret == "" {
		r.set(pg, v1alpha1.BackupPending, "the restore starts once the release is installed")
		return ctrl.Result{}, nil // the release's status change wakes this
	}
	if why := jobspec.ServerUnverified(pg); why != "" {
		r.set(pg, v1alpha1.BackupPending, why)
		return ctrl.Result{}, nil // the status's next write wakes this
	}
	// The source: a completed Backup, or a location in a store.
	rs := pg.Spec.Restore
	storeRef, location, sum, size := v1alpha1.StoreRef{}, "", "", int64(0)
	if rs.FromBackup != "" {
		b := &v1alpha1.Backup{}
		if err := r.Client.Get(ctx, types.NamespacedName{Namespace: pg.Namespace, Name: rs.FromBackup}, b); err != nil {
			if apierrors.IsNotFound(err) {
				r.set(pg, v1alpha1.BackupFailed, fmt.Sprintf("spec.restore.fromBackup: Backup %s does not exist in %s: name a completed Backup, or use fromStore", rs.FromBackup, pg.Namespace))
				return ctrl.Result{}, nil
			}
			return ctrl.Result{}, err
		}
		if b.Status.Phase != v1alpha1.BackupCompleted {
			r.set(pg, v1alpha1.BackupFailed, fmt.Sprintf("spec.restore.fromBackup: Backup %s is %q, not Completed: name a completed Backup", b.Name, b.Status.Phase))
			return ctrl.Result{}, nil
		}
		if b.MethodOf() != v1alpha1.BackupLogical {
			r.set(pg, v1alpha1.BackupFailed, fmt.Sprintf("spec.restore.fromBackup: Backup %s is a physical base backup, which a recovery from the WAL archive starts from, not spec.restore: name a logical Backup", b.Name))
			return ctrl.Result{}, nil
		}
		storeRef, location, sum, size = b.Spec.Store, b.Status.Location, b.Status.SHA256, b.Status.Size
	} else {
		storeRef, location = rs.FromStore.Store, rs.FromStore.Location
	}
	store, why, mayWait := resolveStore(ctx, r.Client, r.Reader, pg.Namespace, storeRef)
	if store == nil {
		if mayWait {
			r.set(pg, v1alpha1.BackupPending, why)
			return ctrl.Result{RequeueAfter: 15 * time.Second}, nil
		}
		r.set(pg, v1alpha1.BackupFailed, why)
		return ctrl.Result{}, nil
	}
	job := r.job(pg, store, location, sum, size)
	if err := controllerutil.SetControllerReference(pg, job, r.Client.Scheme()); err != nil {
		return ctrl.Result{}, err
	}
	if err := r.Identity.createJob(ctx, r.Client, asUnstructured(pg), job); err != nil {
		var ref *refused
		if errors.As(err, &ref) {
			r.set(pg, v1alpha1.BackupFailed, ref.msg)
			return ctrl.Result{}, nil
		}
		return ctrl.Result{}, err
	}
	st.Job, st.Location, st.SHA256 = job.Name, location, sum
	r.set(pg, v1alpha1.BackupRunning, fmt.Sprintf("Job %s restores %s", job.Name, location))
	return ctrl.Result{}, nil
}

// job is pg's restore Job (jobspec.PostgresRestore), decrypting with
// spec.restore's key, else spec.backup's.
func (r *RestoreReconciler) job(pg *v1alpha1.Postgres, store *resolvedStore, location, sum string, size int64) *batchv1.Job {
	key := pg.Spec.Restore.Encryption
	if key == nil && pg.Spec.Backup != nil {
		key = pg.Spec.Backup.Encryption
	}
	return jobspec.PostgresRestore{Target: pg, Store: store.spec, Name: RestoreJobName(pg), Location: location, SHA256: sum, Size: size, Key: key,
		Images: jobspec.Images{Agent: r.Image, Postgres: r.PostgresImage}, Deadline: r.Deadline}.Job()
}

// follow reads the restore Job's end.
func (r *RestoreReconciler) follow(ctx context.Context, pg *v1alpha1.Postgres) (ctrl.Result, error) {
	st := pg.Status.Restore
	job := &batchv1.Job{}
	if err := getJob(ctx, r.Client, r.Reader, types.NamespacedName{Namespace: pg.Namespace, Name: st.Job}, job); err != nil {
		if apierrors.IsNotFound(err) {
			r.set(pg, v1alpha1.BackupFailed, fmt.Sprintf("Job %s was deleted before it finished", st.Job))
			return ctrl.Result{}, nil
		}
		return ctrl.Result{}, err
	}
	switch {
	case jobCondition(job, batchv1.JobFailed):
		r.set(pg, v1alpha1.BackupFailed, jobFailure(ctx, r.Reader, job)+" (kubectl logs job/"+job.Name+")")
	case jobCondition(job, batchv1.JobComplete):
		// The agent prints the manifest it checked the data against; a
		// pod that reports none did not restore.
		m := &backup.Manifest{}
		msg := podMessage(ctx, r.Reader, job)
		if err := json.Unmarshal([]byte(msg), m); err != nil || m.SHA256 == "" || (st.SHA256 != "" && m.SHA256 != st.SHA256) {
			r.set(pg, v1alpha1.BackupFailed, fmt.Sprintf("Job %s ended without reporting the backup it restored (sha256 %s expected)", job.Name, st.SHA256))
			return ctrl.Result{}, nil
		}
		st.SHA256 = m.SHA256
		r.set(pg, v1alpha1.BackupCompleted, fmt.Sprintf("restored %s (%d bytes, sha256 %s checked before pg_restore)", st.Location, m.Size, m.SHA256))
	}
	return ctrl.Result{}, nil
}

// beforeMajor holds the upgrade of a Postgres with spec.backup whose
// PostgreSQL major changes until a Backup taken for that change,
// <name>-before-major-<to>, has completed: it makes the Backup, and says
// what the upgrade waits for, or which Backup failed (deleting it makes a
// new one). Without spec.backup nothing is held: there is no store.
func beforeMajor(ctx context.Context, c client.Client, obj hooks.Object) error {
	u := obj.Resource
	if u == nil || u.GetKind() != "Postgres" {
		return nil
	}
	want, _, _ := unstructured.NestedString(u.Object, "spec", "version")
	have, _, _ := unstructured.NestedString(u.Object, "status", "version")
	wantMajor, haveMajor := majorOf(want), majorOf(have)
	store, found, _ := unstructured.NestedMap(u.Object, "spec", "backup", "store")
	if wantMajor == "" || haveMajor == "" || wantMajor == haveMajor || !found {
		return nil
	}
	name := u.GetName() + "-before-major-" + wantMajor
	b := &v1alpha1.Backup{}
	err := c.Get(ctx, types.NamespacedName{Namespace: u.GetNamespace(), Name: name}, b)
	switch {
	case apierrors.IsNotFound(err):
		kind, _ := store["kind"].(string)
		if kind == "" {
			kind = "BackupStore"
		}
		storeName, _ := store["name"].(string)
		b = &v1alpha1.Backup{
			ObjectMeta: metav1.ObjectMeta{Namespace: u.GetNamespace(), Name: name, Labels: map[string]string{v1alpha1.LabelBeforeMajor: wantMajor}},
			Spec:       v1alpha1.BackupSpec{Target: v1alpha1.BackupTarget{Kind: "Postgres", Name: u.GetName()}, Store: v1alpha1.StoreRef{Kind: kind, Name: storeName}},
		}
		b.OwnerReferences = []metav1.OwnerReference{{APIVersion: v1alpha1.GroupVersion.String(), Kind: "Postgres", Name: u.GetName(), UID: u.GetUID()}}
		if err := c.Create(ctx, b); err != nil && !apierrors.IsAlreadyExists(err) {
			return fmt.Errorf("making Backup %s before the PostgreSQL %s → %s upgrade: %w", name, haveMajor, wantMajor, err)
		}
		return hooks.Reject(conditionBeforeMajor, "the PostgreSQL %s → %s upgrade waits for Backup %s, started now", haveMajor, wantMajor, name)
	case err != nil:
		return err
	}
	switch b.Status.Phase {
	case v1alpha1.BackupCompleted:
		return nil
	case v1alpha1.BackupFailed:
		return hooks.Reject("BackupFailed", "the PostgreSQL %s → %s upgrade is held: Backup %s failed (%s); fix the cause and delete that Backup to take a new one", haveMajor, wantMajor, name, b.Status.Message)
	}
	return hooks.Reject(conditionBeforeMajor, "the PostgreSQL %s → %s upgrade waits for Backup %s (%s)", haveMajor, wantMajor, name, orPending(b.Status.Phase))
}

func majorOf(v string) string {
	major, _, _ := strings.Cut(strings.TrimSpace(v), ".")
	return major
}

func orPending(phase string) string {
	if phase == "" {
		return v1alpha1.BackupPending
	}
	return phase
}
