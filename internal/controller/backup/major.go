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
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/record"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/source"

	"github.com/chartpilot/chartpilot/internal/agent/majorupgrade"
	"github.com/chartpilot/chartpilot/internal/api/v1alpha1"
	"github.com/chartpilot/chartpilot/internal/hooks"
	"github.com/chartpilot/chartpilot/internal/jobspec"
	"github.com/chartpilot/chartpilot/internal/redact"
)

// A PostgreSQL major upgrade, carried out. A new server major cannot
// start on the old major's data directory, so once the fresh backup
// (beforeMajor) completed, a Job running the new major's image moves the
// data: writes stopped on the old server, everything dumped, restored into
// a new data directory on a new claim (DATAVOLUME-NAME-0, initialised by
// the new major), every table's rows and checksum compared; with failover,
// marked as moved, so that pod 0's instance manager leads with it. Only then does
// the release switch: the values name the new claim template, so the
// StatefulSet is re-created on it (the reconciler replaces a StatefulSet
// whose claim templates are renamed). The old claims are kept and named in
// status.previousVolume. Any failure leaves the release on the old major
// and data, the old server serving writes again, and UpgradeBlocked naming
// the step.

// Major upgrade phases (status.majorUpgrade.phase).
const (
	MajorRunning   = "Running"
	MajorFailed    = "Failed"
	MajorCompleted = "Completed"
)

// Major carries out PostgreSQL major upgrades of Postgres resources.
type Major struct {
	// Client reads Jobs (cached) and writes the Postgres status.
	Client client.Client
	// Reader reads the Job's pods (their termination messages).
	Reader   client.Reader
	Recorder record.EventRecorder
	// Identity creates the claim and the Job as the Postgres's identity.
	Identity *Identity
	// AgentImage holds chartpilot, copied into the Job's pod.
	AgentImage string
	// PostgresImage is the repository of the PostgreSQL images ("postgres",
	// the chart's default); the Job runs REPOSITORY:<spec.version>.
	PostgresImage string
	// Deadline bounds the Job (6 h when zero).
	Deadline time.Duration
}

// majorChange is a PostgreSQL major change a Postgres asks for.
type majorChange struct {
	pg       *v1alpha1.Postgres
	from, to string
	// volume is the claim template the data is on; next the one it moves to.
	volume, next string
	job          string
}

// pendingMajor is the major change u asks for that its data has not made
// yet, or nil.
func pendingMajor(u *unstructured.Unstructured) (*majorChange, error) {
	if u == nil || u.GetKind() != "Postgres" {
		return nil, nil
	}
	// Every pass asks: the two fields first, the whole object only for a change.
	want, _, _ := unstructured.NestedString(u.Object, "spec", "version")
	have, _, _ := unstructured.NestedString(u.Object, "status", "version")
	from, to := majorOf(have), majorOf(want)
	if from == "" || to == "" || from == to {
		return nil, nil
	}
	pg := &v1alpha1.Postgres{}
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, pg); err != nil {
		return nil, err
	}
	if dv := pg.Status.DataVolume; dv != nil && dv.Major == to {
		return nil, nil // moved: the release switches
	}
	ch := &majorChange{pg: pg, from: from, to: to, volume: dataVolume(pg), next: "data-pg" + to, job: pg.Name + "-major-" + to}
	return ch, nil
}

// dataVolume is the claim template pg's data is on.
func dataVolume(pg *v1alpha1.Postgres) string {
	if dv := pg.Status.DataVolume; dv != nil && dv.Name != "" {
		return dv.Name
	}
	return "data"
}

// values names the claim template of the data: the one a completed move
// made for the major asked for, else the one the data is on.
func (m *Major) values(ctx context.Context, obj hooks.Object) (map[string]any, error) {
	u := obj.Resource
	if u == nil || u.GetKind() != "Postgres" {
		return nil, nil
	}
	ch, err := pendingMajor(u)
	if err != nil {
		return nil, err
	}
	if ch == nil {
		name, found, _ := unstructured.NestedString(u.Object, "status", "dataVolume", "name")
		if !found || name == "" {
			return nil, nil
		}
		return map[string]any{"storage": map[string]any{"volumeName": name}}, nil
	}
	out, err := m.outcome(ctx, ch)
	if err != nil {
		return nil, err
	}
	name := ch.volume
	if out.report != nil && out.report.OK {
		name = ch.next
	}
	if name == "data" {
		return nil, nil
	}
	return map[string]any{"storage": map[string]any{"volumeName": name}}, nil
}

// jobOutcome is what the major upgrade Job of a change did so far.
type jobOutcome struct {
	job    *batchv1.Job // nil: none yet
	failed bool
	// report is the Job's own word once it ended (nil: none readable).
	report *majorupgrade.Report
	// raw is its termination message when that is not a report.
	raw string
}

// outcome reads ch's Job and, once it ended, its report; computed once per
// pass (values and the upgrade gate see the same answer).
func (m *Major) outcome(ctx context.Context, ch *majorChange) (jobOutcome, error) {
	return hooks.Remember(ctx, "major-upgrade/"+ch.pg.Namespace+"/"+ch.job, func() (jobOutcome, error) {
		job := &batchv1.Job{}
		err := getJob(ctx, m.Client, m.Reader, types.NamespacedName{Namespace: ch.pg.Namespace, Name: ch.job}, job)
		if apierrors.IsNotFound(err) {
			return jobOutcome{}, nil
		}
		if err != nil {
			return jobOutcome{}, fmt.Errorf("reading Job %s: %w", ch.job, err)
		}
		out := jobOutcome{job: job}
		if job.Labels[v1alpha1.LabelMajorUpgrade] != ch.pg.Name {
			return out, nil // not ours: refused below
		}
		failed, complete := jobCondition(job, batchv1.JobFailed), jobCondition(job, batchv1.JobComplete)
		if !failed && !complete {
			return out, nil
		}
		out.failed = failed
		msg := podMessage(ctx, m.Reader, job)
		rep := &majorupgrade.Report{}
		if err := json.Unmarshal([]byte(msg), rep); err == nil && (rep.OK || rep.Step != "" || rep.Error != "") {
			out.report = rep
		} else {
			out.raw = msg
		}
		return out, nil
	})
}

// carryOut holds the upgrade of a Postgres whose PostgreSQL major changes
// until its data is on a new volume of the new major: it starts the Job,
// and says what the upgrade waits for or which step failed.
func (m *Major) carryOut(ctx context.Context, obj hooks.Object) error {
	ch, err := pendingMajor(obj.Resource)
	if err != nil || ch == nil {
		return err
	}
	pg := ch.pg
	what := fmt.Sprintf("the PostgreSQL %s → %s upgrade", ch.from, ch.to)
	if pg.Spec.Backup == nil {
		return hooks.Reject("MajorUpgradeNeedsBackup", "%s takes a fresh backup first and this Postgres has none: set spec.backup.store to a BackupStore", what)
	}
	out, err := m.outcome(ctx, ch)
	if err != nil {
		return err
	}
	switch {
	case out.job == nil:
		if err := m.start(ctx, obj.Resource, ch); err != nil {
			return err
		}
		if err := m.record(ctx, pg, &v1alpha1.PostgresMajorUpgrade{From: ch.from, To: ch.to, Phase: MajorRunning, Job: ch.job,
			Message: "Job " + ch.job + " moves the data to claim " + ch.next + "-" + pg.Name + "-0; writes are stopped meanwhile"}, nil); err != nil {
			return err
		}
		return hooks.Reject("MajorUpgradeRunning", "%s: Job %s started: it stops writes, dumps the data and restores it into claim %s-%s-0 with PostgreSQL %s", what, ch.job, ch.next, pg.Name, ch.to)
	case out.job.Labels[v1alpha1.LabelMajorUpgrade] != pg.Name:
		return hooks.Reject("MajorUpgradeFailed", "%s: Job %s exists and is not chartpilot's major upgrade of %s: delete or rename it", what, ch.job, pg.Name)
	case out.report != nil && out.report.OK && !out.failed && out.report.Major == ch.to:
		// The release follows status.dataVolume: it must be written
		// before the release moves.
		return m.completed(ctx, pg, ch, out.report)
	case out.report != nil || out.failed || out.job.Status.CompletionTime != nil:
		step, why := "report", "the Job ended without a report of the data it moved"
		switch {
		case out.report != nil && out.report.OK:
			why = fmt.Sprintf("the Job reports a data directory of PostgreSQL %q, not %s", out.report.Major, ch.to)
		case out.report != nil:
			step, why = out.report.Step, redact.Text(out.report.Error)
		case out.raw != "":
			why = out.raw
		}
		if err := m.record(ctx, pg, &v1alpha1.PostgresMajorUpgrade{From: ch.from, To: ch.to, Phase: MajorFailed, Job: ch.job, Step: step, Message: why}, nil); err != nil {
			return err
		}
		writes := "writes allowed again"
		if out.report == nil {
			// Killed before it could report (or give writes back).
			writes = "writes may still be stopped: the Job ended without its report; the next attempt gives them back if it fails"
		}
		return hooks.Reject("MajorUpgradeFailed", "%s failed at step %s: %s; the release stays on PostgreSQL %s with its data (%s); fix the cause and delete Job %s to try again (kubectl logs job/%s)", what, step, why, ch.from, writes, ch.job, ch.job)
	}
	return hooks.Reject("MajorUpgradeRunning", "%s: Job %s moves the data (writes are stopped meanwhile)", what, ch.job)
}

func failoverEnabled(pg *v1alpha1.Postgres) bool {
	if f := pg.Spec.Failover; f != nil && f.Enabled != nil {
		return *f.Enabled
	}
	return pg.Spec.Replicas != nil && *pg.Spec.Replicas > 1
}

// completed records the data moved: status.dataVolume (which the values
// follow from now on), status.previousVolume with the old claims, and an
// event; once.
func (m *Major) completed(ctx context.Context, pg *v1alpha1.Postgres, ch *majorChange, rep *majorupgrade.Report) error {
	if mu := pg.Status.MajorUpgrade; mu != nil && mu.Phase == MajorCompleted && mu.To == ch.to && pg.Status.DataVolume != nil && pg.Status.DataVolume.Major == ch.to {
		return nil
	}
	claims := &corev1.PersistentVolumeClaimList{}
	if err := m.Reader.List(ctx, claims, client.InNamespace(pg.Namespace)); err != nil {
		return fmt.Errorf("listing the claims of PostgreSQL %s: %w", ch.from, err)
	}
	var old []string
	prefix := ch.volume + "-" + pg.Name + "-"
	for _, c := range claims.Items {
		if rest, ok := strings.CutPrefix(c.Name, prefix); ok && rest != "" && strings.Trim(rest, "0123456789") == "" {
			old = append(old, c.Name)
		}
	}
	msg := fmt.Sprintf("%d tables in %d databases (%d rows) moved to PostgreSQL %s on claim %s-%s-0 and compared in %.1fs; the release switches to it; claims %s of PostgreSQL %s are kept until a person deletes them",
		rep.Tables, rep.Databases, rep.Rows, ch.to, ch.next, pg.Name, rep.Seconds, strings.Join(old, ", "), ch.from)
	err := m.record(ctx, pg, &v1alpha1.PostgresMajorUpgrade{From: ch.from, To: ch.to, Phase: MajorCompleted, Job: ch.job, Message: msg, Tables: rep.Tables, Rows: rep.Rows},
		map[string]any{
			"dataVolume":     map[string]any{"name": ch.next, "major": ch.to},
			"previousVolume": map[string]any{"name": ch.volume, "major": ch.from, "claims": old},
		})
	if err != nil {
		return err
	}
	if m.Recorder != nil {
		m.Recorder.Event(pg, corev1.EventTypeNormal, "MajorUpgradeDataMoved", msg)
	}
	return nil
}

// record merges status.majorUpgrade (and extra status fields) into pg's
// status when they changed; its error fails the pass, which is tried
// again.
func (m *Major) record(ctx context.Context, pg *v1alpha1.Postgres, mu *v1alpha1.PostgresMajorUpgrade, extra map[string]any) error {
	if cur := pg.Status.MajorUpgrade; cur != nil && *cur == *mu && extra == nil {
		return nil
	}
	raw, err := runtime.DefaultUnstructuredConverter.ToUnstructured(mu)
	if err != nil {
		return err
	}
	status := map[string]any{"majorUpgrade": raw}
	for k, v := range extra {
		status[k] = v
	}
	patch, err := json.Marshal(map[string]any{"status": status})
	if err != nil {
		return err
	}
	if err := m.Client.Status().Patch(ctx, pg, client.RawPatch(types.MergePatchType, patch)); err != nil {
		return fmt.Errorf("recording the major upgrade in %s's status: %w", pg.Name, err)
	}
	return nil
}

// start creates the new claim and the Job, as pg's identity.
func (m *Major) start(ctx context.Context, u *unstructured.Unstructured, ch *majorChange) error {
	pg := ch.pg
	if why := jobspec.ServerUnverified(pg); why != "" {
		return errors.New(why) // tried again; the status's next write has it
	}
	size, err := resource.ParseQuantity(pg.Spec.Storage.Size)
	if err != nil {
		return hooks.Reject("MajorUpgradeFailed", "spec.storage.size %q: %v", pg.Spec.Storage.Size, err)
	}
	claim := &corev1.PersistentVolumeClaim{
		ObjectMeta: metav1.ObjectMeta{Namespace: pg.Namespace, Name: ch.next + "-" + pg.Name + "-0",
			Labels: map[string]string{"app.kubernetes.io/name": "postgresql", "app.kubernetes.io/instance": pg.Name, v1alpha1.LabelMajorUpgrade: pg.Name}},
		Spec: corev1.PersistentVolumeClaimSpec{
			AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			Resources:   corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: size}},
		},
	}
	if sc := pg.Spec.Storage.StorageClass; sc != "" {
		claim.Spec.StorageClassName = ptr.To(sc)
	}
	if err := m.Identity.create(ctx, m.Client, u, claim, "persistentvolumeclaims"); err != nil {
		return err
	}
	job := m.job(pg, ch, claim.Name)
	job.OwnerReferences = []metav1.OwnerReference{{APIVersion: v1alpha1.GroupVersion.String(), Kind: "Postgres", Name: pg.Name, UID: pg.UID}}
	return m.Identity.createJob(ctx, m.Client, u, job)
}

// job is the major upgrade Job (jobspec.MajorUpgrade). Pod 0 gets the
// moved data; with failover its instance manager leads with it whichever
// member the Lease names, and the others clone from it.
func (m *Major) job(pg *v1alpha1.Postgres, ch *majorChange, claim string) *batchv1.Job {
	deadline := m.Deadline
	if deadline == 0 {
		deadline = 6 * time.Hour
	}
	return jobspec.MajorUpgrade{Target: pg, To: ch.to, Name: ch.job, Claim: claim, MarkMoved: failoverEnabled(pg),
		Images: jobspec.Images{Agent: m.AgentImage, Postgres: m.PostgresImage}, Deadline: deadline}.Job()
}

// Watch wakes a Postgres when its major upgrade Job or the Backup taken
// before its major upgrade changes (they end).
func (m *Major) Watch(mgr manager.Manager, c controller.Controller, _ hooks.EnqueueFunc) error {
	err := c.Watch(source.Kind(mgr.GetCache(), &batchv1.Job{}, handler.TypedEnqueueRequestsFromMapFunc(func(_ context.Context, j *batchv1.Job) []reconcile.Request {
		name := j.Labels[v1alpha1.LabelMajorUpgrade]
		if name == "" {
			return nil
		}
		return []reconcile.Request{{NamespacedName: types.NamespacedName{Namespace: j.Namespace, Name: name}}}
	})))
	if err != nil {
		return err
	}
	return c.Watch(source.Kind(mgr.GetCache(), &v1alpha1.Backup{}, handler.TypedEnqueueRequestsFromMapFunc(func(_ context.Context, b *v1alpha1.Backup) []reconcile.Request {
		if b.Labels[v1alpha1.LabelBeforeMajor] == "" || b.Spec.Target.Kind != "Postgres" {
			return nil
		}
		return []reconcile.Request{{NamespacedName: types.NamespacedName{Namespace: b.Namespace, Name: b.Spec.Target.Name}}}
	})))
}
