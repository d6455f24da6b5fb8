package backup

import (
	"crypto/sha256"
	"encoding/hex"
	"path"
	"strings"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/chartpilot/chartpilot/internal/api/v1alpha1"
	"github.com/chartpilot/chartpilot/internal/jobspec"
	"github.com/chartpilot/chartpilot/internal/watches"
)

// Where a Job finds what chartpilot gives it (see internal/jobspec).
const (
	AgentDir    = jobspec.AgentDir
	StageDir    = jobspec.StageDir
	ServerCADir = jobspec.ServerCADir
)

// secretKey is jobspec.SecretKey.
func secretKey(name, key string) *corev1.EnvVarSource { return jobspec.SecretKey(name, key) }

// passthroughJob is b's Job for a kind with a watches.yaml backup block
// (jobspec.PassthroughBackup).
func (r *BackupReconciler) passthroughJob(b *v1alpha1.Backup, target *unstructured.Unstructured, block *watches.Backup, st *resolvedStore, location string) *batchv1.Job {
	return jobspec.PassthroughBackup{Backup: b, Target: target, Block: block, Store: st.spec, Name: JobName(b), Location: location, AgentImage: r.Image, Deadline: r.Deadline}.Job()
}

// Location is where b's backup goes in its store: one series per target
// (retention works on it), one key prefix per Backup that no other Backup
// can have (a backup is never written over another).
// Scheduled backups have a series of their own (scheduled/ below), which
// retention prunes without touching on-demand ones.
func Location(b *v1alpha1.Backup) string {
	series := path.Join(b.Namespace, strings.ToLower(b.Spec.Target.Kind), b.Spec.Target.Name)
	if scheduled(b) {
		series = path.Join(series, "scheduled")
	}
	return path.Join(series, b.CreationTimestamp.UTC().Format("20060102T150405Z")+"-"+b.Name+"-"+string(b.UID)[:8])
}

// JobName is the name of b's Job: b's name cut to fit, with a hash of it.
func JobName(b *v1alpha1.Backup) string {
	sum := sha256.Sum256([]byte(b.Namespace + "/" + b.Name + "/" + string(b.UID)))
	name := b.Name
	if len(name) > 40 {
		name = strings.TrimRight(name[:40], "-.")
	}
	return "backup-" + name + "-" + hex.EncodeToString(sum[:])[:8]
}

// job is b's Job (jobspec.PostgresBackup).
func (r *BackupReconciler) job(b *v1alpha1.Backup, pg *v1alpha1.Postgres, st *resolvedStore, location string) *batchv1.Job {
	return jobspec.PostgresBackup{Backup: b, Target: pg, Store: st.spec, Name: JobName(b), Location: location, Scheduled: scheduled(b),
		Images: jobspec.Images{Agent: r.Image, Postgres: r.PostgresImage}, Deadline: r.Deadline}.Job()
}
