package backup_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	"github.com/chartpilot/chartpilot/internal/api/v1alpha1"
	data "github.com/chartpilot/chartpilot/internal/backup"
	"github.com/chartpilot/chartpilot/internal/backup/backuptest"
	"github.com/chartpilot/chartpilot/internal/controller/backup"
	"github.com/chartpilot/chartpilot/internal/testing/testcluster"
	"github.com/chartpilot/chartpilot/internal/testing/testwait"
)

var cluster *testcluster.Cluster

// controller is a reconciler that sets itself up on a manager.
type controller interface {
	SetupWithManager(ctrl.Manager) error
}

// startControllers runs a manager on the test cluster with the
// controllers build makes from it, stopped when the test ends, and
// returns a client of the cluster.
func startControllers(t *testing.T, build func(mgr ctrl.Manager) []controller) (context.Context, client.Client) {
	t.Helper()
	mgr, err := ctrl.NewManager(cluster.Config, ctrl.Options{Scheme: testScheme(), Metrics: metricsserver.Options{BindAddress: "0"}})
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range build(mgr) {
		if err := r.SetupWithManager(mgr); err != nil {
			t.Fatal(err)
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	go func() { _ = mgr.Start(ctx) }()
	return ctx, directClient(t)
}

// testScheme knows the built-in kinds and chartpilot's.
func testScheme() *runtime.Scheme {
	scheme := runtime.NewScheme()
	_ = clientgoscheme.AddToScheme(scheme)
	_ = v1alpha1.AddToScheme(scheme)
	return scheme
}

// directClient is a client of the test cluster without a cache.
func directClient(t *testing.T) client.Client {
	t.Helper()
	c, err := client.New(cluster.Config, client.Options{Scheme: testScheme()})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func TestMain(m *testing.M) {
	ctrl.SetLogger(logr.Discard())
	code := testcluster.RunMain(m, testcluster.Options{Tier: testcluster.TierFull}, &cluster)
	if helper.dir != "" {
		os.RemoveAll(helper.dir)
	}
	os.Exit(code)
}

// helper is the store helper of the package's controllers: chartpilot
// built once, run as a process for every check of a store, as the manager
// runs it.
var helper struct {
	once sync.Once
	dir  string
	path string
	err  error
}

func storeHelper(t *testing.T) *data.StoreHelper {
	t.Helper()
	helper.once.Do(func() {
		if helper.dir, helper.err = os.MkdirTemp("", "store-helper-"); helper.err != nil {
			return
		}
		helper.path = filepath.Join(helper.dir, "chartpilot")
		if out, err := exec.Command("go", "build", "-o", helper.path, "../../../cmd/chartpilot").CombinedOutput(); err != nil {
			helper.err = fmt.Errorf("building the store helper: %v\n%s", err, out)
		}
	})
	if helper.err != nil {
		t.Fatal(helper.err)
	}
	return data.NewStoreHelper(helper.path)
}

// TestStoresChecked: BackupStores and ClusterBackupStores against a real
// S3 server (versitygw): Ready when a probe object is written, read back
// and deleted; a wrong secret, a missing Secret, an endpoint the operator
// does not allow namespaced stores, and a missing claim each say what is
// wrong (never the secret); admission refuses both kinds of store at once
// and a namespaced store reading another namespace's Secret.
func TestStoresChecked(t *testing.T) {
	cluster.Skip(t)
	s3 := backuptest.StartS3(t, t.TempDir())
	ns := cluster.Namespace(t)
	ctx, c := startControllers(t, func(mgr ctrl.Manager) []controller {
		var out []controller
		for _, clusterWide := range []bool{false, true} {
			out = append(out, &backup.StoreReconciler{Deps: backup.Deps{Client: mgr.GetClient(), Reader: mgr.GetAPIReader(), Recorder: mgr.GetEventRecorderFor("test"), Stores: storeHelper(t),
				Endpoints: []string{"http://127.0.0.1:*"}, SkipNameValidation: true}, Cluster: clusterWide})
		}
		return out
	})
	mustCreate := func(o client.Object) {
		t.Helper()
		if err := c.Create(ctx, o); err != nil {
			t.Fatalf("creating %s: %v", o.GetName(), err)
		}
	}
	secret := func(name, key, secretKey string) {
		mustCreate(&corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}, Data: map[string][]byte{"accessKeyID": []byte(key), "secretAccessKey": []byte(secretKey)}})
	}
	secret("good", s3.AccessKeyID, s3.SecretAccessKey)
	secret("bad", s3.AccessKeyID, "wrong-secret-key-never-shown")
	store := func(name, endpoint, secretName string) *v1alpha1.BackupStore {
		return &v1alpha1.BackupStore{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}, Spec: v1alpha1.BackupStoreSpec{S3: &v1alpha1.S3Store{
			Endpoint: endpoint, Bucket: s3.Bucket, Prefix: "probe-test", ForcePathStyle: true, CredentialsSecretRef: v1alpha1.SecretRef{Name: secretName}}}}
	}
	az := backuptest.StartAzure(t, t.TempDir())
	mustCreate(&corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "azure"}, Data: map[string][]byte{"accountKey": []byte(az.AccountKey)}})
	mustCreate(&corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "azure-wrong"}, Data: map[string][]byte{"accountKey": []byte("d3Jvbmcta2V5LW5ldmVyLXNob3du")}})
	azureStore := func(name, secretName string) *v1alpha1.BackupStore {
		return &v1alpha1.BackupStore{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}, Spec: v1alpha1.BackupStoreSpec{Azure: &v1alpha1.AzureStore{
			Endpoint: az.Endpoint, AccountName: az.AccountName, Container: az.Container, Prefix: "probe-test", CredentialsSecretRef: v1alpha1.SecretRef{Name: secretName}}}}
	}
	gcs := backuptest.StartGCS(t)
	mustCreate(&corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "gcs-no-key"}, Data: map[string][]byte{"other": []byte("x")}})
	gcsStore := func(name string, ref *v1alpha1.SecretRef) *v1alpha1.BackupStore {
		return &v1alpha1.BackupStore{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}, Spec: v1alpha1.BackupStoreSpec{GCS: &v1alpha1.GCSStore{
			Endpoint: gcs.Endpoint, Bucket: gcs.Bucket, Prefix: "probe-test", CredentialsSecretRef: ref}}}
	}
	mustCreate(gcsStore("gcs", nil))
	mustCreate(gcsStore("gcs-no-key", &v1alpha1.SecretRef{Name: "gcs-no-key"}))
	mustCreate(azureStore("azure", "azure"))
	mustCreate(azureStore("azure-wrong-key", "azure-wrong"))
	mustCreate(store("good", s3.Endpoint, "good"))
	mustCreate(store("wrong-secret", s3.Endpoint, "bad"))
	mustCreate(store("no-secret", s3.Endpoint, "absent"))
	mustCreate(store("not-allowed", "https://169.254.169.254", "good"))
	mustCreate(&v1alpha1.BackupStore{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "no-claim"}, Spec: v1alpha1.BackupStoreSpec{Volume: &v1alpha1.VolumeStore{ClaimName: "backups"}}})
	cs := &v1alpha1.ClusterBackupStore{ObjectMeta: metav1.ObjectMeta{Name: ns + "-shared"}, Spec: v1alpha1.ClusterBackupStoreSpec{S3: &v1alpha1.S3Store{
		Endpoint: s3.Endpoint, Bucket: s3.Bucket, ForcePathStyle: true, CredentialsSecretRef: v1alpha1.SecretRef{Name: "good", Namespace: ns}}}}
	mustCreate(cs)
	t.Cleanup(func() { _ = c.Delete(context.Background(), cs) })

	wait := func(obj client.Object, conds func() []metav1.Condition, status metav1.ConditionStatus, reason string) string {
		t.Helper()
		var last *metav1.Condition
		if testwait.Until(2*time.Minute, 200*time.Millisecond, func() bool {
			if err := c.Get(ctx, client.ObjectKeyFromObject(obj), obj); err != nil {
				return false
			}
			last = apimeta.FindStatusCondition(conds(), v1alpha1.ConditionReady)
			return last != nil && last.Status == status && last.Reason == reason
		}) {
			return last.Message
		}
		t.Fatalf("%s: Ready never %s/%s; last %+v", obj.GetName(), status, reason, last)
		return ""
	}
	for _, tc := range []struct {
		name, reason, want string
		status             metav1.ConditionStatus
	}{
		{"good", "Checked", "read back and deleted", metav1.ConditionTrue},
		{"azure", "Checked", "written to container backups, read back and deleted", metav1.ConditionTrue},
		{"azure-wrong-key", "ProbeFailed", "write", metav1.ConditionFalse},
		{"gcs", "Checked", "written to bucket backups, read back and deleted", metav1.ConditionTrue},
		{"gcs-no-key", "CredentialsIncomplete", "spec.gcs.credentialsSecretRef: Secret " + ns + "/gcs-no-key needs key serviceAccountKey", metav1.ConditionFalse},
		{"wrong-secret", "ProbeFailed", "write", metav1.ConditionFalse},
		{"no-secret", "CredentialsNotFound", "spec.s3.credentialsSecretRef: Secret " + ns + "/absent does not exist", metav1.ConditionFalse},
		{"not-allowed", "EndpointNotAllowed", "--backup-store-endpoints: http://127.0.0.1:*", metav1.ConditionFalse},
		{"no-claim", "ClaimNotFound", "spec.volume.claimName", metav1.ConditionFalse},
	} {
		s := &v1alpha1.BackupStore{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: tc.name}}
		msg := wait(s, func() []metav1.Condition { return s.Status.Conditions }, tc.status, tc.reason)
		if !strings.Contains(msg, tc.want) {
			t.Errorf("%s: message %q does not say %q", tc.name, msg, tc.want)
		}
		for _, secret := range []string{s3.SecretAccessKey, "wrong-secret-key-never-shown", az.AccountKey, "d3Jvbmcta2V5LW5ldmVyLXNob3du"} {
			if strings.Contains(msg, secret) {
				t.Errorf("%s: the message shows a secret", tc.name)
			}
		}
	}
	wait(cs, func() []metav1.Condition { return cs.Status.Conditions }, metav1.ConditionTrue, "Checked")

	// The claim created after its store is seen within ClaimRecheck, not
	// at the next Recheck.
	mustCreate(&corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "backups"}, Spec: corev1.PersistentVolumeClaimSpec{
		AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
		Resources:   corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Gi")}}}})
	late := &v1alpha1.BackupStore{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "no-claim"}}
	if msg := wait(late, func() []metav1.Condition { return late.Status.Conditions }, metav1.ConditionTrue, "Checked"); !strings.Contains(msg, "is bound") {
		t.Errorf("no-claim after its claim came: %q", msg)
	}

	// Refused at admission.
	both := store("both", s3.Endpoint, "good")
	both.Spec.Volume = &v1alpha1.VolumeStore{ClaimName: "x"}
	if err := c.Create(ctx, both); err == nil || !strings.Contains(err.Error(), "set exactly one of s3, gcs, azure or volume") {
		t.Errorf("a store with s3 and volume: %v", err)
	}
	googleNoKey := &v1alpha1.BackupStore{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "gcs-google-no-key"}, Spec: v1alpha1.BackupStoreSpec{GCS: &v1alpha1.GCSStore{Bucket: "backups"}}}
	if err := c.Create(ctx, googleNoKey); err == nil || !strings.Contains(err.Error(), "set credentialsSecretRef") {
		t.Errorf("a GCS store of Google's without credentials: %v", err)
	}
	other := store("other-namespace", s3.Endpoint, "good")
	other.Spec.S3.CredentialsSecretRef.Namespace = "kube-system"
	if err := c.Create(ctx, other); err == nil || !strings.Contains(err.Error(), "reads Secrets of its own namespace only") {
		t.Errorf("a namespaced store naming another namespace's Secret: %v", err)
	}
	noNS := &v1alpha1.ClusterBackupStore{ObjectMeta: metav1.ObjectMeta{Name: ns + "-nons"}, Spec: v1alpha1.ClusterBackupStoreSpec{S3: &v1alpha1.S3Store{
		Bucket: s3.Bucket, CredentialsSecretRef: v1alpha1.SecretRef{Name: "good"}}}}
	if err := c.Create(ctx, noNS); err == nil || !strings.Contains(err.Error(), "names the namespace of its Secrets") {
		t.Errorf("a cluster store without the Secret's namespace: %v", err)
	}
}

// TestHostileGCSKeyReachesNothing: a tenant's GCS key that would make the
// store helper read local files (the manager's ServiceAccount token) or
// call URLs of the tenant's choosing is refused by its shape, naming the
// field; nothing reaches the tenant's listener. A service account key
// whose token_uri is not Google's nor an allowed endpoint is refused the
// same way.
func TestHostileGCSKeyReachesNothing(t *testing.T) {
	cluster.Skip(t)
	var hits atomic.Int64
	listener := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hits.Add(1)
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{"access_token":"x","token_type":"Bearer","expires_in":3600,"id_token":"y"}`))
	}))
	t.Cleanup(listener.Close)
	gcs := backuptest.StartGCS(t)
	ns := cluster.Namespace(t)
	ctx, c := startControllers(t, func(mgr ctrl.Manager) []controller {
		return []controller{&backup.StoreReconciler{Deps: backup.Deps{Client: mgr.GetClient(), Reader: mgr.GetAPIReader(), Recorder: mgr.GetEventRecorderFor("test"), Stores: storeHelper(t),
			Endpoints: []string{gcs.Endpoint}, SkipNameValidation: true}}}
	})
	tokenFile := "/var/run/secrets/kubernetes.io/serviceaccount/token"
	if f, err := os.CreateTemp("", "sa-token"); err == nil {
		_, _ = f.WriteString("manager-token-never-sent")
		_ = f.Close()
		tokenFile = f.Name()
		t.Cleanup(func() { os.Remove(f.Name()) })
	}
	keys := map[string]string{
		"file": fmt.Sprintf(`{"type":"external_account","audience":"//iam.googleapis.com/projects/1/locations/global/workloadIdentityPools/p/providers/k",`+
			`"subject_token_type":"urn:ietf:params:oauth:token-type:jwt","token_url":%q,"credential_source":{"file":%q}}`, listener.URL+"/token", tokenFile),
		"url": fmt.Sprintf(`{"type":"external_account","audience":"//iam.googleapis.com/x","subject_token_type":"urn:ietf:params:oauth:token-type:jwt",`+
			`"token_url":%q,"credential_source":{"url":%q,"headers":{"Metadata-Flavor":"Google"}}}`, listener.URL+"/token", listener.URL+"/subject"),
		"impersonated": fmt.Sprintf(`{"type":"impersonated_service_account","service_account_impersonation_url":%q,`+
			`"source_credentials":{"type":"external_account","audience":"x","subject_token_type":"jwt","token_url":%q,"credential_source":{"url":%q}}}`,
			listener.URL+"/impersonate", listener.URL+"/token", listener.URL+"/subject"),
		"token-uri": serviceAccountKey(t, listener.URL+"/token"),
	}
	for name, key := range keys {
		if err := c.Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}, Data: map[string][]byte{"serviceAccountKey": []byte(key)}}); err != nil {
			t.Fatal(err)
		}
		if err := c.Create(ctx, &v1alpha1.BackupStore{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}, Spec: v1alpha1.BackupStoreSpec{GCS: &v1alpha1.GCSStore{
			Endpoint: gcs.Endpoint, Bucket: gcs.Bucket, CredentialsSecretRef: &v1alpha1.SecretRef{Name: name}}}}); err != nil {
			t.Fatal(err)
		}
	}
	want := map[string]string{
		"file": `field type is "external_account"`, "url": `field type is "external_account"`,
		"impersonated": `field type is "impersonated_service_account"`, "token-uri": "token_uri",
	}
	for name := range keys {
		s := &v1alpha1.BackupStore{}
		var last *metav1.Condition
		testwait.Until(2*time.Minute, 200*time.Millisecond, func() bool {
			if err := c.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, s); err == nil {
				last = apimeta.FindStatusCondition(s.Status.Conditions, v1alpha1.ConditionReady)
			}
			return last != nil
		})
		if last == nil || last.Status != metav1.ConditionFalse || last.Reason != "InvalidCredentials" || !strings.Contains(last.Message, want[name]) ||
			!strings.Contains(last.Message, "spec.gcs.credentialsSecretRef") {
			t.Errorf("%s: Ready %+v, want False InvalidCredentials saying %q", name, last, want[name])
		}
		if last != nil && (strings.Contains(last.Message, "manager-token-never-sent") || strings.Contains(last.Message, "PRIVATE KEY")) {
			t.Errorf("%s: the message shows a secret", name)
		}
	}
	if n := hits.Load(); n != 0 {
		t.Fatalf("the tenant's listener was reached %d times", n)
	}
}

// serviceAccountKey is a service account's key with tokenURI as its
// token endpoint.
func serviceAccountKey(t *testing.T, tokenURI string) string {
	t.Helper()
	return backuptest.ServiceAccountKey(t, func(k map[string]any) { k["token_uri"] = tokenURI })
}
