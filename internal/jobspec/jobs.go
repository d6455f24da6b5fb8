package jobspec

import (
	"strconv"
	"strings"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/utils/ptr"

	"github.com/chartpilot/chartpilot/internal/agentargs"
	"github.com/chartpilot/chartpilot/internal/api/v1alpha1"
	"github.com/chartpilot/chartpilot/internal/watches"
)

// Images are the images of chartpilot's Jobs.
type Images struct {
	// Agent is chartpilot's image: its binary is copied into each Job.
	Agent string
	// Postgres is the repository of the PostgreSQL images ("postgres",
	// the chart's default, when empty): a Job of a Postgres runs
	// REPOSITORY:<spec.version>, whose client tools are the server's.
	Postgres string
}

// managedBy labels every Job.
const managedBy = "chartpilot"

// PostgresBackup is a Backup of a Postgres.
type PostgresBackup struct {
	Backup *v1alpha1.Backup
	Target *v1alpha1.Postgres
	Store  v1alpha1.BackupStoreSpec
	// Name is the Job's; Location the backup's in the store.
	Name, Location string
	// Scheduled: made by spec.backup.schedule, so its retention applies.
	Scheduled bool
	Images    Images
	Deadline  time.Duration
}

// Job streams a full backup of the target's primary (its roles as rows
// of the catalogs, every database with pg_dump -Fc) to the store.
// Credentials reach it only as references to Secrets of the Backup's
// namespace; its pod has no API token.
func (in PostgresBackup) Job() *batchv1.Job {
	b, pg := in.Backup, in.Target
	env := pgEnv(pg)
	store, senv, volumes, mounts := StoreFlags(in.Store)
	// Everything the server holds: its roles and every database.
	a := agentargs.Backup{Sub: agentargs.Run, Location: in.Location, ManifestFile: "/dev/termination-log",
		Labels: []string{"namespace=" + b.Namespace, "kind=" + b.Spec.Target.Kind, "name=" + pg.Name, "backup=" + b.Name, "databaseVersion=" + pg.Spec.Version},
		Store:  store, Postgres: true}
	if sb := pg.Spec.Backup; sb != nil {
		a.Compression = sb.Compression
		if e := sb.Encryption; e != nil {
			env = append(env, corev1.EnvVar{Name: agentargs.EnvAgeKey, ValueFrom: SecretKey(e.KeySecretRef.Name, e.KeySecretRef.Key)})
		}
		if k := sb.Retention; k != nil && in.Scheduled {
			a.KeepCount = k.Count
			if k.MaxAge != nil {
				a.KeepMaxAge = k.MaxAge.Duration
			}
		}
	}
	args := a.Args()
	lbl := map[string]string{v1alpha1.LabelBackup: b.Name, v1alpha1.LabelComponent: "backup", "app.kubernetes.io/managed-by": managedBy}
	job := agentJob(b.Namespace, in.Name, lbl, postgresImage(in.Images.Postgres, pg), in.Deadline, args, append(env, senv...), volumes, mounts)
	return verifiesServer(pg, placedLike(pg, withAgent(job, in.Images.Agent, "backup")))
}

// PostgresBaseBackup is a physical Backup of a Postgres: a base backup
// into its WAL archive.
type PostgresBaseBackup struct {
	Backup *v1alpha1.Backup
	Target *v1alpha1.Postgres
	// Store is the archive's; Prefix the archive's key prefix in it
	// (PREFIX/pgMAJOR, as the chart archives to).
	Store  v1alpha1.BackupStoreSpec
	Prefix string
	// Name is the Job's; Location the base backup's, directly below
	// Prefix/base.
	Name, Location string
	Images         Images
	Deadline       time.Duration
}

// Job runs `chartpilot base-backup` (pg_basebackup, streamed through the
// backup data path into the archive) in the database's own image, from a
// standby when one is ready (baseBackupHost), encrypted for the archive's
// key when it has one.
func (in PostgresBaseBackup) Job() *batchv1.Job {
	b, pg := in.Backup, in.Target
	env := pgEnv(pg)
	env[0].Value = baseBackupHost(pg)
	store, senv, volumes, mounts := StoreFlags(in.Store)
	w := agentargs.WAL{Command: agentargs.BaseBackup, Store: store, Prefix: in.Prefix, Location: in.Location, ManifestFile: "/dev/termination-log"}
	if sb := pg.Spec.Backup; sb != nil {
		w.Compression = sb.Compression
		if e := sb.Encryption; e != nil {
			env = append(env, corev1.EnvVar{Name: agentargs.EnvAgeKey, ValueFrom: SecretKey(e.KeySecretRef.Name, e.KeySecretRef.Key)})
		}
	}
	lbl := map[string]string{v1alpha1.LabelBackup: b.Name, v1alpha1.LabelComponent: "backup", "app.kubernetes.io/managed-by": managedBy}
	job := agentJob(b.Namespace, in.Name, lbl, postgresImage(in.Images.Postgres, pg), in.Deadline, w.Line(), append(env, senv...), volumes, mounts)
	return verifiesServer(pg, placedLike(pg, withAgent(job, in.Images.Agent)))
}

// WALPrune is the Job that prunes a Postgres's WAL archive to its
// recovery window.
type WALPrune struct {
	Target *v1alpha1.Postgres
	// Store is the archive's; Prefix the archive's key prefix in it.
	Store        v1alpha1.BackupStoreSpec
	Prefix       string
	Name, Window string
	AgentImage   string
	Deadline     time.Duration
}

// Job runs `chartpilot wal-prune` in chartpilot's own image: it reaches
// the store only (its credentials as Secret references), never the
// server, and reports what it deleted and what the archive can recover to
// afterwards in its termination message.
func (in WALPrune) Job() *batchv1.Job {
	pg := in.Target
	store, env, volumes, mounts := StoreFlags(in.Store)
	w := agentargs.WAL{Command: agentargs.WALPrune, Store: store, Prefix: in.Prefix, RecoveryWindow: in.Window, ManifestFile: "/dev/termination-log"}
	lbl := map[string]string{v1alpha1.LabelComponent: "wal-prune", "app.kubernetes.io/managed-by": managedBy, "app.kubernetes.io/instance": pg.Name}
	job := agentJob(pg.Namespace, in.Name, lbl, in.AgentImage, in.Deadline, w.Line(), env, volumes, mounts)
	job.Spec.Template.Spec.Containers[0].Command = []string{"chartpilot"}
	return placedLike(pg, job)
}

// baseBackupHost is where a base backup of pg is taken: a standby's pod
// (its name in the headless Service, fully qualified; the chart's
// certificate names it) when more than one pod is ready, so the
// primary is spared the read; else the primary's Service.
func baseBackupHost(pg *v1alpha1.Postgres) string {
	replicas := int32(1)
	if pg.Spec.Replicas != nil {
		replicas = *pg.Spec.Replicas
	}
	if replicas < 2 || pg.Status.ReadyReplicas < 2 {
		return pg.Status.Endpoints.ReadWrite
	}
	primary := pg.Status.Primary
	if primary == "" {
		primary = pg.Name + "-0"
	}
	for k := replicas - 1; k >= 0; k-- {
		if pod := pg.Name + "-" + strconv.Itoa(int(k)); pod != primary {
			// Fully qualified: a name of two labels that does not resolve
			// (the pod has no address yet) would go on to the resolver's
			// search domains, and another namespace's Service.
			return pod + "." + pg.Name + "-headless." + pg.Namespace + ".svc"
		}
	}
	return pg.Status.Endpoints.ReadWrite
}

// PassthroughBackup is a Backup of a kind with a watches.yaml backup
// block.
type PassthroughBackup struct {
	Backup         *v1alpha1.Backup
	Target         *unstructured.Unstructured
	Block          *watches.Backup
	Store          v1alpha1.BackupStoreSpec
	Name, Location string
	AgentImage     string
	Deadline       time.Duration
}

// Job runs the block's command in the block's image, the agent streaming
// its output to the store; it is placed as the target's pods (a
// passthrough kind's spec is its values).
func (in PassthroughBackup) Job() *batchv1.Job {
	b := in.Backup
	env := []corev1.EnvVar{
		{Name: "CHARTPILOT_TARGET_NAME", Value: b.Spec.Target.Name},
		{Name: "CHARTPILOT_TARGET_NAMESPACE", Value: b.Namespace},
	}
	for _, e := range in.Block.Env {
		env = append(env, corev1.EnvVar{Name: e.Name, ValueFrom: SecretKey(strings.ReplaceAll(e.Secret, "{name}", b.Spec.Target.Name), e.Key)})
	}
	store, senv, volumes, mounts := StoreFlags(in.Store)
	args := agentargs.Backup{Sub: agentargs.Run, Location: in.Location, ManifestFile: "/dev/termination-log",
		Labels: []string{"namespace=" + b.Namespace, "kind=" + b.Spec.Target.Kind, "name=" + b.Spec.Target.Name, "backup=" + b.Name},
		Store:  store, Command: in.Block.Command}.Args()
	lbl := map[string]string{v1alpha1.LabelBackup: b.Name, v1alpha1.LabelComponent: "backup", "app.kubernetes.io/managed-by": managedBy}
	job := agentJob(b.Namespace, in.Name, lbl, in.Block.Image, in.Deadline, args, append(env, senv...), volumes, mounts)
	return withAgent(placedByValues(job, in.Block, func(p []string) (any, bool) {
		v, ok, _ := unstructured.NestedFieldNoCopy(in.Target.Object, append([]string{"spec"}, p...)...)
		return v, ok
	}), in.AgentImage, "backup")
}

// PostgresRestore is spec.restore of a Postgres.
type PostgresRestore struct {
	Target *v1alpha1.Postgres
	Store  v1alpha1.BackupStoreSpec
	// Name is the Job's; Location the backup's, with the SHA-256 and size
	// a Backup recorded (none for a bare location).
	Name, Location, SHA256 string
	Size                   int64
	// Key decrypts the backup (nil: not encrypted).
	Key      *v1alpha1.BackupEncryption
	Images   Images
	Deadline time.Duration
}

// Job downloads the backup (checked against the recorded SHA-256 and
// size) and restores its roles, then every database with its owner and
// grants (a backup from before backups were full: its one database into
// "postgres").
func (in PostgresRestore) Job() *batchv1.Job {
	pg := in.Target
	env := pgEnv(pg)
	if in.Key != nil {
		env = append(env, corev1.EnvVar{Name: agentargs.EnvAgeKey, ValueFrom: SecretKey(in.Key.KeySecretRef.Name, in.Key.KeySecretRef.Key)})
	}
	store, senv, volumes, mounts := StoreFlags(in.Store)
	args := agentargs.Backup{Sub: agentargs.Restore, Location: in.Location, ManifestFile: "/dev/termination-log", Store: store,
		ExpectSHA256: in.SHA256, ExpectSize: in.Size, Postgres: true}.Args()
	lbl := map[string]string{v1alpha1.LabelComponent: "restore", "app.kubernetes.io/managed-by": managedBy, v1alpha1.LabelRestore: pg.Name}
	job := agentJob(pg.Namespace, in.Name, lbl, postgresImage(in.Images.Postgres, pg), in.Deadline, args, append(env, senv...), volumes, mounts)
	return verifiesServer(pg, placedLike(pg, withAgent(job, in.Images.Agent, "backup")))
}

// PassthroughRestore restores a Backup into a passthrough kind's new
// release, before it is installed.
type PassthroughRestore struct {
	Target *unstructured.Unstructured
	Block  *watches.Backup
	Backup *v1alpha1.Backup
	Store  v1alpha1.BackupStoreSpec
	// Name is the Job's; Claim the data volume the restore command writes.
	Name, Claim string
	AgentImage  string
	Deadline    time.Duration
	// Values reads the release's values at a path (for placement).
	Values func(path []string) (any, bool)
}

// Job runs the block's restore command (in its image, else the backup
// image) with the agent reading the backup, checking its SHA-256 and
// piping it in, the claim mounted where the command expects it.
func (in PassthroughRestore) Job() *batchv1.Job {
	u, rs, b := in.Target, in.Block.Restore, in.Backup
	env := []corev1.EnvVar{
		{Name: "CHARTPILOT_TARGET_NAME", Value: u.GetName()},
		{Name: "CHARTPILOT_TARGET_NAMESPACE", Value: u.GetNamespace()},
	}
	// Not the backup command's env: it names the release's Secrets,
	// which do not exist before the install.
	store, senv, volumes, mounts := StoreFlags(in.Store)
	args := agentargs.Backup{Sub: agentargs.Restore, Location: b.Status.Location, ManifestFile: "/dev/termination-log", Store: store,
		ExpectSHA256: b.Status.SHA256, ExpectSize: b.Status.Size, Command: rs.Command}.Args()
	volumes = append(volumes, corev1.Volume{Name: "data", VolumeSource: corev1.VolumeSource{PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: in.Claim}}})
	mounts = append(mounts, corev1.VolumeMount{Name: "data", MountPath: rs.MountPath})
	image := rs.Image
	if image == "" {
		image = in.Block.Image
	}
	lbl := map[string]string{v1alpha1.LabelRestoreInto: u.GetName(), v1alpha1.LabelComponent: "restore", "app.kubernetes.io/managed-by": managedBy}
	job := agentJob(u.GetNamespace(), in.Name, lbl, image, in.Deadline, args, append(env, senv...), volumes, mounts)
	return withAgent(placedByValues(job, in.Block, in.Values), in.AgentImage, "backup")
}

// Drill is a restore drill of a Postgres's backup (spec.backup.verify).
type Drill struct {
	Backup   *v1alpha1.Backup
	Target   *v1alpha1.Postgres
	Store    v1alpha1.BackupStoreSpec
	Name     string
	Images   Images
	Deadline time.Duration
}

// Job restores the backup whole into a server of its own: the Postgres's
// server is not reached (no credential of it is in the Job), and nothing
// restored runs where the data lives. initdb needs a user the image
// knows: the official image's postgres user, as in the chart.
func (in Drill) Job() *batchv1.Job {
	b, pg := in.Backup, in.Target
	var env []corev1.EnvVar
	if e := pg.Spec.Backup; e != nil && e.Encryption != nil {
		env = append(env, corev1.EnvVar{Name: agentargs.EnvAgeKey, ValueFrom: SecretKey(e.Encryption.KeySecretRef.Name, e.Encryption.KeySecretRef.Key)})
	}
	store, senv, volumes, mounts := StoreFlags(in.Store)
	args := agentargs.Backup{Sub: agentargs.Verify, Location: b.Status.Location, ManifestFile: "/dev/termination-log", Store: store,
		ExpectSHA256: b.Status.SHA256, ExpectSize: b.Status.Size, Scratch: true}.Args()
	lbl := map[string]string{v1alpha1.LabelComponent: "verify", "app.kubernetes.io/managed-by": managedBy, v1alpha1.LabelBackup: b.Name}
	job := placedLike(pg, withAgent(agentJob(pg.Namespace, in.Name, lbl, postgresImage(in.Images.Postgres, pg), in.Deadline, args, append(env, senv...), volumes, mounts), in.Images.Agent, "backup"))
	pod := &job.Spec.Template.Spec
	pod.SecurityContext.RunAsUser, pod.SecurityContext.RunAsGroup, pod.SecurityContext.FSGroup = ptr.To[int64](999), ptr.To[int64](999), ptr.To[int64](999)
	// The server's data is no larger than the database: a volume of its
	// own, without the stage's bound.
	for i := range pod.Volumes {
		if pod.Volumes[i].Name == "stage" && pod.Volumes[i].EmptyDir != nil {
			pod.Volumes[i].EmptyDir.SizeLimit = nil
		}
	}
	return job
}

// MajorUpgrade moves a Postgres's data to a new PostgreSQL major.
type MajorUpgrade struct {
	Target *v1alpha1.Postgres
	// To is the new major; Claim the new data volume's claim.
	To, Name, Claim string
	// MarkMoved: failover is on, and pod 0's instance manager leads with
	// the moved data whichever member the Lease names.
	MarkMoved bool
	Images    Images
	Deadline  time.Duration
}

// Job runs `chartpilot major-upgrade` in the new major's image against
// the old server (the read-write Service, the superuser's password from
// its Secret), on the new claim mounted where the chart mounts the data,
// as the image's postgres user, who owns the data in the chart.
func (in MajorUpgrade) Job() *batchv1.Job {
	pg := in.Target
	lbl := map[string]string{v1alpha1.LabelMajorUpgrade: pg.Name, v1alpha1.LabelComponent: "major-upgrade", "app.kubernetes.io/managed-by": managedBy}
	args := append([]string{"major-upgrade"}, agentargs.MajorUpgrade{Bin: "/usr/lib/postgresql/" + in.To + "/bin",
		Data: "/var/lib/postgresql/data/pgdata", WorkDir: "/var/lib/postgresql/data/major-upgrade", Report: "/dev/termination-log",
		MarkMoved: in.MarkMoved}.Args()...)
	volumes := []corev1.Volume{
		{Name: "data", VolumeSource: corev1.VolumeSource{PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: in.Claim}}},
		{Name: "tmp", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}},
	}
	mounts := []corev1.VolumeMount{{Name: "data", MountPath: "/var/lib/postgresql/data"}, {Name: "tmp", MountPath: "/tmp"}}
	job := placedLike(pg, agentJob(pg.Namespace, in.Name, lbl, postgresImage(in.Images.Postgres, pg), in.Deadline, args, pgEnv(pg), volumes, mounts))
	pod := &job.Spec.Template.Spec
	pod.SecurityContext.RunAsUser, pod.SecurityContext.RunAsGroup, pod.SecurityContext.FSGroup = ptr.To[int64](999), ptr.To[int64](999), ptr.To[int64](999)
	main := &pod.Containers[0]
	main.Name = "major-upgrade"
	main.Resources.Limits[corev1.ResourceMemory] = resource.MustParse("1Gi")
	return verifiesServer(pg, withAgent(job, in.Images.Agent))
}
