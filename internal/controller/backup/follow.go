package backup

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/chartpilot/chartpilot/internal/api/v1alpha1"
	"github.com/chartpilot/chartpilot/internal/backup"
	"github.com/chartpilot/chartpilot/internal/redact"
)

// follow reads b's Job: when it succeeded, what it stored is read back
// from the store (S3) or from its pod's termination message (volume), and
// only a manifest found there completes the Backup.
func (r *BackupReconciler) follow(ctx context.Context, b *v1alpha1.Backup) (ctrl.Result, error) {
	job := &batchv1.Job{}
	if err := getJob(ctx, r.Client, r.Reader, types.NamespacedName{Namespace: b.Namespace, Name: b.Status.Job}, job); err != nil {
		if apierrors.IsNotFound(err) {
			r.fail(b, fmt.Sprintf("Job %s was deleted before it finished; create a new Backup", b.Status.Job))
			return ctrl.Result{}, nil
		}
		return ctrl.Result{}, err
	}
	switch {
	case jobCondition(job, batchv1.JobFailed):
		r.fail(b, jobFailure(ctx, r.Reader, job)+" (kubectl logs job/"+job.Name+")")
		return ctrl.Result{}, nil
	case jobCondition(job, batchv1.JobComplete):
		m, why, checked := r.manifest(ctx, b, job)
		if !checked {
			// The store was not looked at (no helper slot free, or the
			// helper gave no answer): the backup is neither good nor bad
			// yet. Looked at again, never failed for it.
			msg := fmt.Sprintf("Job %s succeeded; its backup is checked in the store next: %s", job.Name, why)
			if b.Status.Message != msg {
				b.Status.Message = msg
			}
			return ctrl.Result{RequeueAfter: r.uncheckedAfter(b)}, nil
		}
		if m == nil {
			r.fail(b, why)
			return ctrl.Result{}, nil
		}
		now := metav1.NewTime(r.Now().Truncate(time.Second))
		b.Status.Phase, b.Status.CompletedAt = v1alpha1.BackupCompleted, &now
		b.Status.Size, b.Status.SHA256 = m.Size, m.SHA256
		b.Status.Message = fmt.Sprintf("%d bytes stored (%d before compression%s), sha256 %s", m.Size, m.PlainSize, encrypted(m), m.SHA256)
		r.Recorder.Event(b, corev1.EventTypeNormal, "BackupCompleted", fmt.Sprintf("stored %d bytes at %s", m.Size, b.Status.Location))
		lbl := []string{b.Namespace, b.Spec.Target.Kind, b.Spec.Target.Name, b.Spec.Store.Name}
		if b.MethodOf() == v1alpha1.BackupPhysical {
			// Apart: a daily base backup must not hide stale logical ones.
			baseBackupLastSuccess.WithLabelValues(lbl...).Set(float64(now.Unix()))
			return ctrl.Result{}, nil
		}
		backupLastSuccess.WithLabelValues(lbl...).Set(float64(now.Unix()))
		backupSize.WithLabelValues(lbl...).Set(float64(m.Size))
		if b.Status.StartedAt != nil {
			backupDuration.WithLabelValues(lbl...).Set(now.Sub(b.Status.StartedAt.Time).Seconds())
		}
		return ctrl.Result{}, nil
	}
	return ctrl.Result{}, nil // the Job's next change wakes the Backup
}

// getJob reads a Job this hook created: from the cache, and when the
// cache has not seen it yet (created a moment ago, its watch event still
// on the way), from the API server, so that a Job just created is never
// taken for one deleted.
func getJob(ctx context.Context, cached client.Reader, live client.Reader, key types.NamespacedName, job *batchv1.Job) error {
	err := cached.Get(ctx, key, job)
	if apierrors.IsNotFound(err) && live != nil {
		err = live.Get(ctx, key, job)
	}
	return err
}

func encrypted(m *backup.Manifest) string {
	if m.Encryption != "" {
		return ", encrypted with " + m.Encryption
	}
	return ""
}

func jobConditionOf(job *batchv1.Job, t batchv1.JobConditionType) *batchv1.JobCondition {
	for i := range job.Status.Conditions {
		if c := &job.Status.Conditions[i]; c.Type == t && c.Status == corev1.ConditionTrue {
			return c
		}
	}
	return nil
}

// jobFailure says why a failed Job failed: its pod's termination
// message, or the Job's Failed condition (a deadline, a pod never run).
func jobFailure(ctx context.Context, reader client.Reader, job *batchv1.Job) string {
	why := fmt.Sprintf("Job %s failed", job.Name)
	if msg := podMessage(ctx, reader, job); msg != "" {
		return why + ": " + msg
	}
	if c := jobConditionOf(job, batchv1.JobFailed); c != nil && c.Message != "" {
		return why + ": " + c.Message
	}
	return why
}

func jobCondition(job *batchv1.Job, t batchv1.JobConditionType) bool {
	return jobConditionOf(job, t) != nil
}

// manifest is what b's succeeded Job stored, read from the store itself
// for S3, GCS and Azure (the Job's own word is not enough), from the pod's
// termination message for a volume (which the operator cannot mount).
// checked is false when the store could not be looked at (no helper slot
// free, or the helper gave no answer): why says so, and nothing is known.
func (r *BackupReconciler) manifest(ctx context.Context, b *v1alpha1.Backup, job *batchv1.Job) (m *backup.Manifest, why string, checked bool) {
	st, why, _ := resolveStore(ctx, r.Client, r.Reader, b.Namespace, b.Spec.Store)
	if st == nil {
		return nil, fmt.Sprintf("Job %s succeeded, but its backup cannot be checked: %s", job.Name, why), true
	}
	if st.spec.Volume == nil {
		req, msg := storeRequest(ctx, r.Reader, st.spec, st.secretNS, st.cluster, r.Endpoints)
		if msg != "" {
			return nil, fmt.Sprintf("Job %s succeeded, but its backup cannot be checked: %s", job.Name, msg), true
		}
		req.Op, req.Location = "manifest", b.Status.Location
		reply, err := r.Stores.Do(ctx, helperNamespace(st.cluster, b.Namespace), req)
		switch {
		case errors.Is(err, backup.ErrBusy):
			return nil, "the store helper is busy with other checks of this namespace", false
		case err != nil:
			return nil, err.Error(), false
		case reply.Invalid != "":
			return nil, fmt.Sprintf("Job %s succeeded, but its backup cannot be checked: %s", job.Name, reply.Invalid), true
		case reply.Failed != "" || reply.Manifest == nil:
			return nil, fmt.Sprintf("Job %s succeeded, but the store has no complete backup at %s: %s", job.Name, b.Status.Location, reply.Failed), true
		}
		return reply.Manifest, "", true
	}
	msg := podMessage(ctx, r.Reader, job)
	m = &backup.Manifest{}
	if err := json.Unmarshal([]byte(msg), m); err != nil || m.Validate() != nil {
		return nil, fmt.Sprintf("Job %s succeeded, but its pod reported no backup manifest", job.Name), true
	}
	return m, "", true
}

// uncheckedAfter is when a Backup whose store could not be looked at is
// looked at again: 3 s at first, doubling with the time since its Job
// ended, at most 5 minutes.
func (r *BackupReconciler) uncheckedAfter(b *v1alpha1.Backup) time.Duration {
	wait := 3 * time.Second
	if b.Status.StartedAt != nil {
		if since := r.Now().Sub(b.Status.StartedAt.Time) / 4; since > wait {
			wait = since
		}
	}
	return min(wait, 5*time.Minute) + time.Duration(rand.Int64N(int64(time.Second)))
}

// podMessage is the termination message of the container of the newest
// pod job controls (by owner reference, not only by its label),
// cut to one line of at most 512 bytes.
func podMessage(ctx context.Context, reader client.Reader, job *batchv1.Job) string {
	pods := &corev1.PodList{}
	if err := reader.List(ctx, pods, client.InNamespace(job.Namespace), client.MatchingLabels{"batch.kubernetes.io/job-name": job.Name}); err != nil {
		return ""
	}
	var newest *corev1.Pod
	for i := range pods.Items {
		p := &pods.Items[i]
		// Anyone who can create pods in the namespace can give one the
		// Job's name label: only a pod the Job itself controls speaks
		// for it.
		if owner := metav1.GetControllerOf(p); owner == nil || owner.UID != job.UID || owner.Kind != "Job" {
			continue
		}
		if newest == nil || newest.CreationTimestamp.Before(&p.CreationTimestamp) {
			newest = p
		}
	}
	if newest == nil {
		return ""
	}
	for _, cs := range newest.Status.ContainerStatuses {
		if t := cs.State.Terminated; t != nil && t.Message != "" {
			msg := strings.TrimSpace(t.Message)
			if i := strings.LastIndexByte(msg, '\n'); i >= 0 && !strings.HasPrefix(msg, "{") {
				msg = msg[i+1:] // the last line of the logs: the agent's error
			}
			if len(msg) > 512 {
				msg = msg[:512]
			}
			return redact.Text(msg)
		}
	}
	return ""
}
