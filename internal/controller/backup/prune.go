package backup

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/chartpilot/chartpilot/internal/api/v1alpha1"
	"github.com/chartpilot/chartpilot/internal/jobspec"
)

// pruneEvery is how often a WAL archive is pruned to its recovery window.
const pruneEvery = 24 * time.Hour

// prune runs the pruning of pg's WAL archive to
// spec.backup.walArchive.recoveryWindow: a Job of the agent's wal-prune
// once a day, whose report gives status.backup.archive. It returns when
// to look again (zero: no pruning asked for).
func (r *ScheduleReconciler) prune(ctx context.Context, pg *v1alpha1.Postgres, now time.Time) (time.Time, error) {
	sb, st := pg.Spec.Backup, pg.Status.Backup
	if sb.WALArchive == nil || sb.WALArchive.RecoveryWindow == "" || sb.Suspend {
		return time.Time{}, nil
	}
	if st.PruneJob != "" {
		return now.Add(time.Minute), r.followPrune(ctx, pg)
	}
	if st.LastPruneTime != nil && now.Sub(st.LastPruneTime.Time) < pruneEvery {
		return st.LastPruneTime.Add(pruneEvery), nil
	}
	store, why, _ := resolveStore(ctx, r.Client, r.Reader, pg.Namespace, sb.Store)
	if store == nil {
		st.LastPruneResult = "Waiting: " + strings.Replace(why, "spec.store", "spec.backup.store", 1)
		return now.Add(time.Minute), nil
	}
	prefix, err := archivePrefix(pg, store)
	if err != nil {
		st.LastPruneResult = "Failed: " + err.Error()
		return now.Add(time.Hour), nil
	}
	name := fmt.Sprintf("%s-prune-%s", truncate(pg.Name, 40), now.UTC().Format("200601021504"))
	job := jobspec.WALPrune{Target: pg, Store: store.spec, Prefix: prefix, Name: name, Window: sb.WALArchive.RecoveryWindow,
		AgentImage: r.Image, Deadline: time.Hour}.Job()
	if refusal, err := r.startJob(ctx, pg, job); err != nil {
		return time.Time{}, err
	} else if refusal != "" {
		st.LastPruneResult = "Failed: " + refusal
		return now.Add(time.Hour), nil
	}
	t := metav1.NewTime(now.Truncate(time.Second))
	st.PruneJob, st.LastPruneTime = name, &t
	st.LastPruneResult = fmt.Sprintf("Running: Job %s prunes the archive %s to the last %s", name, prefix, sb.WALArchive.RecoveryWindow)
	return now.Add(time.Minute), nil
}

// pruneReport is what the agent's wal-prune reports.
type pruneReport struct {
	PrunedBases *int `json:"prunedBases"`
	PrunedFiles *int `json:"prunedFiles"`
	Window      *struct {
		First, Last time.Time
		LastWAL     string
		Bases       int
		Files       int
	} `json:"window"`
}

// followPrune records the end of the running prune Job.
func (r *ScheduleReconciler) followPrune(ctx context.Context, pg *v1alpha1.Postgres) error {
	st := pg.Status.Backup
	job, end, err := r.followJob(ctx, pg.Namespace, st.PruneJob)
	switch end {
	case jobGone:
		st.PruneJob, st.LastPruneResult = "", "Failed: Job "+st.PruneJob+" was deleted before it finished"
	case jobFailed:
		st.LastPruneResult = fmt.Sprintf("Failed: Job %s could not prune the archive: %s (kubectl logs job/%s)", job.Name, podMessage(ctx, r.Reader, job), job.Name)
		r.Recorder.Event(pg, corev1.EventTypeWarning, "WALArchivePruneFailed", st.LastPruneResult)
		st.PruneJob = ""
	case jobComplete:
		var rep pruneReport
		if err := json.Unmarshal([]byte(podMessage(ctx, r.Reader, job)), &rep); err != nil || rep.PrunedBases == nil || rep.PrunedFiles == nil || rep.Window == nil {
			st.LastPruneResult = fmt.Sprintf("Failed: Job %s ended without reporting what it pruned", job.Name)
			r.Recorder.Event(pg, corev1.EventTypeWarning, "WALArchivePruneFailed", st.LastPruneResult)
		} else {
			w := rep.Window
			checked := metav1.NewTime(r.Now().Truncate(time.Second))
			a := &v1alpha1.PostgresArchiveStatus{LastArchivedWAL: w.LastWAL, BaseBackups: w.Bases, Files: w.Files, CheckedAt: &checked}
			if !w.First.IsZero() {
				a.FirstRecoverableTime = &metav1.Time{Time: w.First.Truncate(time.Second)}
			}
			if !w.Last.IsZero() {
				a.LastArchivedTime = &metav1.Time{Time: w.Last.Truncate(time.Second)}
			}
			st.Archive = a
			st.LastPruneResult = fmt.Sprintf("Succeeded: %d base backups and %d WAL files pruned; %d base backups and %d files left", *rep.PrunedBases, *rep.PrunedFiles, w.Bases, w.Files)
			r.Recorder.Event(pg, corev1.EventTypeNormal, "WALArchivePruned", st.LastPruneResult)
		}
		st.PruneJob = ""
	}
	return err
}
