// Package jobspec builds the Jobs chartpilot creates, as pure functions
// of typed inputs (the target, the resolved store, the images, the
// placement): the backup, restore, drill and major upgrade Jobs of the
// Postgres kind and the backup and restore Jobs of passthrough kinds.
// Each runs chartpilot's agent, copied into the Job's pod from
// chartpilot's image by an init container; its golden test holds what
// it builds.
package jobspec

import (
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
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/utils/ptr"

	"github.com/chartpilot/chartpilot/internal/agentargs"
	"github.com/chartpilot/chartpilot/internal/api/v1alpha1"
	"github.com/chartpilot/chartpilot/internal/watches"
)

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

// SecretKey is an environment variable's source: key of Secret name.
func SecretKey(name, key string) *corev1.EnvVarSource {
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
		{Name: "PGUSER", ValueFrom: SecretKey(pg.Status.Endpoints.Secret, "username")},
		{Name: "PGPASSWORD", ValueFrom: SecretKey(pg.Status.Endpoints.Secret, "password")},
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
// SCRAM. Without a CA (the server takes no TLS, see ServerUnverified)
// only that last holds.
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

// ServerUnverified says why no Job may connect to pg's server yet: its
// status names no CA to verify it against, and does not say the server
// takes no TLS (a status written before it did, a StatefulSet not yet
// seen). A Job made then would offer the password to whatever answers the
// Service. Empty: the Job can verify the server, or the server's
// StatefulSet, as the operator saw it, mounts no certificate.
func ServerUnverified(pg *v1alpha1.Postgres) string {
	if ep := pg.Status.Endpoints; ep != nil && (ep.CASecret != "" || ep.TLS != nil && !*ep.TLS) {
		return ""
	}
	return fmt.Sprintf("Postgres %s has not reported the CA of its server's certificate (status.endpoints.caSecret) yet: waiting for it, so no password goes to a server not proven to be its own", pg.Name)
}

// StoreCAFile is where a Job finds an S3 store's CA.
const StoreCAFile = "/etc/chartpilot/ca/ca.pem"

// StoreFlags are the agent's store flags, environment (the credentials,
// by reference to their Secrets) and volumes for store st.
func StoreFlags(st v1alpha1.BackupStoreSpec) (a agentargs.Store, env []corev1.EnvVar, volumes []corev1.Volume, mounts []corev1.VolumeMount) {
	switch {
	case st.Azure != nil:
		az := st.Azure
		a = agentargs.Store{Kind: agentargs.Azure, AzureAccount: az.AccountName, AzureContainer: az.Container, AzureEndpoint: az.Endpoint, AzurePrefix: az.Prefix}
		env = append(env, corev1.EnvVar{Name: agentargs.EnvAzureAccountKey, ValueFrom: SecretKey(az.CredentialsSecretRef.Name, "accountKey")})
	case st.GCS != nil:
		g := st.GCS
		a = agentargs.Store{Kind: agentargs.GCS, GCSBucket: g.Bucket, GCSEndpoint: g.Endpoint, GCSPrefix: g.Prefix}
		if ref := g.CredentialsSecretRef; ref != nil {
			env = append(env, corev1.EnvVar{Name: agentargs.EnvGCSServiceAccountKey, ValueFrom: SecretKey(ref.Name, "serviceAccountKey")})
		}
	case st.S3 != nil:
		s3 := st.S3
		a = agentargs.Store{Kind: agentargs.S3, S3Bucket: s3.Bucket, S3Endpoint: s3.Endpoint, S3Prefix: s3.Prefix, S3Region: s3.Region, S3ForcePathStyle: s3.ForcePathStyle}
		env = append(env,
			corev1.EnvVar{Name: agentargs.EnvS3AccessKeyID, ValueFrom: SecretKey(s3.CredentialsSecretRef.Name, "accessKeyID")},
			corev1.EnvVar{Name: agentargs.EnvS3SecretAccessKey, ValueFrom: SecretKey(s3.CredentialsSecretRef.Name, "secretAccessKey")})
		if ca := s3.CASecretRef; ca != nil {
			volumes = append(volumes, corev1.Volume{Name: "ca", VolumeSource: corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{
				SecretName: ca.Name, Items: []corev1.KeyToPath{{Key: ca.Key, Path: path.Base(StoreCAFile)}}}}})
			mounts = append(mounts, corev1.VolumeMount{Name: "ca", MountPath: path.Dir(StoreCAFile), ReadOnly: true})
			a.S3CAFile = StoreCAFile
		}
	default:
		v := st.Volume
		volumes = append(volumes, corev1.Volume{Name: "store", VolumeSource: corev1.VolumeSource{
			PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: v.ClaimName}}})
		mounts = append(mounts, corev1.VolumeMount{Name: "store", MountPath: "/backups"})
		a = agentargs.Store{Kind: agentargs.Volume, VolumePath: path.Join("/backups", v.Path)}
	}
	return a, env, volumes, mounts
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

// AgentDir is where a Job's init container puts the agent, for the main
// container (the database's own image) to run.
const AgentDir = "/chartpilot-agent"
