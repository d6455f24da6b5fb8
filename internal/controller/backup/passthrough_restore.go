package backup

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/source"

	"github.com/chartpilot/chartpilot/internal/api/v1alpha1"
	"github.com/chartpilot/chartpilot/internal/backup"
	"github.com/chartpilot/chartpilot/internal/hooks"
	"github.com/chartpilot/chartpilot/internal/jobspec"
)

// Restores restores a backup into a new resource of a passthrough kind
// annotated chartpilot.dev/restore-from: BACKUP, before its release is
// installed (the data must be on the volume before the server first
// starts, as with Redis's RDB file). As the resource's identity it makes
// the claim the release's first pod will mount (the StatefulSet adopts a
// claim of its template's name) and a Job that mounts it and runs the
// kind's restore command with the backup, checked against its SHA-256, on
// standard input. The install is held until the Job completes; a failure
// holds it with the reason, and nothing is deleted.
type Restores struct {
	Client client.Client
	// Reader reads the restore Job's pod (its termination message).
	Reader   client.Reader
	Identity *Identity
	// AgentImage is chartpilot's image, copied into the restore image.
	AgentImage string
	// Kinds are the passthrough kinds with a watches.yaml backup block.
	Kinds map[string]PassthroughKind
	// Deadline bounds a Job's run; DefaultDeadline when zero.
	Deadline time.Duration
}

// restoreJobName is the name of the restore Job of the resource u.
func restoreJobName(namespace, name string, uid types.UID) string {
	sum := sha256.Sum256([]byte(namespace + "/" + name + "/" + string(uid)))
	if len(name) > 40 {
		name = strings.TrimRight(name[:40], "-.")
	}
	return "restore-" + name + "-" + hex.EncodeToString(sum[:])[:8]
}

// PreInstall holds u's first install until its restore is done.
func (r *Restores) PreInstall(ctx context.Context, obj hooks.Object) error {
	u := obj.Resource
	if u == nil || u.GetKind() == "Postgres" {
		return nil // Postgres restores through spec.restore, after the install
	}
	from := u.GetAnnotations()[v1alpha1.AnnotationRestoreFrom]
	if from == "" {
		return nil
	}
	if v1alpha1.ReadReleaseStatus(u).Release != nil {
		// A release existed (its records were lost, or it was removed):
		// its volume holds live data, never overwritten by a restore.
		return nil
	}
	field := "annotation " + v1alpha1.AnnotationRestoreFrom
	pk, ok := r.Kinds[u.GetKind()]
	if !ok || pk.Backup.Restore == nil {
		return hooks.Reject("RestoreFailed", "%s: kind %s has no backup.restore block in watches.yaml, so its backups cannot be restored: remove the annotation to install without data", field, u.GetKind())
	}
	rs := pk.Backup.Restore
	if rs.EnabledValue != "" {
		v, _ := valueAt(obj, strings.Split(rs.EnabledValue, "."))
		if on, _ := v.(bool); !on {
			return hooks.Reject("RestoreFailed", "%s: spec.%s must be true: without it the release has no data volume and the restored data would not be used", field, rs.EnabledValue)
		}
	}
	job := &batchv1.Job{}
	err := getJob(ctx, r.Client, r.Reader, types.NamespacedName{Namespace: u.GetNamespace(), Name: restoreJobName(u.GetNamespace(), u.GetName(), u.GetUID())}, job)
	switch {
	case err == nil:
		return r.follow(ctx, u, from, job)
	case !apierrors.IsNotFound(err):
		return err
	}
	return r.start(ctx, obj, pk, from)
}

// start checks the Backup and its store, then makes the claim and the Job.
func (r *Restores) start(ctx context.Context, obj hooks.Object, pk PassthroughKind, from string) error {
	u := obj.Resource
	field := "annotation " + v1alpha1.AnnotationRestoreFrom
	b := &v1alpha1.Backup{}
	if err := r.Client.Get(ctx, types.NamespacedName{Namespace: u.GetNamespace(), Name: from}, b); err != nil {
		if apierrors.IsNotFound(err) {
			return hooks.Reject("RestoreFailed", "%s: Backup %s does not exist in %s: name a completed Backup of a %s", field, from, u.GetNamespace(), u.GetKind())
		}
		return err
	}
	if b.Spec.Target.Kind != u.GetKind() {
		return hooks.Reject("RestoreFailed", "%s: Backup %s is of a %s, not a %s: name a Backup of a %s", field, from, b.Spec.Target.Kind, u.GetKind(), u.GetKind())
	}
	switch b.Status.Phase {
	case v1alpha1.BackupCompleted:
	case v1alpha1.BackupFailed:
		return hooks.Reject("RestoreFailed", "%s: Backup %s failed (%s): name a completed Backup", field, from, b.Status.Message)
	default:
		return hooks.Reject("Restoring", "the restore waits for Backup %s to complete (%s)", from, orPending(b.Status.Phase))
	}
	store, why, mayWait := resolveStore(ctx, r.Client, r.Reader, b.Namespace, b.Spec.Store)
	if store == nil {
		if mayWait && time.Since(u.GetCreationTimestamp().Time) < StartGrace {
			return hooks.Reject("Restoring", "the restore of Backup %s waits for its store: %s", from, why)
		}
		if mayWait {
			why += fmt.Sprintf(" (waited %s; the restore starts once it is ready)", StartGrace)
		}
		return hooks.Reject("RestoreFailed", "Backup %s: %s", from, why)
	}
	rs := pk.Backup.Restore
	sizeText := rs.Size
	if len(pk.SizeValue) > 0 {
		if v, ok := valueAt(obj, pk.SizeValue); ok && v != nil {
			text, isText := v.(string)
			if !isText {
				return hooks.Reject("RestoreFailed", "spec.%s must be a size such as \"1Gi\" (a string), not %v", strings.Join(pk.SizeValue, "."), v)
			}
			sizeText = text
		}
	}
	size, err := resource.ParseQuantity(sizeText)
	if err != nil || size.Sign() <= 0 {
		return hooks.Reject("RestoreFailed", "spec.%s %q is not a size (e.g. 1Gi): the restore's volume needs one", strings.Join(pk.SizeValue, "."), sizeText)
	}
	lbl := map[string]string{v1alpha1.LabelRestoreInto: u.GetName(), "app.kubernetes.io/instance": u.GetName(), "app.kubernetes.io/managed-by": "chartpilot"}
	claim := &corev1.PersistentVolumeClaim{
		ObjectMeta: metav1.ObjectMeta{Namespace: u.GetNamespace(), Name: strings.ReplaceAll(rs.Claim, "{name}", u.GetName()), Labels: lbl},
		Spec: corev1.PersistentVolumeClaimSpec{
			AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			Resources:   corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: size}},
		},
	}
	if rs.StorageClassValue != "" {
		if sc, _ := valueAt(obj, strings.Split(rs.StorageClassValue, ".")); sc != nil && sc != "" {
			name, ok := sc.(string)
			if !ok {
				return hooks.Reject("RestoreFailed", "spec.%s must be a storage class name, not %v", rs.StorageClassValue, sc)
			}
			claim.Spec.StorageClassName = ptr.To(name)
		}
	}
	claim.Annotations = map[string]string{v1alpha1.AnnotationRestoreFor: string(u.GetUID())}
	existing := &corev1.PersistentVolumeClaim{}
	switch err := r.Reader.Get(ctx, client.ObjectKeyFromObject(claim), existing); {
	case err == nil:
		if existing.Annotations[v1alpha1.AnnotationRestoreFor] != string(u.GetUID()) {
			return hooks.Reject("RestoreFailed", "%s: claim %s already exists and was not made for this restore (it may hold another server's data; it is not written to): delete it to restore, or remove the annotation to install on it as it is", field, claim.Name)
		}
	case apierrors.IsNotFound(err):
		if err := r.Identity.create(ctx, r.Client, u, claim, "persistentvolumeclaims"); err != nil {
			return refusal(err)
		}
	default:
		return err
	}
	job := r.job(obj, pk, b, store, claim.Name)
	job.Annotations = map[string]string{v1alpha1.AnnotationRestoreBackup: b.Name, v1alpha1.AnnotationRestoreSHA256: b.Status.SHA256}
	job.OwnerReferences = []metav1.OwnerReference{{APIVersion: u.GetAPIVersion(), Kind: u.GetKind(), Name: u.GetName(), UID: u.GetUID()}}
	if err := r.Identity.createJob(ctx, r.Client, u, job); err != nil {
		return refusal(err)
	}
	return hooks.Reject("Restoring", "Job %s restores Backup %s (%s) into claim %s; the release is installed once it completes", job.Name, from, b.Status.Location, claim.Name)
}

// valueAt reads a value of the release at path: from the composed values
// when the reconciler gives them (tenant layers and overrides included),
// else from the resource's spec (a passthrough kind's spec is its values).
func valueAt(obj hooks.Object, path []string) (any, bool) {
	if obj.Values != nil {
		v, ok, _ := unstructured.NestedFieldNoCopy(obj.Values, path...)
		return v, ok
	}
	v, ok, _ := unstructured.NestedFieldNoCopy(obj.Resource.Object, append([]string{"spec"}, path...)...)
	return v, ok
}

// refusal turns an identity's refusal into a held install naming the fix.
func refusal(err error) error {
	var ref *refused
	if errors.As(err, &ref) {
		return hooks.Reject("RestoreFailed", "%s", ref.msg)
	}
	return err
}

// job is the restore Job (jobspec.PassthroughRestore).
func (r *Restores) job(obj hooks.Object, pk PassthroughKind, b *v1alpha1.Backup, store *resolvedStore, claim string) *batchv1.Job {
	deadline := r.Deadline
	if deadline == 0 {
		deadline = DefaultDeadline
	}
	u := obj.Resource
	return jobspec.PassthroughRestore{Target: u, Block: pk.Backup, Backup: b, Store: store.spec, Name: restoreJobName(u.GetNamespace(), u.GetName(), u.GetUID()),
		Claim: claim, AgentImage: r.AgentImage, Deadline: deadline, Values: func(p []string) (any, bool) { return valueAt(obj, p) }}.Job()
}

// follow reads the restore Job: complete with the manifest of the Backup
// it named, the install goes on.
func (r *Restores) follow(ctx context.Context, u *unstructured.Unstructured, from string, job *batchv1.Job) error {
	if len(job.OwnerReferences) != 1 || job.OwnerReferences[0].UID != u.GetUID() || job.Labels[v1alpha1.LabelRestoreInto] != u.GetName() {
		return hooks.Reject("RestoreFailed", "Job %s exists and is not this %s's restore: delete it", job.Name, u.GetKind())
	}
	if was := job.Annotations[v1alpha1.AnnotationRestoreBackup]; was != from {
		return hooks.Reject("RestoreFailed", "annotation %s names Backup %s, but Job %s restores Backup %s: set it back, or delete the Job and claim to restore the other", v1alpha1.AnnotationRestoreFrom, from, job.Name, was)
	}
	switch {
	case jobCondition(job, batchv1.JobFailed):
		return hooks.Reject("RestoreFailed", "%s (kubectl logs job/%s); the install is held and the claim kept: delete Job %s to try again, or remove the annotation %s to install with what the claim holds", jobFailure(ctx, r.Reader, job), job.Name, job.Name, v1alpha1.AnnotationRestoreFrom)
	case jobCondition(job, batchv1.JobComplete):
		m := &backup.Manifest{}
		want := job.Annotations[v1alpha1.AnnotationRestoreSHA256]
		if err := json.Unmarshal([]byte(podMessage(ctx, r.Reader, job)), m); err != nil || m.SHA256 == "" || m.SHA256 != want {
			return hooks.Reject("RestoreFailed", "Job %s ended without reporting the backup it restored (sha256 %s expected): delete Job %s to try again", job.Name, want, job.Name)
		}
		return nil
	}
	return hooks.Reject("Restoring", "Job %s restores Backup %s; the release is installed once it completes", job.Name, from)
}

// report is the Restored condition of a passthrough resource restored
// before its install.
func (r *Restores) report(ctx context.Context, u *unstructured.Unstructured) *metav1.Condition {
	from := u.GetAnnotations()[v1alpha1.AnnotationRestoreFrom]
	if from == "" {
		return nil
	}
	job := &batchv1.Job{}
	if err := r.Client.Get(ctx, types.NamespacedName{Namespace: u.GetNamespace(), Name: restoreJobName(u.GetNamespace(), u.GetName(), u.GetUID())}, job); err != nil {
		if v1alpha1.ReadReleaseStatus(u).Release != nil {
			return nil // installed before the annotation, or the Job was deleted since
		}
		return &metav1.Condition{Status: metav1.ConditionFalse, Reason: "RestorePending", Message: "Backup " + from + " is restored before the release is installed; the Reconciling condition says what it waits for"}
	}
	switch {
	case jobCondition(job, batchv1.JobComplete):
		return &metav1.Condition{Status: metav1.ConditionTrue, Reason: "RestoreCompleted", Message: "Job " + job.Name + " restored Backup " + from + " before the release was installed"}
	case jobCondition(job, batchv1.JobFailed):
		return &metav1.Condition{Status: metav1.ConditionFalse, Reason: "RestoreFailed", Message: "Job " + job.Name + " failed; delete it to try again"}
	}
	return &metav1.Condition{Status: metav1.ConditionFalse, Reason: "Restoring", Message: "Job " + job.Name + " restores Backup " + from}
}

// Watch wakes a resource when its restore Job changes (it ends).
func (r *Restores) Watch(mgr manager.Manager, c controller.Controller, _ hooks.EnqueueFunc) error {
	return c.Watch(source.Kind(mgr.GetCache(), &batchv1.Job{}, handler.TypedEnqueueRequestsFromMapFunc(func(_ context.Context, j *batchv1.Job) []reconcile.Request {
		name := j.Labels[v1alpha1.LabelRestoreInto]
		if name == "" {
			return nil
		}
		return []reconcile.Request{{NamespacedName: types.NamespacedName{Namespace: j.Namespace, Name: name}}}
	})))
}

// watchers is several hooks.Watchers as one.
type watchers []hooks.Watcher

func (ws watchers) Watch(mgr manager.Manager, c controller.Controller, enqueue hooks.EnqueueFunc) error {
	for _, w := range ws {
		if err := w.Watch(mgr, c, enqueue); err != nil {
			return err
		}
	}
	return nil
}
