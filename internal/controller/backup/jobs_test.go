package backup

import (
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/chartpilot/chartpilot/internal/api/v1alpha1"
)

func testBackup(name, uid string) *v1alpha1.Backup {
	return &v1alpha1.Backup{
		ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: name, UID: types.UID(uid + "0000-1111-2222-3333"),
			CreationTimestamp: metav1.NewTime(time.Date(2026, 12, 3, 2, 0, 0, 0, time.UTC))},
		Spec: v1alpha1.BackupSpec{Target: v1alpha1.BackupTarget{Kind: "Postgres", Name: "orders"}},
	}
}

func testPostgres() *v1alpha1.Postgres {
	pg := &v1alpha1.Postgres{ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "orders"}}
	pg.Spec.Version = "15"
	pg.Spec.NodeSelector = map[string]string{"pool": "databases"}
	pg.Spec.Tolerations = []corev1.Toleration{{Key: "databases", Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoSchedule}}
	pg.Spec.Backup = &v1alpha1.PostgresBackup{Compression: "zstd",
		Encryption: &v1alpha1.BackupEncryption{KeySecretRef: v1alpha1.LocalSecretKeyRef{Name: "orders-age", Key: "identity"}}}
	pg.Status.Endpoints = &v1alpha1.PostgresEndpoints{ReadWrite: "orders-rw", Secret: "orders-auth", Port: 6432}
	return pg
}

func s3Store() *resolvedStore {
	return &resolvedStore{spec: v1alpha1.BackupStoreSpec{S3: &v1alpha1.S3Store{
		Bucket: "backups", Endpoint: "https://s3.example.test", Region: "eu-1", ForcePathStyle: true,
		CredentialsSecretRef: v1alpha1.SecretRef{Name: "s3-creds"},
		CASecretRef:          &v1alpha1.SecretKeyRef{Name: "s3-ca", Key: "ca.crt"},
	}}, secretNS: "shop"}
}

func envOf(c corev1.Container, name string) *corev1.EnvVar {
	for i := range c.Env {
		if c.Env[i].Name == name {
			return &c.Env[i]
		}
	}
	return nil
}

// flagValue is the value after flag in args ("" when absent).
func flagValue(args []string, flag string) string {
	if i := slices.Index(args, flag); i >= 0 && i+1 < len(args) {
		return args[i+1]
	}
	return ""
}

// A Postgres backup's Job: the database's own image runs the agent that
// an init container of chartpilot's image put in place; one try, bounded;
// no API token, not root, nothing writable but its volumes; the secrets
// (password, store credentials, encryption key) only as references to
// Secrets, never as values; placed where the database may run.
func TestPostgresBackupJob(t *testing.T) {
	r := &BackupReconciler{Deps: Deps{Image: "chartpilot:test", PostgresImage: "debian/postgresql", Deadline: 2 * time.Hour}}
	b := testBackup("nightly", "ab12")
	job := r.job(b, testPostgres(), s3Store(), Location(b))

	if job.Name != JobName(b) || job.Namespace != "shop" {
		t.Errorf("Job %s/%s, want shop/%s", job.Namespace, job.Name, JobName(b))
	}
	for _, l := range []map[string]string{job.Labels, job.Spec.Template.Labels} {
		if l[v1alpha1.LabelBackup] != "nightly" || l[v1alpha1.LabelComponent] != "backup" {
			t.Errorf("labels %v, want the Backup and component backup", l)
		}
	}
	if *job.Spec.BackoffLimit != 0 || *job.Spec.ActiveDeadlineSeconds != 7200 {
		t.Errorf("backoffLimit %d, activeDeadlineSeconds %d; want one try within 2h", *job.Spec.BackoffLimit, *job.Spec.ActiveDeadlineSeconds)
	}
	pod := job.Spec.Template.Spec
	if pod.AutomountServiceAccountToken == nil || *pod.AutomountServiceAccountToken || pod.RestartPolicy != corev1.RestartPolicyNever {
		t.Errorf("pod: token %v, restart %s", pod.AutomountServiceAccountToken, pod.RestartPolicy)
	}
	if sc := pod.SecurityContext; !*sc.RunAsNonRoot || *sc.RunAsUser == 0 || sc.SeccompProfile.Type != corev1.SeccompProfileTypeRuntimeDefault {
		t.Errorf("pod security context %+v", sc)
	}
	if pod.NodeSelector["pool"] != "databases" || len(pod.Tolerations) != 1 || pod.Tolerations[0].Key != "databases" {
		t.Errorf("placement: nodeSelector %v, tolerations %v; want the database's", pod.NodeSelector, pod.Tolerations)
	}
	if len(pod.Containers) != 1 || len(pod.InitContainers) != 1 {
		t.Fatalf("%d containers, %d init containers", len(pod.Containers), len(pod.InitContainers))
	}
	main, agent := pod.Containers[0], pod.InitContainers[0]
	if main.Image != "debian/postgresql:15" || agent.Image != "chartpilot:test" {
		t.Errorf("images: main %s, agent %s", main.Image, agent.Image)
	}
	if strings.Join(main.Command, " ") != AgentDir+"/chartpilot backup" {
		t.Errorf("main command %q", main.Command)
	}
	for _, c := range []corev1.Container{main, agent} {
		sc := c.SecurityContext
		if sc == nil || *sc.AllowPrivilegeEscalation || !*sc.ReadOnlyRootFilesystem || len(sc.Capabilities.Drop) != 1 || sc.Capabilities.Drop[0] != "ALL" {
			t.Errorf("%s: security context %+v", c.Name, sc)
		}
	}
	args := main.Args
	if flagValue(args, "--location") != Location(b) || flagValue(args, "--compression") != "zstd" || flagValue(args, "--store") != "s3" ||
		flagValue(args, "--s3-bucket") != "backups" || flagValue(args, "--s3-ca-file") != "/etc/chartpilot/ca/ca.pem" || !slices.Contains(args, "--s3-force-path-style") {
		t.Errorf("agent args %q", args)
	}
	if !slices.Contains(args, "--postgres") || slices.Contains(args, "--") {
		t.Errorf("the agent does not back up the whole server (--postgres, no command): %q", args)
	}
	if e := envOf(main, "PGHOST"); e == nil || e.Value != "orders-rw" {
		t.Errorf("PGHOST = %+v, want the primary's Service", e)
	}
	if e := envOf(main, "PGPORT"); e == nil || e.Value != "6432" {
		t.Errorf("PGPORT = %+v, want the Service's port", e)
	}
	for name, ref := range map[string][2]string{
		"PGUSER": {"orders-auth", "username"}, "PGPASSWORD": {"orders-auth", "password"},
		"CHARTPILOT_AGE_KEY":              {"orders-age", "identity"},
		"CHARTPILOT_S3_ACCESS_KEY_ID":     {"s3-creds", "accessKeyID"},
		"CHARTPILOT_S3_SECRET_ACCESS_KEY": {"s3-creds", "secretAccessKey"},
	} {
		e := envOf(main, name)
		if e == nil || e.Value != "" || e.ValueFrom == nil || e.ValueFrom.SecretKeyRef == nil ||
			e.ValueFrom.SecretKeyRef.Name != ref[0] || e.ValueFrom.SecretKeyRef.Key != ref[1] {
			t.Errorf("%s = %+v, want only a reference to Secret %s key %s", name, e, ref[0], ref[1])
		}
	}
	mounts := map[string]string{}
	for _, m := range main.VolumeMounts {
		mounts[m.Name] = m.MountPath
	}
	if mounts["tmp"] != "/tmp" || mounts["ca"] != "/etc/chartpilot/ca" || mounts["agent"] != AgentDir {
		t.Errorf("mounts %v", mounts)
	}
}

// Retention flags go only to a scheduled Backup's Job (retention prunes
// the scheduled series), and a scheduled Backup has its own series.
func TestRetentionOnlyForScheduledBackups(t *testing.T) {
	r := &BackupReconciler{Deps: Deps{Image: "chartpilot:test", Deadline: time.Hour}}
	pg := testPostgres()
	pg.Spec.Backup.Retention = &v1alpha1.BackupRetention{Count: 7, MaxAge: &metav1.Duration{Duration: 30 * 24 * time.Hour}}
	onDemand := testBackup("now", "cd34")
	sched := testBackup("nightly-20261203", "ef56")
	sched.Labels = map[string]string{v1alpha1.LabelScheduledBy: "orders"}
	if !scheduled(sched) || scheduled(onDemand) {
		t.Fatalf("scheduled: %v / %v", scheduled(sched), scheduled(onDemand))
	}
	on := r.job(onDemand, pg, s3Store(), Location(onDemand)).Spec.Template.Spec.Containers[0].Args
	if slices.Contains(on, "--keep-count") || slices.Contains(on, "--keep-max-age") {
		t.Errorf("an on-demand Backup prunes: %q", on)
	}
	sc := r.job(sched, pg, s3Store(), Location(sched)).Spec.Template.Spec.Containers[0].Args
	if flagValue(sc, "--keep-count") != "7" || flagValue(sc, "--keep-max-age") != "720h0m0s" {
		t.Errorf("a scheduled Backup's retention flags: %q", sc)
	}
	if !strings.Contains(Location(sched), "/postgres/orders/scheduled/") || strings.Contains(Location(onDemand), "scheduled") {
		t.Errorf("series: scheduled %s, on demand %s", Location(sched), Location(onDemand))
	}
}

// No two Backups share a location or a Job name, whatever their names.
func TestLocationsAndJobNamesAreOwn(t *testing.T) {
	long := strings.Repeat("a", 60)
	seen := map[string]string{}
	for _, b := range []*v1alpha1.Backup{testBackup("daily", "0001"), testBackup("daily", "0002"), testBackup("daily2", "0001"), testBackup(long, "0003"), testBackup(long+"b", "0003")} {
		for _, key := range []string{"location " + Location(b), "job " + JobName(b)} {
			if other, dup := seen[key]; dup {
				t.Errorf("%s and %s/%s share %s", other, b.Name, b.UID, key)
			}
			seen[key] = b.Name + "/" + string(b.UID)
		}
		if n := JobName(b); len(n) > 63 || !strings.HasPrefix(n, "backup-") {
			t.Errorf("Job name %q (%d characters)", n, len(n))
		}
	}
}
