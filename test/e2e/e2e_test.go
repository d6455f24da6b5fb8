// Package e2e runs chartpilot with the repository's watches.yaml, charts and
// CRDs on the full local cluster (controllers, scheduler, kwok nodes and a
// volume provisioner), as a user would.
package e2e

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"

	"github.com/chartpilot/chartpilot/internal/api/v1alpha1"
	"github.com/chartpilot/chartpilot/internal/operator"
	"github.com/chartpilot/chartpilot/internal/rbac"
	"github.com/chartpilot/chartpilot/internal/testing/testcluster"
	"github.com/chartpilot/chartpilot/internal/testing/testwait"
	"github.com/chartpilot/chartpilot/internal/watches"
)

var cluster *testcluster.Cluster

var (
	postgresGVR = schema.GroupVersionResource{Group: "chartpilot.dev", Version: "v1alpha1", Resource: "postgres"}
	redisGVR    = schema.GroupVersionResource{Group: "chartpilot.dev", Version: "v1alpha1", Resource: "redis"}
)

func TestMain(m *testing.M) {
	if kc := os.Getenv(operatorProcessEnv); kc != "" {
		ctrl.SetLogger(zap.New(zap.WriteTo(os.Stderr)))
		os.Exit(runOperatorProcess(kc))
	}
	f, err := os.CreateTemp("", "chartpilot-e2e-*.log")
	if err == nil {
		fmt.Fprintf(os.Stderr, "operator logs: %s\n", f.Name())
		ctrl.SetLogger(zap.New(zap.WriteTo(f)))
	}
	os.Exit(testcluster.RunMain(m, testcluster.Options{
		Tier:    testcluster.TierFull,
		CRDDirs: crdPaths,
		// The webhook configuration of config/webhook, pointed by envtest at
		// the test process, with certificates envtest makes.
		WebhookInstallOptions: envtest.WebhookInstallOptions{Paths: []string{filepath.Join("..", "..", "config", "webhook", "manifests.yaml")}},
		// An API version a later minor removes, served (TestRemovedAPIVersions).
		RuntimeConfig: removableAPIs[testcluster.KubernetesMinor()].runtimeConfig,
	}, &cluster))
}

// crdPaths are the CRDs of the repository's kinds and of the test chart in
// the style of public charts (test/charts/publicdb).
var crdPaths = []string{
	filepath.Join("..", "..", "config", "crd", "bases"),
	filepath.Join("..", "..", "config", "crd", "passthrough"),
	filepath.Join("..", "..", "test", "crds", "publicdbs.yaml"),
}

// publicdbWatch is the passthrough kind of test/charts/publicdb.
const publicdbWatch = "- {group: test.chartpilot.dev, version: v1alpha1, kind: Publicdb, chart: ../../test/charts/publicdb, healthTimeout: 3m}\n"

// e2eWatches are the repository's watches.yaml and the test chart's kind.
func e2eWatches() ([]watches.Watch, error) {
	ws, err := watches.Load(filepath.Join("..", "..", "watches.yaml"))
	if err != nil {
		return nil, err
	}
	extra, err := watches.Parse([]byte(publicdbWatch), ".", os.LookupEnv)
	if err != nil {
		return nil, err
	}
	return append(ws, extra...), nil
}

type env struct {
	t   *testing.T
	ns  string
	dyn dynamic.Interface
	cs  kubernetes.Interface
	// stop stops the test's operator (and its webhook server) before the test ends.
	stop func()
	// deployer is the namespace's deployer ServiceAccount (lockdown).
	deployer string
}

// setup starts an operator with the repository's watches.yaml for the test.
func setup(t *testing.T, opts ...func(*operator.Options)) *env {
	t.Helper()
	ns := cluster.Namespace(t)
	dyn, err := dynamic.NewForConfig(cluster.Config)
	if err != nil {
		t.Fatal(err)
	}
	cs, err := kubernetes.NewForConfig(cluster.Config)
	if err != nil {
		t.Fatal(err)
	}
	// The manager's ServiceAccount and the deployers' ClusterRole first.
	if _, err := managerConfig(); err != nil {
		t.Fatalf("the manager's ServiceAccount: %v", err)
	}
	e := &env{t: t, ns: ns, dyn: dyn, cs: cs}
	e.deployer = createIdentity(t, ns)
	e.startOperator(opts...)
	return e
}

// startOperator starts an operator for the test (after e.stop, another
// one): the repository's watches.yaml unless opts say otherwise.
func (e *env) startOperator(opts ...func(*operator.Options)) {
	t := e.t
	t.Helper()
	ws, err := e2eWatches()
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := managerConfig()
	if err != nil {
		t.Fatalf("the manager's ServiceAccount: %v", err)
	}
	wh := cluster.Env.WebhookInstallOptions
	o := operator.Options{
		Config: cfg, Watches: ws, MetricsAddr: "0", ProbeAddr: "0", SeveralInProcess: true, DefaultServiceAccount: e.deployer,
		LeaderElectionNamespace: managerNamespace,
		Webhook:                 &operator.WebhookOptions{Host: wh.LocalServingHost, Port: wh.LocalServingPort, CertDir: wh.LocalServingCertDir},
	}
	for _, f := range opts {
		f(&o)
	}
	mgr, err := operator.New(o)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- mgr.Start(ctx) }()
	var stopOnce sync.Once
	stop := func() {
		stopOnce.Do(func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("operator: %v", err)
			}
		})
	}
	t.Cleanup(stop)
	e.stop = stop
	waitWebhook(t)
}

// createIdentity makes the test namespace's deployer as `chartpilot identity
// create -n NS` does, and returns its name.
func createIdentity(t *testing.T, ns string) string {
	t.Helper()
	in, err := defaultInstall()
	if err != nil {
		t.Fatal(err)
	}
	cs, err := kubernetes.NewForConfig(cluster.Config)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := rbac.CreateDeployer(context.Background(), cs, ns, in.defaultServiceAccount, rbac.DefaultDeployer); err != nil {
		t.Fatalf("the deployer of %s: %v", ns, err)
	}
	return in.defaultServiceAccount
}

// waitWebhook waits until an operator serves the webhook: its
// failurePolicy is Fail, so the first create would race the server's start.
func waitWebhook(t *testing.T) {
	t.Helper()
	wh := cluster.Env.WebhookInstallOptions
	addr := net.JoinHostPort(wh.LocalServingHost, strconv.Itoa(wh.LocalServingPort))
	if err := wait.PollUntilContextTimeout(context.Background(), 100*time.Millisecond, time.Minute, true, func(context.Context) (bool, error) {
		conn, err := net.DialTimeout("tcp", addr, time.Second)
		if err != nil {
			return false, nil
		}
		_ = conn.Close()
		return true, nil
	}); err != nil {
		t.Fatalf("the webhook server at %s did not start: %v", addr, err)
	}
}

func (e *env) apply(gvr schema.GroupVersionResource, kind, name string, spec map[string]any) {
	e.t.Helper()
	u := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "chartpilot.dev/v1alpha1", "kind": kind,
		"metadata": map[string]any{"name": name, "namespace": e.ns},
		"spec":     spec,
	}}
	if _, err := e.dyn.Resource(gvr).Namespace(e.ns).Create(context.Background(), u, metav1.CreateOptions{}); err != nil {
		e.t.Fatalf("creating %s %s: %v", kind, name, err)
	}
}

func (e *env) patch(gvr schema.GroupVersionResource, name, body string) error {
	_, err := e.dyn.Resource(gvr).Namespace(e.ns).Patch(context.Background(), name, types.MergePatchType, []byte(body), metav1.PatchOptions{})
	return err
}

func (e *env) get(gvr schema.GroupVersionResource, name string) *unstructured.Unstructured {
	e.t.Helper()
	u, err := e.dyn.Resource(gvr).Namespace(e.ns).Get(context.Background(), name, metav1.GetOptions{})
	if err != nil {
		e.t.Fatal(err)
	}
	return u
}

// holds reports whether cond stays true, looked at every 250 ms for d
// (the room a wrong action is given to show), and what it saw last: it
// ends at the first look that finds cond false.
func (e *env) holds(d time.Duration, cond func() (bool, string)) (bool, string) {
	return testwait.HoldsSaying(d, 250*time.Millisecond, cond)
}

func (e *env) waitFor(what string, timeout time.Duration, cond func() (bool, string)) {
	e.t.Helper()
	var last string
	err := wait.PollUntilContextTimeout(context.Background(), 250*time.Millisecond, timeout, true, func(context.Context) (bool, error) {
		ok, obs := cond()
		last = obs
		return ok, nil
	})
	if err != nil {
		e.t.Fatalf("waiting for %s: %v; last seen: %s (logs in %s)", what, err, last, cluster.LogDir)
	}
}

func ready(u *unstructured.Unstructured) (bool, string) {
	st := &v1alpha1.ReleaseStatus{}
	if raw, ok := u.Object["status"].(map[string]any); ok {
		_ = runtime.DefaultUnstructuredConverter.FromUnstructured(raw, st)
	}
	c := apimeta.FindStatusCondition(st.Conditions, v1alpha1.ConditionReady)
	if c == nil {
		return false, "no Ready condition"
	}
	return c.Status == metav1.ConditionTrue && c.ObservedGeneration == u.GetGeneration(), fmt.Sprintf("Ready=%s %s: %s", c.Status, c.Reason, c.Message)
}

func (e *env) pvcs(selector string) []corev1.PersistentVolumeClaim {
	e.t.Helper()
	list, err := e.cs.CoreV1().PersistentVolumeClaims(e.ns).List(context.Background(), metav1.ListOptions{LabelSelector: selector})
	if err != nil {
		e.t.Fatal(err)
	}
	return list.Items
}

func (e *env) password(secret string) string {
	e.t.Helper()
	s, err := e.cs.CoreV1().Secrets(e.ns).Get(context.Background(), secret, metav1.GetOptions{})
	if err != nil {
		e.t.Fatal(err)
	}
	return string(s.Data["password"])
}

func TestPostgresLifecycle(t *testing.T) {
	e := setup(t)
	ctx := context.Background()
	e.apply(postgresGVR, "Postgres", "db", map[string]any{
		"version": "17",
		"storage": map[string]any{"size": "1Gi"},
		"resources": map[string]any{
			"limits": map[string]any{"cpu": "1", "memory": "1Gi"},
		},
		"parameters": map[string]any{"log_min_duration_statement": "500"},
	})
	e.waitFor("Postgres db Ready with 1 ready replica", 3*time.Minute, func() (bool, string) {
		u := e.get(postgresGVR, "db")
		ok, obs := ready(u)
		rr, _, _ := unstructured.NestedInt64(u.Object, "status", "readyReplicas")
		return ok && rr == 1, fmt.Sprintf("%s readyReplicas=%d", obs, rr)
	})
	u := e.get(postgresGVR, "db")
	if rw, _, _ := unstructured.NestedString(u.Object, "status", "endpoints", "readWrite"); rw != "db" {
		t.Errorf("status.endpoints.readWrite = %q", rw)
	}
	if ro, _, _ := unstructured.NestedString(u.Object, "status", "endpoints", "readOnly"); ro != "db-ro" {
		t.Errorf("status.endpoints.readOnly = %q", ro)
	}
	if sb, _, _ := unstructured.NestedString(u.Object, "status", "tuning", "shared_buffers"); sb != "256MB" {
		t.Errorf("status.tuning.shared_buffers = %q, want 256MB for 1Gi", sb)
	}
	for _, svc := range []string{"db", "db-ro", "db-headless"} {
		if _, err := e.cs.CoreV1().Services(e.ns).Get(ctx, svc, metav1.GetOptions{}); err != nil {
			t.Errorf("Service %s: %v", svc, err)
		}
	}
	cm, err := e.cs.CoreV1().ConfigMaps(e.ns).Get(ctx, "db-config", metav1.GetOptions{})
	if err != nil || !strings.Contains(cm.Data["postgresql.conf"], "shared_buffers = '256MB'") || !strings.Contains(cm.Data["postgresql.conf"], "log_min_duration_statement = '500'") {
		t.Errorf("postgresql.conf lacks tuned or user parameters: %v\n%s", err, cm.Data["postgresql.conf"])
	}
	password := e.password("db-auth")
	if len(password) != 32 {
		t.Errorf("generated password has %d characters", len(password))
	}
	if p := e.pvcs("app.kubernetes.io/instance=db"); len(p) != 1 || p[0].Status.Phase != corev1.ClaimBound {
		t.Fatalf("PVCs: %d, want 1 Bound", len(p))
	}

	// Scale to 3: the StatefulSet follows, the password does not change.
	if err := e.patch(postgresGVR, "db", `{"spec":{"replicas":3}}`); err != nil {
		t.Fatal(err)
	}
	e.waitFor("3 ready replicas", 3*time.Minute, func() (bool, string) {
		u := e.get(postgresGVR, "db")
		ok, obs := ready(u)
		rr, _, _ := unstructured.NestedInt64(u.Object, "status", "readyReplicas")
		return ok && rr == 3, fmt.Sprintf("%s readyReplicas=%d", obs, rr)
	})
	if p := e.password("db-auth"); p != password {
		t.Errorf("the password changed on upgrade")
	}
	if p := e.pvcs("app.kubernetes.io/instance=db"); len(p) != 3 {
		t.Errorf("PVCs after scaling: %d, want 3", len(p))
	}

	// The pods go (every node cordoned, the pods deleted): Ready follows
	// the StatefulSet, readyReplicas drops, and both come back with the
	// pods, with no new revision.
	revision := func() int64 {
		r, _, _ := unstructured.NestedInt64(e.get(postgresGVR, "db").Object, "status", "release", "revision")
		return r
	}
	before := revision()
	cordon := func(on bool) {
		if err := cluster.Cordon(ctx, on); err != nil {
			t.Error(err)
		}
	}
	cordon(true)
	t.Cleanup(func() { cordon(false) })
	if err := e.cs.CoreV1().Pods(e.ns).DeleteCollection(ctx, metav1.DeleteOptions{GracePeriodSeconds: new(int64)}, metav1.ListOptions{LabelSelector: "app.kubernetes.io/instance=db"}); err != nil {
		t.Fatal(err)
	}
	e.waitFor("Ready=False naming the StatefulSet, readyReplicas below 3", 3*time.Minute, func() (bool, string) {
		u := e.get(postgresGVR, "db")
		ok, obs := ready(u)
		rr, _, _ := unstructured.NestedInt64(u.Object, "status", "readyReplicas")
		return !ok && strings.Contains(obs, "WorkloadsUnavailable") && strings.Contains(obs, "StatefulSet/db") && rr < 3, fmt.Sprintf("%s readyReplicas=%d", obs, rr)
	})
	cordon(false)
	e.waitFor("Ready with 3 ready replicas again", 3*time.Minute, func() (bool, string) {
		u := e.get(postgresGVR, "db")
		ok, obs := ready(u)
		rr, _, _ := unstructured.NestedInt64(u.Object, "status", "readyReplicas")
		return ok && rr == 3, fmt.Sprintf("%s readyReplicas=%d", obs, rr)
	})
	if after := revision(); after != before {
		t.Errorf("revision %d after the pods came back, %d before: a Helm action ran", after, before)
	}

	// Bad input is refused at admission with a message naming the field.
	err = e.patch(postgresGVR, "db", `{"spec":{"storage":{"size":"500Mi"}}}`)
	if err == nil || !strings.Contains(err.Error(), "never shrink") {
		t.Errorf("shrinking storage: want a refusal saying it never shrinks, got %v", err)
	}
	err = e.patch(postgresGVR, "db", `{"spec":{"parameters":{"max_connections":100}}}`)
	if err == nil || !strings.Contains(err.Error(), "spec.parameters.max_connections") || !strings.Contains(err.Error(), "string") {
		t.Errorf("a number in parameters: want a refusal naming the field and the type, got %v", err)
	}
	err = e.patch(postgresGVR, "db", `{"spec":{"replicas":12}}`)
	if err == nil || !strings.Contains(err.Error(), "spec.replicas") {
		t.Errorf("replicas 12: want a refusal naming spec.replicas, got %v", err)
	}

	// Delete: the release goes, the data volumes and the password stay.
	if err := e.dyn.Resource(postgresGVR).Namespace(e.ns).Delete(ctx, "db", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	e.waitFor("Postgres db gone and its StatefulSet uninstalled", 3*time.Minute, func() (bool, string) {
		_, err := e.dyn.Resource(postgresGVR).Namespace(e.ns).Get(ctx, "db", metav1.GetOptions{})
		_, stsErr := e.cs.AppsV1().StatefulSets(e.ns).Get(ctx, "db", metav1.GetOptions{})
		return apierrors.IsNotFound(err) && apierrors.IsNotFound(stsErr), fmt.Sprintf("cr: %v, sts: %v", err, stsErr)
	})
	records, err := e.cs.CoreV1().Secrets(e.ns).List(ctx, metav1.ListOptions{LabelSelector: "owner=helm,name=db"})
	if err != nil || len(records.Items) != 0 {
		t.Errorf("release records left: %v", err)
	}
	// A wrong deletion of volumes is given time to show.
	if ok, n := e.holds(3*time.Second, func() (bool, string) {
		p := e.pvcs("app.kubernetes.io/instance=db")
		return len(p) == 3, fmt.Sprint(len(p))
	}); !ok {
		t.Errorf("data volumes after delete: %s, want all 3 kept", n)
	}
	if p := e.password("db-auth"); p != password {
		t.Errorf("the password Secret was not kept")
	}
}

// TestPostgresMajorVersionNeedsOptIn: a change of spec.version within a
// major proceeds; a new major waits for the opt-in annotation and changes
// nothing until then.
func TestPostgresMajorVersionNeedsOptIn(t *testing.T) {
	e := setup(t)
	ctx := context.Background()
	e.apply(postgresGVR, "Postgres", "pg", map[string]any{"version": "16", "storage": map[string]any{"size": "1Gi"}})
	image := func() string {
		sts, err := e.cs.AppsV1().StatefulSets(e.ns).Get(ctx, "pg", metav1.GetOptions{})
		if err != nil {
			return err.Error()
		}
		return sts.Spec.Template.Spec.Containers[0].Image
	}
	waitImage := func(want string) {
		e.waitFor("Postgres pg Ready on "+want, 3*time.Minute, func() (bool, string) {
			ok, obs := ready(e.get(postgresGVR, "pg"))
			img := image()
			return ok && strings.HasSuffix(img, ":"+want), obs + " image " + img
		})
	}
	waitImage("16")
	if err := e.patch(postgresGVR, "pg", `{"spec":{"version":"16.4"}}`); err != nil {
		t.Fatal(err)
	}
	waitImage("16.4")

	if err := e.patch(postgresGVR, "pg", `{"spec":{"version":"17"}}`); err != nil {
		t.Fatal(err)
	}
	e.waitFor("UpgradeBlocked for the major version change", time.Minute, func() (bool, string) {
		u := e.get(postgresGVR, "pg")
		st := &v1alpha1.ReleaseStatus{}
		_ = runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object["status"].(map[string]any), st)
		c := apimeta.FindStatusCondition(st.Conditions, v1alpha1.ConditionUpgradeBlocked)
		r := apimeta.FindStatusCondition(st.Conditions, v1alpha1.ConditionReady)
		return c != nil && c.Status == metav1.ConditionTrue && c.Reason == "MajorVersionChangeBlocked" &&
				strings.Contains(c.Message, `chartpilot.dev/allow-major-upgrade: "17"`) && r != nil && r.Status == metav1.ConditionFalse,
			fmt.Sprintf("UpgradeBlocked=%v Ready=%v", c, r)
	})
	if ok, img := e.holds(3*time.Second, func() (bool, string) { img := image(); return strings.HasSuffix(img, ":16.4"), img }); !ok {
		t.Errorf("a major version change was applied without the opt-in: image %s", img)
	}
	if err := e.patch(postgresGVR, "pg", `{"metadata":{"annotations":{"chartpilot.dev/allow-major-upgrade":"17"}}}`); err != nil {
		t.Fatal(err)
	}
	// Opted in, the data must move to the new major, after a fresh
	// backup: without spec.backup nothing changes and the field is named.
	e.waitFor("the major upgrade held for want of spec.backup", time.Minute, func() (bool, string) {
		c := condition(e.get(postgresGVR, "pg"), "BackupBeforeMajorUpgrade")
		return c != nil && c.Status == metav1.ConditionFalse && c.Reason == "MajorUpgradeNeedsBackup" && strings.Contains(c.Message, "spec.backup.store"), fmt.Sprintf("%+v", c)
	})
	if img := image(); !strings.HasSuffix(img, ":16.4") {
		t.Errorf("a major upgrade without a backup changed the image to %s", img)
	}
}

func TestRedisLifecycle(t *testing.T) {
	e := setup(t)
	ctx := context.Background()
	e.apply(redisGVR, "Redis", "cache", map[string]any{
		"persistence": map[string]any{"enabled": true, "size": "1Gi"},
	})
	e.waitFor("Redis cache Ready and its pod Ready", 3*time.Minute, func() (bool, string) {
		ok, obs := ready(e.get(redisGVR, "cache"))
		sts, err := e.cs.AppsV1().StatefulSets(e.ns).Get(ctx, "cache", metav1.GetOptions{})
		if err != nil {
			return false, obs + "; " + err.Error()
		}
		return ok && sts.Status.ReadyReplicas == 1, fmt.Sprintf("%s readyReplicas=%d", obs, sts.Status.ReadyReplicas)
	})
	password := e.password("cache-auth")
	if p := e.pvcs("app.kubernetes.io/instance=cache"); len(p) != 1 || p[0].Status.Phase != corev1.ClaimBound {
		// volumeClaimTemplates carry no labels in this chart; look by name.
		pvc, err := e.cs.CoreV1().PersistentVolumeClaims(e.ns).Get(ctx, "data-cache-0", metav1.GetOptions{})
		if err != nil || pvc.Status.Phase != corev1.ClaimBound {
			t.Fatalf("PVC data-cache-0: %v", err)
		}
	}
	if err := e.patch(redisGVR, "cache", `{"spec":{"extraArgs":["--maxmemory","64mb"]}}`); err != nil {
		t.Fatal(err)
	}
	e.waitFor("revision 2", 2*time.Minute, func() (bool, string) {
		u := e.get(redisGVR, "cache")
		ok, obs := ready(u)
		rev, _, _ := unstructured.NestedInt64(u.Object, "status", "release", "revision")
		return ok && rev == 2, fmt.Sprintf("%s revision=%d", obs, rev)
	})
	if p := e.password("cache-auth"); p != password {
		t.Errorf("the password changed on upgrade")
	}
	if err := e.dyn.Resource(redisGVR).Namespace(e.ns).Delete(ctx, "cache", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	e.waitFor("Redis gone", 3*time.Minute, func() (bool, string) {
		_, err := e.dyn.Resource(redisGVR).Namespace(e.ns).Get(ctx, "cache", metav1.GetOptions{})
		_, stsErr := e.cs.AppsV1().StatefulSets(e.ns).Get(ctx, "cache", metav1.GetOptions{})
		return apierrors.IsNotFound(err) && apierrors.IsNotFound(stsErr), fmt.Sprintf("cr: %v, sts: %v", err, stsErr)
	})
	if _, err := e.cs.CoreV1().PersistentVolumeClaims(e.ns).Get(ctx, "data-cache-0", metav1.GetOptions{}); err != nil {
		t.Errorf("the data volume was deleted with the release: %v", err)
	}
}
