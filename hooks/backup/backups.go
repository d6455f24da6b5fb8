package backup

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"path"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/record"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"

	"github.com/chartpilot/chartpilot/internal/api/v1alpha1"
	"github.com/chartpilot/chartpilot/internal/backup"
	"github.com/chartpilot/chartpilot/internal/redact"
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
	Client client.Client
	// Kinds are the passthrough kinds with a watches.yaml backup block.
	Kinds map[string]PassthroughKind
	// Identity creates the Jobs as the target's identity (nil: as the
	// manager).
	Identity *Identity
	// Reader reads Secrets, Namespaces and pods from the API server.
	Reader   client.Reader
	Recorder record.EventRecorder
	// Image is chartpilot's image: an init container copies the agent from
	// it into the Job's pod, whose container is the database's own image
	// (postgres:<version> for a Postgres: client tools of its major).
	Image string
	// PostgresImage is the repository of the PostgreSQL images the Jobs
	// of a Postgres run, REPOSITORY:<spec.version> ("postgres" when empty).
	PostgresImage string
	// Deadline bounds a Job's run; DefaultDeadline when zero.
	Deadline time.Duration
	// Stores runs the store helper, which reads a backup's manifest from
	// a remote store.
	Stores *backup.StoreHelper
	// Endpoints are the operator's --backup-store-endpoints (see
	// StoreReconciler.Endpoints).
	Endpoints []string
	// SkipNameValidation allows several managers in one process (tests).
	SkipNameValidation bool
	// Now is the clock (tests).
	Now func() time.Time
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
	if !equalJSON(before.Status, b.Status) {
		if err := r.Client.Status().Patch(ctx, b, client.MergeFrom(before)); err != nil {
			return ctrl.Result{}, fmt.Errorf("writing status: %w", err)
		}
	}
	return res, nil
}

func equalJSON(a, b any) bool {
	x, _ := json.Marshal(a)
	y, _ := json.Marshal(b)
	return string(x) == string(y)
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

// resolvedStore is a store a Backup may use, as its Job sees it.
type resolvedStore struct {
	spec v1alpha1.BackupStoreSpec
	// cluster: a ClusterBackupStore (the admin's own).
	cluster bool
	// secretNS is where the store's Secrets are.
	secretNS string
}

// store resolves b's store: it exists, is Ready for its current spec, is
// offered to b's namespace, and its Secrets are ones a Job of that
// namespace can use. The string says why not.
func (r *BackupReconciler) store(ctx context.Context, b *v1alpha1.Backup) (*resolvedStore, string, bool) {
	ref := b.Spec.Store
	if ref.Kind == "ClusterBackupStore" {
		cs := &v1alpha1.ClusterBackupStore{}
		if err := r.Client.Get(ctx, types.NamespacedName{Name: ref.Name}, cs); err != nil {
			return nil, fmt.Sprintf("spec.store: ClusterBackupStore %s: %v", ref.Name, redact.Error(err)), apierrors.IsNotFound(err)
		}
		if why := r.offered(ctx, cs, b.Namespace); why != "" {
			return nil, why, true
		}
		if why := notReady("ClusterBackupStore", cs.Name, cs.Generation, cs.Status.Conditions); why != "" {
			return nil, why, true
		}
		if s3 := cs.Spec.S3; s3 != nil && (s3.CredentialsSecretRef.Namespace != b.Namespace || (s3.CASecretRef != nil && s3.CASecretRef.Namespace != b.Namespace)) {
			return nil, fmt.Sprintf("spec.store: ClusterBackupStore %s keeps its S3 Secrets in namespace %s, which a backup Job of %s cannot read: use a BackupStore of %s, or a ClusterBackupStore whose Secrets are in %s", cs.Name, s3.CredentialsSecretRef.Namespace, b.Namespace, b.Namespace, b.Namespace), false
		}
		if az := cs.Spec.Azure; az != nil && az.CredentialsSecretRef.Namespace != b.Namespace {
			return nil, fmt.Sprintf("spec.store: ClusterBackupStore %s keeps its Azure Secret in namespace %s, which a backup Job of %s cannot read: use a BackupStore of %s, or a ClusterBackupStore whose Secret is in %s", cs.Name, az.CredentialsSecretRef.Namespace, b.Namespace, b.Namespace, b.Namespace), false
		}
		if g := cs.Spec.GCS; g != nil && g.CredentialsSecretRef != nil && g.CredentialsSecretRef.Namespace != b.Namespace {
			return nil, fmt.Sprintf("spec.store: ClusterBackupStore %s keeps its GCS Secret in namespace %s, which a backup Job of %s cannot read: use a BackupStore of %s, or a ClusterBackupStore whose Secret is in %s", cs.Name, g.CredentialsSecretRef.Namespace, b.Namespace, b.Namespace, b.Namespace), false
		}
		return &resolvedStore{spec: v1alpha1.BackupStoreSpec{S3: cs.Spec.S3, GCS: cs.Spec.GCS, Azure: cs.Spec.Azure, Volume: cs.Spec.Volume}, secretNS: b.Namespace, cluster: true}, "", true
	}
	s := &v1alpha1.BackupStore{}
	if err := r.Client.Get(ctx, types.NamespacedName{Namespace: b.Namespace, Name: ref.Name}, s); err != nil {
		return nil, fmt.Sprintf("spec.store: BackupStore %s/%s: %v", b.Namespace, ref.Name, redact.Error(err)), apierrors.IsNotFound(err)
	}
	if why := notReady("BackupStore", s.Name, s.Generation, s.Status.Conditions); why != "" {
		return nil, why, true
	}
	return &resolvedStore{spec: s.Spec, secretNS: b.Namespace}, "", true
}

// offered says why cs does not serve namespace ns ("" when it does).
func (r *BackupReconciler) offered(ctx context.Context, cs *v1alpha1.ClusterBackupStore, ns string) string {
	if cs.Spec.NamespaceSelector == nil {
		return fmt.Sprintf("spec.store: ClusterBackupStore %s has no namespaceSelector and serves no namespace: ask an admin to select %s", cs.Name, ns)
	}
	sel, err := metav1.LabelSelectorAsSelector(cs.Spec.NamespaceSelector)
	if err != nil {
		return fmt.Sprintf("spec.store: ClusterBackupStore %s has an invalid namespaceSelector: %v", cs.Name, err)
	}
	n := &corev1.Namespace{}
	if err := r.Reader.Get(ctx, types.NamespacedName{Name: ns}, n); err != nil {
		return fmt.Sprintf("reading namespace %s: %v", ns, redact.Error(err))
	}
	if sel.Empty() || !sel.Matches(labels.Set(n.Labels)) {
		return fmt.Sprintf("spec.store: ClusterBackupStore %s does not serve namespace %s (its namespaceSelector does not select it): use a BackupStore of %s, or ask an admin", cs.Name, ns, ns)
	}
	return ""
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
		ready := apimeta.FindStatusCondition(pg.Status.Conditions, v1alpha1.ConditionReady)
		if ready == nil || ready.Status != metav1.ConditionTrue || pg.Status.Endpoints == nil || pg.Status.Endpoints.ReadWrite == "" || pg.Status.Endpoints.Secret == "" {
			return nil, fmt.Sprintf("spec.target: Postgres %s is not Ready", pg.Name), "", nil
		}
		t := &target{obj: asUnstructured(pg), databaseVersion: pg.Spec.Version, job: func(st *resolvedStore, location string) *batchv1.Job { return r.job(b, pg, st, location) }}
		if pg.Status.Release != nil {
			t.chartVersion = pg.Status.Release.ChartVersion
		}
		return t, "", "", nil
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
		return r.passthroughJob(b, pk.Backup, st, location)
	}}
	if rel := v1alpha1.ReadReleaseStatus(u).Release; rel != nil {
		t.chartVersion = rel.ChartVersion
	}
	return t, "", "", nil
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
	st, why, mayWait := r.store(ctx, b)
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

// AgentDir is where a Job's init container puts the agent, for the main
// container (the database's own image) to run.
const AgentDir = "/chartpilot-agent"

// passthroughJob is b's Job for a kind with a watches.yaml backup block:
// an init container of the agent's image copies the agent into a shared
// volume; the block's image runs it, and it runs the block's command.
func (r *BackupReconciler) passthroughJob(b *v1alpha1.Backup, block *watches.Backup, st *resolvedStore, location string) *batchv1.Job {
	env := []corev1.EnvVar{
		{Name: "CHARTPILOT_TARGET_NAME", Value: b.Spec.Target.Name},
		{Name: "CHARTPILOT_TARGET_NAMESPACE", Value: b.Namespace},
	}
	for _, e := range block.Env {
		env = append(env, corev1.EnvVar{Name: e.Name, ValueFrom: secretKey(strings.ReplaceAll(e.Secret, "{name}", b.Spec.Target.Name), e.Key)})
	}
	args := []string{"run", "--location", location, "--manifest-file", "/dev/termination-log",
		"--label", "namespace=" + b.Namespace, "--label", "kind=" + b.Spec.Target.Kind, "--label", "name=" + b.Spec.Target.Name,
		"--label", "backup=" + b.Name}
	sargs, senv, volumes, mounts := storeFlags(st)
	args = append(append(append(args, sargs...), "--"), block.Command...)
	lbl := map[string]string{v1alpha1.LabelBackup: b.Name, v1alpha1.LabelComponent: "backup", "app.kubernetes.io/managed-by": "chartpilot"}
	return withAgent(agentJob(b.Namespace, JobName(b), lbl, block.Image, r.Deadline, args, append(env, senv...), volumes, mounts), r.Image, "backup")
}

// withAgent makes job's container (of another image: the database's own,
// with its client tools) run chartpilot SUBCOMMAND, copied into a shared
// volume by an init container of agentImage (chartpilot's image).
func withAgent(job *batchv1.Job, agentImage string, subcommand ...string) *batchv1.Job {
	pod := &job.Spec.Template.Spec
	pod.Volumes = append(pod.Volumes, corev1.Volume{Name: "agent", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}})
	agentMount := corev1.VolumeMount{Name: "agent", MountPath: AgentDir}
	main := &pod.Containers[0]
	main.Command = append([]string{AgentDir + "/chartpilot"}, subcommand...)
	main.VolumeMounts = append(main.VolumeMounts, agentMount)
	pod.InitContainers = []corev1.Container{{
		Name: "install-agent", Image: agentImage, Command: []string{"chartpilot", "install-agent", AgentDir},
		VolumeMounts: []corev1.VolumeMount{agentMount}, SecurityContext: main.SecurityContext, Resources: main.Resources,
	}}
	return job
}

// placedLike gives job's pod the node selector and tolerations of pg's
// pods (spec.nodeSelector, spec.tolerations, which admission checked
// against the Tenant's limits): a Job runs on the nodes its database may
// use, also where those are tainted for databases alone.
func placedLike(pg *v1alpha1.Postgres, job *batchv1.Job) *batchv1.Job {
	spec := &job.Spec.Template.Spec
	if len(pg.Spec.NodeSelector) > 0 {
		spec.NodeSelector = maps.Clone(pg.Spec.NodeSelector)
	}
	spec.Tolerations = append(spec.Tolerations, pg.Spec.Tolerations...)
	return job
}

// postgresImage is the image of pg's PostgreSQL (repository "postgres",
// the chart's default, or the given one) at pg's version: its client tools
// are those of the server's major.
func postgresImage(repository string, pg *v1alpha1.Postgres) string {
	if repository == "" {
		repository = "postgres"
	}
	return repository + ":" + pg.Spec.Version
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

// job is b's Job: the agent streams pg_dump -Fc of the target's primary
// to the store. Credentials reach it only as references to Secrets of
// b's namespace; its pod has no API token.
func (r *BackupReconciler) job(b *v1alpha1.Backup, pg *v1alpha1.Postgres, st *resolvedStore, location string) *batchv1.Job {
	env := pgEnv(pg)
	args := []string{"run", "--location", location, "--manifest-file", "/dev/termination-log",
		"--label", "namespace=" + b.Namespace, "--label", "kind=" + b.Spec.Target.Kind, "--label", "name=" + pg.Name,
		"--label", "backup=" + b.Name, "--label", "databaseVersion=" + pg.Spec.Version}
	if sb := pg.Spec.Backup; sb != nil {
		if sb.Compression != "" {
			args = append(args, "--compression", sb.Compression)
		}
		if e := sb.Encryption; e != nil {
			env = append(env, corev1.EnvVar{Name: "CHARTPILOT_AGE_KEY", ValueFrom: secretKey(e.KeySecretRef.Name, e.KeySecretRef.Key)})
		}
		if k := sb.Retention; k != nil && scheduled(b) {
			if k.Count > 0 {
				args = append(args, "--keep-count", fmt.Sprint(k.Count))
			}
			if k.MaxAge != nil && k.MaxAge.Duration > 0 {
				args = append(args, "--keep-max-age", k.MaxAge.Duration.String())
			}
		}
	}
	sargs, senv, volumes, mounts := storeFlags(st)
	args = append(append(args, sargs...), "--", "pg_dump", "-Fc")
	lbl := map[string]string{v1alpha1.LabelBackup: b.Name, v1alpha1.LabelComponent: "backup", "app.kubernetes.io/managed-by": "chartpilot"}
	return placedLike(pg, withAgent(agentJob(b.Namespace, JobName(b), lbl, postgresImage(r.PostgresImage, pg), r.Deadline, args, append(env, senv...), volumes, mounts), r.Image, "backup"))
}

func secretKey(name, key string) *corev1.EnvVarSource {
	return &corev1.EnvVarSource{SecretKeyRef: &corev1.SecretKeySelector{LocalObjectReference: corev1.LocalObjectReference{Name: name}, Key: key}}
}

// pgEnv is the libpq environment that reaches pg's primary as its
// superuser, the password by reference to its Secret.
func pgEnv(pg *v1alpha1.Postgres) []corev1.EnvVar {
	return []corev1.EnvVar{
		{Name: "PGHOST", Value: pg.Status.Endpoints.ReadWrite},
		{Name: "PGPORT", Value: "5432"},
		{Name: "PGDATABASE", Value: "postgres"},
		{Name: "PGUSER", ValueFrom: secretKey(pg.Status.Endpoints.Secret, "username")},
		{Name: "PGPASSWORD", ValueFrom: secretKey(pg.Status.Endpoints.Secret, "password")},
	}
}

// expectFlags tell a restoring agent what the Backup recorded, so that a
// backup replaced in the store is refused before anything is downloaded
// or restored (none for a restore from a bare location).
func expectFlags(sha256 string, size int64) []string {
	var out []string
	if sha256 != "" {
		out = append(out, "--expect-sha256", sha256)
	}
	if size > 0 {
		out = append(out, "--expect-size", strconv.FormatInt(size, 10))
	}
	return out
}

// storeFlags are the agent's flags, environment and volumes for store st.
func storeFlags(st *resolvedStore) (args []string, env []corev1.EnvVar, volumes []corev1.Volume, mounts []corev1.VolumeMount) {
	if az := st.spec.Azure; az != nil {
		args = append(args, "--store", "azure", "--azure-account", az.AccountName, "--azure-container", az.Container)
		if az.Endpoint != "" {
			args = append(args, "--azure-endpoint", az.Endpoint)
		}
		if az.Prefix != "" {
			args = append(args, "--azure-prefix", az.Prefix)
		}
		env = append(env, corev1.EnvVar{Name: "CHARTPILOT_AZURE_ACCOUNT_KEY", ValueFrom: secretKey(az.CredentialsSecretRef.Name, "accountKey")})
		return args, env, volumes, mounts
	}
	if g := st.spec.GCS; g != nil {
		args = append(args, "--store", "gcs", "--gcs-bucket", g.Bucket)
		if g.Endpoint != "" {
			args = append(args, "--gcs-endpoint", g.Endpoint)
		}
		if g.Prefix != "" {
			args = append(args, "--gcs-prefix", g.Prefix)
		}
		if ref := g.CredentialsSecretRef; ref != nil {
			env = append(env, corev1.EnvVar{Name: "CHARTPILOT_GCS_SERVICE_ACCOUNT_KEY", ValueFrom: secretKey(ref.Name, "serviceAccountKey")})
		}
		return args, env, volumes, mounts
	}
	if s3 := st.spec.S3; s3 != nil {
		args = append(args, "--store", "s3", "--s3-bucket", s3.Bucket)
		if s3.Endpoint != "" {
			args = append(args, "--s3-endpoint", s3.Endpoint)
		}
		if s3.Prefix != "" {
			args = append(args, "--s3-prefix", s3.Prefix)
		}
		if s3.Region != "" {
			args = append(args, "--s3-region", s3.Region)
		}
		if s3.ForcePathStyle {
			args = append(args, "--s3-force-path-style")
		}
		env = append(env,
			corev1.EnvVar{Name: "CHARTPILOT_S3_ACCESS_KEY_ID", ValueFrom: secretKey(s3.CredentialsSecretRef.Name, "accessKeyID")},
			corev1.EnvVar{Name: "CHARTPILOT_S3_SECRET_ACCESS_KEY", ValueFrom: secretKey(s3.CredentialsSecretRef.Name, "secretAccessKey")})
		if ca := s3.CASecretRef; ca != nil {
			volumes = append(volumes, corev1.Volume{Name: "ca", VolumeSource: corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{
				SecretName: ca.Name, Items: []corev1.KeyToPath{{Key: ca.Key, Path: "ca.pem"}}}}})
			mounts = append(mounts, corev1.VolumeMount{Name: "ca", MountPath: "/etc/chartpilot/ca", ReadOnly: true})
			args = append(args, "--s3-ca-file", "/etc/chartpilot/ca/ca.pem")
		}
		return args, env, volumes, mounts
	}
	v := st.spec.Volume
	volumes = append(volumes, corev1.Volume{Name: "store", VolumeSource: corev1.VolumeSource{
		PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: v.ClaimName}}})
	mounts = append(mounts, corev1.VolumeMount{Name: "store", MountPath: "/backups"})
	args = append(args, "--store", "volume", "--volume-path", path.Join("/backups", v.Path))
	return args, env, volumes, mounts
}

// tmpHeadroom is what a restoring Job's /tmp holds besides the download
// (the restore command's own temporary files).
const tmpHeadroom = 256 << 20

// agentJob is a Job of the agent (`chartpilot backup ARGS`): one try,
// bounded by deadline, no API token, non-root, read-only root file system,
// no capabilities.
func agentJob(namespace, name string, lbl map[string]string, image string, deadline time.Duration, args []string, env []corev1.EnvVar, volumes []corev1.Volume, mounts []corev1.VolumeMount) *batchv1.Job {
	if !slices.ContainsFunc(volumes, func(v corev1.Volume) bool { return v.Name == "tmp" }) {
		// The root file system is read-only; the agent keeps a download
		// it checks before restoring in its temporary directory.
		// A restore of a recorded backup stages no more than its size
		// (the agent stops there too), so the node's disk is bounded.
		tmp := &corev1.EmptyDirVolumeSource{}
		if i := slices.Index(args, "--expect-size"); i >= 0 && i+1 < len(args) {
			if n, err := strconv.ParseInt(args[i+1], 10, 64); err == nil && n > 0 {
				tmp.SizeLimit = resource.NewQuantity(n+tmpHeadroom, resource.BinarySI)
			}
		}
		volumes = append(volumes, corev1.Volume{Name: "tmp", VolumeSource: corev1.VolumeSource{EmptyDir: tmp}})
		mounts = append(mounts, corev1.VolumeMount{Name: "tmp", MountPath: "/tmp"})
	}
	return &batchv1.Job{
		ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: name, Labels: lbl},
		Spec: batchv1.JobSpec{
			// One try: a retry is a new Backup, so two writers never share a location.
			BackoffLimit:          ptr.To[int32](0),
			ActiveDeadlineSeconds: ptr.To(int64(deadline / time.Second)),
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: lbl},
				Spec: corev1.PodSpec{
					RestartPolicy:                corev1.RestartPolicyNever,
					AutomountServiceAccountToken: ptr.To(false),
					EnableServiceLinks:           ptr.To(false),
					SecurityContext: &corev1.PodSecurityContext{
						RunAsNonRoot: ptr.To(true), RunAsUser: ptr.To[int64](65532), RunAsGroup: ptr.To[int64](65532), FSGroup: ptr.To[int64](65532),
						SeccompProfile: &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault},
					},
					Volumes: volumes,
					Containers: []corev1.Container{{
						Name: "agent", Image: image, Command: []string{"chartpilot", "backup"}, Args: args, Env: env, VolumeMounts: mounts,
						TerminationMessagePolicy: corev1.TerminationMessageFallbackToLogsOnError,
						Resources: corev1.ResourceRequirements{
							Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("100m"), corev1.ResourceMemory: resource.MustParse("128Mi")},
							Limits:   corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("512Mi")},
						},
						SecurityContext: &corev1.SecurityContext{
							AllowPrivilegeEscalation: ptr.To(false), ReadOnlyRootFilesystem: ptr.To(true),
							Capabilities: &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}},
						},
					}},
				},
			},
		},
	}
}

// follow reads b's Job: when it succeeded, what it stored is read back
// from the store (S3) or from its pod's termination message (volume), and
// only a manifest found there completes the Backup.
func (r *BackupReconciler) follow(ctx context.Context, b *v1alpha1.Backup) (ctrl.Result, error) {
	job := &batchv1.Job{}
	if err := r.Client.Get(ctx, types.NamespacedName{Namespace: b.Namespace, Name: b.Status.Job}, job); err != nil {
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
		backupLastSuccess.WithLabelValues(lbl...).Set(float64(now.Unix()))
		backupSize.WithLabelValues(lbl...).Set(float64(m.Size))
		if b.Status.StartedAt != nil {
			backupDuration.WithLabelValues(lbl...).Set(now.Sub(b.Status.StartedAt.Time).Seconds())
		}
		return ctrl.Result{}, nil
	}
	return ctrl.Result{}, nil // the Job's next change wakes the Backup
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
	st, why, _ := r.store(ctx, b)
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

// asUnstructured is pg as the unstructured object identities are found for.
func asUnstructured(pg *v1alpha1.Postgres) *unstructured.Unstructured {
	m, _ := runtime.DefaultUnstructuredConverter.ToUnstructured(pg)
	u := &unstructured.Unstructured{Object: m}
	u.SetGroupVersionKind(v1alpha1.GroupVersion.WithKind("Postgres"))
	return u
}
