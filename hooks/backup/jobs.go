package backup

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"maps"
	"path"
	"slices"
	"strconv"
	"strings"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/utils/ptr"

	"github.com/chartpilot/chartpilot/internal/api/v1alpha1"
	"github.com/chartpilot/chartpilot/internal/watches"
)

// AgentDir is where a Job's init container puts the agent, for the main
// container (the database's own image) to run.
const AgentDir = "/chartpilot-agent"

// passthroughJob is b's Job for a kind with a watches.yaml backup block:
// an init container of the agent's image copies the agent into a shared
// volume; the block's image runs it, and it runs the block's command. It
// is placed as target's pods (a passthrough kind's spec is its values).
func (r *BackupReconciler) passthroughJob(b *v1alpha1.Backup, target *unstructured.Unstructured, block *watches.Backup, st *resolvedStore, location string) *batchv1.Job {
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
	job := agentJob(b.Namespace, JobName(b), lbl, block.Image, r.Deadline, args, append(env, senv...), volumes, mounts)
	return withAgent(placedByValues(job, block, func(p []string) (any, bool) {
		v, ok, _ := unstructured.NestedFieldNoCopy(target.Object, append([]string{"spec"}, p...)...)
		return v, ok
	}), r.Image, "backup")
}

// placedByValues gives job's pod the node selector and tolerations the
// release's pods have, read by at at the block's values paths (a value of
// another shape than a chart takes is left out: the release fails on it
// already).
func placedByValues(job *batchv1.Job, block *watches.Backup, at func(path []string) (any, bool)) *batchv1.Job {
	spec := &job.Spec.Template.Spec
	if block.NodeSelectorValue != "" {
		if v, ok := at(strings.Split(block.NodeSelectorValue, ".")); ok {
			if m, ok := v.(map[string]any); ok {
				sel := map[string]string{}
				for k, v := range m {
					if s, ok := v.(string); ok {
						sel[k] = s
					}
				}
				if len(sel) > 0 {
					spec.NodeSelector = sel
				}
			}
		}
	}
	if block.TolerationsValue != "" {
		if v, ok := at(strings.Split(block.TolerationsValue, ".")); ok {
			list, _ := v.([]any)
			for _, item := range list {
				m, ok := item.(map[string]any)
				if !ok {
					continue
				}
				var tol corev1.Toleration
				if err := runtime.DefaultUnstructuredConverter.FromUnstructured(m, &tol); err == nil {
					spec.Tolerations = append(spec.Tolerations, tol)
				}
			}
		}
	}
	return job
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

// job is b's Job: the agent streams a full backup of the target's
// primary (its roles as rows of the catalogs, every database with
// pg_dump -Fc) to the store. Credentials reach it only as references to Secrets of
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
	// Everything the server holds: its roles and every database.
	args = append(append(args, sargs...), "--postgres")
	lbl := map[string]string{v1alpha1.LabelBackup: b.Name, v1alpha1.LabelComponent: "backup", "app.kubernetes.io/managed-by": "chartpilot"}
	return verifiesServer(pg, placedLike(pg, withAgent(agentJob(b.Namespace, JobName(b), lbl, postgresImage(r.PostgresImage, pg), r.Deadline, args, append(env, senv...), volumes, mounts), r.Image, "backup")))
}

func secretKey(name, key string) *corev1.EnvVarSource {
	return &corev1.EnvVarSource{SecretKeyRef: &corev1.SecretKeySelector{LocalObjectReference: corev1.LocalObjectReference{Name: name}, Key: key}}
}

// pgEnv is the libpq environment that reaches pg's primary as its
// superuser through its read-write Service (on the port its status
// reports: the chart's service.port), the password by reference to its
// Secret.
func pgEnv(pg *v1alpha1.Postgres) []corev1.EnvVar {
	port := int32(5432) // the chart's default, for a status from before the port was reported
	if p := pg.Status.Endpoints.Port; p > 0 {
		port = p
	}
	return []corev1.EnvVar{
		{Name: "PGHOST", Value: pg.Status.Endpoints.ReadWrite},
		{Name: "PGPORT", Value: strconv.Itoa(int(port))},
		{Name: "PGDATABASE", Value: "postgres"},
		{Name: "PGUSER", ValueFrom: secretKey(pg.Status.Endpoints.Secret, "username")},
		{Name: "PGPASSWORD", ValueFrom: secretKey(pg.Status.Endpoints.Secret, "password")},
	}
}

// ServerCADir is where a Job that connects to a Postgres finds the CA its
// server's certificate is verified against (ca.crt).
const ServerCADir = "/etc/chartpilot/postgresql-ca"

// verifiesServer makes job's client commands authenticate pg's server
// before they offer a password: TLS with the server's name checked
// against the CA of pg's status (sslmode=verify-full), and SCRAM bound to
// that channel, so no password and no proof of one goes to whatever else
// answers the Service. libpq 16 and later also refuse any method but
// SCRAM. Without a CA (the server takes no TLS) only that last holds.
func verifiesServer(pg *v1alpha1.Postgres, job *batchv1.Job) *batchv1.Job {
	main := &job.Spec.Template.Spec.Containers[0]
	main.Env = append(main.Env, corev1.EnvVar{Name: "PGREQUIREAUTH", Value: "scram-sha-256"})
	ca := ""
	if pg.Status.Endpoints != nil {
		ca = pg.Status.Endpoints.CASecret
	}
	if ca == "" {
		return job
	}
	pod := &job.Spec.Template.Spec
	pod.Volumes = append(pod.Volumes, corev1.Volume{Name: "postgresql-ca", VolumeSource: corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{
		SecretName: ca, Items: []corev1.KeyToPath{{Key: "ca.crt", Path: "ca.crt"}}}}})
	main.VolumeMounts = append(main.VolumeMounts, corev1.VolumeMount{Name: "postgresql-ca", MountPath: ServerCADir, ReadOnly: true})
	main.Env = append(main.Env,
		corev1.EnvVar{Name: "PGSSLMODE", Value: "verify-full"},
		corev1.EnvVar{Name: "PGSSLROOTCERT", Value: ServerCADir + "/ca.crt"},
		corev1.EnvVar{Name: "PGCHANNELBINDING", Value: "require"})
	return job
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

// StageDir is where a restoring or drilling Job keeps a database's
// archive while it loads.
const StageDir = "/stage"

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
	if len(args) > 0 && (args[0] == "verify" || args[0] == "restore" && slices.Contains(args, "--postgres")) {
		// Each database's archive is staged while its tables load as
		// their owners (in passes over it): no more than the backup.
		stage := &corev1.EmptyDirVolumeSource{}
		if i := slices.Index(args, "--expect-size"); i >= 0 && i+1 < len(args) {
			if n, err := strconv.ParseInt(args[i+1], 10, 64); err == nil && n > 0 {
				stage.SizeLimit = resource.NewQuantity(n+tmpHeadroom, resource.BinarySI)
			}
		}
		volumes = append(volumes, corev1.Volume{Name: "stage", VolumeSource: corev1.VolumeSource{EmptyDir: stage}})
		mounts = append(mounts, corev1.VolumeMount{Name: "stage", MountPath: StageDir})
		env = append(env, corev1.EnvVar{Name: "CHARTPILOT_STAGE_DIR", Value: StageDir})
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
