package release_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/go-logr/logr"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	ctrlmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"

	"github.com/chartpilot/chartpilot/internal/api/v1alpha1"
	"github.com/chartpilot/chartpilot/internal/helm"
	"github.com/chartpilot/chartpilot/internal/operator"
	"github.com/chartpilot/chartpilot/internal/release"
	"github.com/chartpilot/chartpilot/internal/watches"
)

// TestLifecycle: install, values change, upgrade, drift corrected, status-only
// changes ignored, delete leaves nothing behind.
func TestLifecycle(t *testing.T) {
	e := newEnv(t)
	startOperator(t, cluster.Config, []watches.Watch{webappWatch(t)})
	ctx := context.Background()

	e.create("shop", map[string]any{"message": "v1"}, nil, nil)
	u := e.waitCondition("shop", v1alpha1.ConditionReady, metav1.ConditionTrue, "")
	st := status(u)
	if st.Release == nil || st.Release.Revision != 1 || st.Release.Status != "deployed" || st.Release.ChartVersion != "1.0.0" || st.Release.ValuesDigest == "" {
		t.Fatalf("status.release after install = %+v", st.Release)
	}
	if len(u.GetFinalizers()) != 1 || u.GetFinalizers()[0] != v1alpha1.Finalizer {
		t.Errorf("finalizers = %v", u.GetFinalizers())
	}
	cm, err := e.configMap("shop-config")
	if err != nil {
		t.Fatal(err)
	}
	if cm.Data["message"] != "v1" {
		t.Errorf("configmap message = %q", cm.Data["message"])
	}
	if cm.Labels[release.LabelRelease] != "shop" || cm.Annotations[release.AnnotationOwner] != "Webapp.test.chartpilot.dev/"+e.ns+"/shop" {
		t.Errorf("configmap labels = %v", cm.Labels)
	}
	if len(cm.OwnerReferences) != 1 || cm.OwnerReferences[0].UID != u.GetUID() {
		t.Errorf("configmap owner references = %v", cm.OwnerReferences)
	}
	e.waitEvent("shop", "InstallSucceeded", "revision 1")

	// Values change → upgrade.
	e.patch("shop", `{"spec":{"message":"v2","replicas":2}}`)
	e.waitFor("revision 2 deployed", func() (bool, string) {
		u := e.get("shop")
		st := status(u)
		c := condition(u, v1alpha1.ConditionReady)
		return st.Release != nil && st.Release.Revision == 2 && c != nil && c.Status == metav1.ConditionTrue && c.ObservedGeneration == u.GetGeneration(),
			fmt.Sprintf("%+v", st.Release)
	})
	cm, _ = e.configMap("shop-config")
	if cm.Data["message"] != "v2" {
		t.Errorf("configmap message after upgrade = %q", cm.Data["message"])
	}
	dep, err := e.cs.AppsV1().Deployments(e.ns).Get(ctx, "shop", metav1.GetOptions{})
	if err != nil || *dep.Spec.Replicas != 2 {
		t.Fatalf("deployment replicas after upgrade: %v %v", err, dep)
	}

	// Drift: someone edits the ConfigMap and deletes the Service.
	cm.Data["message"] = "hacked"
	if _, err := e.cs.CoreV1().ConfigMaps(e.ns).Update(ctx, cm, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := e.cs.CoreV1().Services(e.ns).Delete(ctx, "shop", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	e.waitFor("drift corrected", func() (bool, string) {
		cm, err := e.configMap("shop-config")
		if err != nil {
			return false, err.Error()
		}
		_, svcErr := e.cs.CoreV1().Services(e.ns).Get(ctx, "shop", metav1.GetOptions{})
		return cm.Data["message"] == "v2" && svcErr == nil, fmt.Sprintf("message=%q service: %v", cm.Data["message"], svcErr)
	})
	e.waitEvent("shop", "DriftCorrected", "ConfigMap")
	e.waitEvent("shop", "DriftCorrected", "Service")
	if h := e.history("shop"); len(h) != 2 {
		t.Errorf("drift correction made a Helm revision: %d revisions", len(h))
	}

	// A field the chart does not set is not drift: an extra label stays.
	cm, _ = e.configMap("shop-config")
	cm.Labels["team"] = "payments"
	if _, err := e.cs.CoreV1().ConfigMaps(e.ns).Update(ctx, cm, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	time.Sleep(2 * time.Second) // give a wrong correction time to happen
	cm, _ = e.configMap("shop-config")
	if cm.Labels["team"] != "payments" {
		t.Errorf("a label the chart does not set was removed")
	}

	// Delete: release records and every object of the manifest are gone.
	rel := e.history("shop")
	objs, err := helm.ParseManifest(rel[len(rel)-1].Manifest)
	if err != nil || len(objs) != 3 {
		t.Fatalf("manifest objects: %v %d", err, len(objs))
	}
	if err := e.dyn.Resource(webappGVR).Namespace(e.ns).Delete(ctx, "shop", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	e.waitFor("resource gone", func() (bool, string) {
		_, err := e.dyn.Resource(webappGVR).Namespace(e.ns).Get(ctx, "shop", metav1.GetOptions{})
		return isNotFound(err), fmt.Sprint(err)
	})
	secrets, err := e.cs.CoreV1().Secrets(e.ns).List(ctx, metav1.ListOptions{LabelSelector: "owner=helm,name=shop"})
	if err != nil || len(secrets.Items) != 0 {
		t.Errorf("release records left: %v %d", err, len(secrets.Items))
	}
	e.waitFor("objects of the manifest gone", func() (bool, string) {
		var left []string
		if _, err := e.configMap("shop-config"); !isNotFound(err) {
			left = append(left, "ConfigMap")
		}
		if _, err := e.cs.CoreV1().Services(e.ns).Get(ctx, "shop", metav1.GetOptions{}); !isNotFound(err) {
			left = append(left, "Service")
		}
		if _, err := e.cs.AppsV1().Deployments(e.ns).Get(ctx, "shop", metav1.GetOptions{}); !isNotFound(err) {
			left = append(left, "Deployment")
		}
		return len(left) == 0, strings.Join(left, ",")
	})
	e.waitEvent("shop", "Uninstalled", "shop")
}

// TestSteadyStateDoesNothing: once a release is in sync, reconcile requests
// and resyncs make no write at all (no Helm revision, no status patch, no
// event), counted at the operator's own HTTP transport.
func TestSteadyStateDoesNothing(t *testing.T) {
	e := newEnv(t)
	var writes atomic.Int64
	var writeLog sync.Map
	cfg := rest.CopyConfig(cluster.Config)
	cfg.Wrap(func(rt http.RoundTripper) http.RoundTripper {
		return roundTripFunc(func(req *http.Request) (*http.Response, error) {
			// Only this test's namespace: earlier tests' namespaces are being
			// deleted, and their resources finalized by this operator.
			if req.Method != http.MethodGet && strings.Contains(req.URL.Path, "/namespaces/"+e.ns+"/") {
				writes.Add(1)
				writeLog.Store(req.Method+" "+req.URL.Path, true)
			}
			return rt.RoundTrip(req)
		})
	})
	startOperator(t, cfg, []watches.Watch{webappWatch(t)})
	e.create("calm", map[string]any{"message": "x"}, nil, nil)
	u := e.waitCondition("calm", v1alpha1.ConditionReady, metav1.ConditionTrue, "")
	before, _ := json.Marshal(u.Object["status"])
	time.Sleep(2 * time.Second) // let the install's own writes and events finish
	base := writes.Load()
	writeLog.Clear()
	for i := range 3 {
		e.patch("calm", fmt.Sprintf(`{"metadata":{"annotations":{%q:"%d"},"labels":{"touch":"%d"}}}`, v1alpha1.AnnotationReconcileRequestedAt, i, i))
		time.Sleep(time.Second)
	}
	after, _ := json.Marshal(e.get("calm").Object["status"])
	if len(e.history("calm")) != 1 {
		t.Errorf("reconcile requests created revisions: %d", len(e.history("calm")))
	}
	if string(before) != string(after) {
		t.Errorf("status changed on reconcile requests:\nbefore %s\nafter  %s", before, after)
	}
	if n := writes.Load() - base; n != 0 {
		var list []string
		writeLog.Range(func(k, _ any) bool { list = append(list, k.(string)); return true })
		t.Errorf("the operator made %d writes in steady state: %v", n, list)
	}
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// TestPause: no action while paused; the change applies when unpaused.
func TestPause(t *testing.T) {
	e := newEnv(t)
	startOperator(t, cluster.Config, []watches.Watch{webappWatch(t)})
	e.create("nap", map[string]any{"message": "a"}, nil, nil)
	e.waitCondition("nap", v1alpha1.ConditionReady, metav1.ConditionTrue, "")
	e.patch("nap", fmt.Sprintf(`{"metadata":{"annotations":{%q:"true"}},"spec":{"message":"b"}}`, v1alpha1.AnnotationPause))
	e.waitCondition("nap", v1alpha1.ConditionReconciling, metav1.ConditionFalse, "Paused")
	time.Sleep(2 * time.Second)
	if cm, _ := e.configMap("nap-config"); cm.Data["message"] != "a" {
		t.Fatalf("paused release changed: %q", cm.Data["message"])
	}
	if n := len(e.history("nap")); n != 1 {
		t.Fatalf("paused release has %d revisions", n)
	}
	e.patch("nap", fmt.Sprintf(`{"metadata":{"annotations":{%q:null}}}`, v1alpha1.AnnotationPause))
	e.waitFor("unpaused upgrade", func() (bool, string) {
		cm, err := e.configMap("nap-config")
		if err != nil {
			return false, err.Error()
		}
		return cm.Data["message"] == "b", cm.Data["message"]
	})
}

// TestFailedUpgradeRolledBack: an upgrade the API server rejects is rolled
// back to the last deployed revision, and the CR says why.
func TestFailedUpgradeRolledBack(t *testing.T) {
	e := newEnv(t)
	startOperator(t, cluster.Config, []watches.Watch{webappWatch(t)})
	e.create("rb", map[string]any{"message": "good", "port": 8080}, nil, nil)
	e.waitCondition("rb", v1alpha1.ConditionReady, metav1.ConditionTrue, "")
	// Port 70000 renders fine but the API server refuses the Service.
	e.patch("rb", `{"spec":{"message":"bad","port":70000}}`)
	u := e.waitRolledBack("rb")
	c := condition(u, v1alpha1.ConditionReleased)
	if !strings.Contains(c.Message, "rolled back to revision 1") || !strings.Contains(c.Message, "70000") {
		t.Errorf("Released message does not say what failed: %q", c.Message)
	}
	if r := condition(u, v1alpha1.ConditionReady); r.Status != metav1.ConditionFalse {
		t.Errorf("Ready = %s after a rollback", r.Status)
	}
	hist := e.history("rb")
	last := hist[len(hist)-1]
	if last.Status != helm.StatusDeployed || last.Revision != 3 || last.Labels[release.LabelDigest] != hist[0].Labels[release.LabelDigest] {
		t.Errorf("after rollback, latest = rev %d %s", last.Revision, last.Status)
	}
	if cm, _ := e.configMap("rb-config"); cm.Data["message"] != "good" {
		t.Errorf("configmap after rollback = %q", cm.Data["message"])
	}
	if rel := status(u).Release; rel == nil || rel.Revision != 3 || rel.Status != "deployed" {
		t.Errorf("status.release after rollback = %+v, want revision 3 deployed", rel)
	}
	e.waitEvent("rb", "UpgradeFailed", "70000")
	e.waitEvent("rb", "RolledBack", "revision 1")
	// Not retried in a hot loop: the same inputs back off.
	time.Sleep(3 * time.Second)
	if n := len(e.history("rb")); n != 3 {
		t.Errorf("failed upgrade retried at once: %d revisions", n)
	}
	// A fix rolls forward at once.
	e.patch("rb", `{"spec":{"message":"fixed","port":8081}}`)
	e.waitFor("fixed upgrade", func() (bool, string) {
		u := e.get("rb")
		c := condition(u, v1alpha1.ConditionReady)
		return c != nil && c.Status == metav1.ConditionTrue && c.ObservedGeneration == u.GetGeneration(), fmt.Sprint(c)
	})
}

// TestInvalidValuesStalled: values the chart's schema rejects stall the CR
// with Helm's message; the deployed release keeps serving, untouched.
func TestInvalidValuesStalled(t *testing.T) {
	e := newEnv(t)
	startOperator(t, cluster.Config, []watches.Watch{webappWatch(t)})
	e.create("iv", map[string]any{"message": "ok"}, nil, nil)
	e.waitCondition("iv", v1alpha1.ConditionReady, metav1.ConditionTrue, "")
	e.patch("iv", `{"spec":{"replicas":"three"}}`)
	u := e.waitCondition("iv", v1alpha1.ConditionStalled, metav1.ConditionTrue, "RenderFailed")
	msg := condition(u, v1alpha1.ConditionStalled).Message
	if !strings.Contains(msg, "replicas") || !strings.Contains(msg, "revision 1 keeps running") {
		t.Errorf("Stalled message = %q", msg)
	}
	if r := condition(u, v1alpha1.ConditionReady); r.Status != metav1.ConditionFalse || r.Reason != "RenderFailed" {
		t.Errorf("Ready = %+v", r)
	}
	time.Sleep(3 * time.Second)
	hist := e.history("iv")
	if len(hist) != 1 || hist[0].Status != helm.StatusDeployed {
		t.Fatalf("a stalled upgrade touched the release: %d revisions, latest %s", len(hist), hist[len(hist)-1].Status)
	}
	if _, err := e.configMap("iv-config"); err != nil {
		t.Errorf("deployed objects gone: %v", err)
	}
	// Fixing the input clears Stalled.
	e.patch("iv", `{"spec":{"replicas":3}}`)
	u = e.waitCondition("iv", v1alpha1.ConditionReady, metav1.ConditionTrue, "")
	if condition(u, v1alpha1.ConditionStalled) != nil {
		t.Errorf("Stalled not cleared")
	}
}

// TestNeverInstalledDeletedAtOnce: a CR whose release never installed is
// deleted without waiting on anything.
func TestNeverInstalledDeletedAtOnce(t *testing.T) {
	e := newEnv(t)
	startOperator(t, cluster.Config, []watches.Watch{webappWatch(t)})
	e.create("never", map[string]any{"replicas": "x"}, nil, nil)
	e.waitCondition("never", v1alpha1.ConditionStalled, metav1.ConditionTrue, "RenderFailed")
	if err := e.dyn.Resource(webappGVR).Namespace(e.ns).Delete(context.Background(), "never", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	e.waitFor("resource gone", func() (bool, string) {
		_, err := e.dyn.Resource(webappGVR).Namespace(e.ns).Get(context.Background(), "never", metav1.GetOptions{})
		return isNotFound(err), fmt.Sprint(err)
	})
}

// TestUnmanagedReleaseUntouched: a release of the same name installed by
// someone else is reported and never changed.
func TestUnmanagedReleaseUntouched(t *testing.T) {
	e := newEnv(t)
	ch, err := helm.LoadChart(filepath.Join("..", "..", "test", "charts", "webapp"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.hc.Install(context.Background(), ch, helm.ActionOptions{Namespace: e.ns, Name: "theirs", Values: map[string]any{"message": "mine"}, Timeout: time.Minute}); err != nil {
		t.Fatal(err)
	}
	startOperator(t, cluster.Config, []watches.Watch{webappWatch(t)})
	e.create("theirs", map[string]any{"message": "ours"}, nil, nil)
	u := e.waitCondition("theirs", v1alpha1.ConditionStalled, metav1.ConditionTrue, "ReleaseNotManaged")
	if msg := condition(u, v1alpha1.ConditionStalled).Message; !strings.Contains(msg, v1alpha1.AnnotationAdopt) {
		t.Errorf("message does not say how to adopt: %q", msg)
	}
	if cm, _ := e.configMap("theirs-config"); cm.Data["message"] != "mine" {
		t.Errorf("unmanaged release changed: %q", cm.Data["message"])
	}
	// Deleting the CR leaves the other release alone.
	if err := e.dyn.Resource(webappGVR).Namespace(e.ns).Delete(context.Background(), "theirs", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	e.waitFor("resource gone", func() (bool, string) {
		_, err := e.dyn.Resource(webappGVR).Namespace(e.ns).Get(context.Background(), "theirs", metav1.GetOptions{})
		return isNotFound(err), fmt.Sprint(err)
	})
	if h := e.history("theirs"); len(h) != 1 || h[0].Status != helm.StatusDeployed {
		t.Errorf("unmanaged release touched on delete: %d revisions", len(h))
	}
}

// TestShardsBySelector: two operators with disjoint selectors reconcile only
// their own resources.
func TestShardsBySelector(t *testing.T) {
	e := newEnv(t)
	shard := func(v string) func(*watches.Watch) {
		return func(w *watches.Watch) {
			ws, err := watches.Parse([]byte(fmt.Sprintf("- {group: test.chartpilot.dev, version: v1alpha1, kind: Webapp, chart: %s, selector: {matchLabels: {shard: %s}}}\n", filepath.Join("..", "..", "test", "charts", "webapp"), v)), ".", os.LookupEnv)
			if err != nil {
				t.Fatal(err)
			}
			*w = ws[0]
		}
	}
	startOperator(t, cluster.Config, []watches.Watch{webappWatch(t, shard("a"))})
	stopB := startOperator(t, cluster.Config, []watches.Watch{webappWatch(t, shard("b"))})
	e.create("a1", map[string]any{"message": "a"}, map[string]string{"shard": "a"}, nil)
	e.create("b1", map[string]any{"message": "b"}, map[string]string{"shard": "b"}, nil)
	e.create("none", map[string]any{"message": "n"}, nil, nil)
	e.waitCondition("a1", v1alpha1.ConditionReady, metav1.ConditionTrue, "")
	e.waitCondition("b1", v1alpha1.ConditionReady, metav1.ConditionTrue, "")
	stopB()
	e.patch("b1", `{"spec":{"message":"b2"}}`)
	e.patch("a1", `{"spec":{"message":"a2"}}`)
	e.waitFor("a1 upgraded by its shard", func() (bool, string) {
		cm, err := e.configMap("a1-config")
		if err != nil {
			return false, err.Error()
		}
		return cm.Data["message"] == "a2", cm.Data["message"]
	})
	time.Sleep(2 * time.Second)
	if n := len(e.history("b1")); n != 1 {
		t.Errorf("shard a touched b1: %d revisions", n)
	}
	if n := len(e.history("none")); n != 0 {
		t.Errorf("an unlabelled resource was installed by a shard")
	}
	if u := e.get("none"); len(u.GetFinalizers()) != 0 || u.Object["status"] != nil {
		t.Errorf("an unlabelled resource was touched: finalizers %v status %v", u.GetFinalizers(), u.Object["status"])
	}
}

// TestLeaderElectionHandover: when the leader stops, the other replica takes
// over and reconciles.
func TestLeaderElectionHandover(t *testing.T) {
	e := newEnv(t)
	le := func(o *operator.Options) {
		o.LeaderElection = true
		o.LeaderElectionID = "chartpilot-test-" + e.ns
		o.LeaderElectionNamespace = e.ns
		o.LeaseDuration = 4 * time.Second
		o.RenewDeadline = 3 * time.Second
		o.RetryPeriod = 500 * time.Millisecond
	}
	ws := []watches.Watch{webappWatch(t)}
	stopFirst := startOperator(t, cluster.Config, ws, le)
	e.waitFor("a leader", func() (bool, string) {
		l, err := e.cs.CoordinationV1().Leases(e.ns).Get(context.Background(), "chartpilot-test-"+e.ns, metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		return l.Spec.HolderIdentity != nil && *l.Spec.HolderIdentity != "", ""
	})
	startOperator(t, cluster.Config, ws, le)
	e.create("one", map[string]any{"message": "1"}, nil, nil)
	e.waitCondition("one", v1alpha1.ConditionReady, metav1.ConditionTrue, "")
	first, _ := e.cs.CoordinationV1().Leases(e.ns).Get(context.Background(), "chartpilot-test-"+e.ns, metav1.GetOptions{})
	stopFirst()
	e.create("two", map[string]any{"message": "2"}, nil, nil)
	e.waitCondition("two", v1alpha1.ConditionReady, metav1.ConditionTrue, "")
	second, _ := e.cs.CoordinationV1().Leases(e.ns).Get(context.Background(), "chartpilot-test-"+e.ns, metav1.GetOptions{})
	if *first.Spec.HolderIdentity == *second.Spec.HolderIdentity {
		t.Errorf("lease holder did not change: %s", *second.Spec.HolderIdentity)
	}
}

const operatorHelperEnv = "CHARTPILOT_TEST_OPERATOR_KUBECONFIG"

// runOperatorHelper runs an operator in this process until it is killed; the
// crash test starts the test binary this way and kills it with SIGKILL.
func runOperatorHelper() {
	cfg, err := clientcmd.BuildConfigFromFlags("", os.Getenv(operatorHelperEnv))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	ws, err := watches.Parse([]byte(fmt.Sprintf("- {group: test.chartpilot.dev, version: v1alpha1, kind: Webapp, chart: %s, timeout: 10m}\n", filepath.Join("..", "..", "test", "charts", "webapp"))), ".", os.LookupEnv)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	mgr, err := operator.New(operator.Options{Config: cfg, Watches: ws, MetricsAddr: "0", ProbeAddr: "0", Log: logr.Discard()})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	_ = mgr.Start(context.Background())
	os.Exit(0)
}

// TestCrashMidUpgradeRecovered kills an operator (SIGKILL) while an upgrade
// holds the release in pending-upgrade, then starts another: the release is
// unlocked and the upgrade finished, never stuck in "another operation is in
// progress".
func TestCrashMidUpgradeRecovered(t *testing.T) {
	e := newEnv(t)
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), operatorHelperEnv+"="+cluster.KubeconfigPath)
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	killed := false
	t.Cleanup(func() {
		if !killed {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
		}
	})
	e.create("crash", map[string]any{"message": "v1"}, nil, nil)
	e.waitCondition("crash", v1alpha1.ConditionReady, metav1.ConditionTrue, "")
	// The pre-upgrade hook Job never completes on this cluster (no
	// controllers), so the upgrade stays pending-upgrade.
	e.patch("crash", `{"spec":{"message":"v2","slowHook":true}}`)
	e.waitFor("pending-upgrade", func() (bool, string) {
		h := e.history("crash")
		last := h[len(h)-1]
		return last.Status == helm.StatusPendingUpgrade, string(last.Status)
	})
	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = cmd.Wait()
	killed = true

	// The user drops the slow hook; a new operator must unlock and upgrade.
	e.patch("crash", `{"spec":{"slowHook":false}}`)
	startOperator(t, cluster.Config, []watches.Watch{webappWatch(t)})
	e.waitFor("upgrade finished", func() (bool, string) {
		u := e.get("crash")
		c := condition(u, v1alpha1.ConditionReady)
		h := e.history("crash")
		last := h[len(h)-1]
		return c != nil && c.Status == metav1.ConditionTrue && c.ObservedGeneration == u.GetGeneration() && last.Status == helm.StatusDeployed,
			fmt.Sprintf("ready=%v latest rev %d %s", c, last.Revision, last.Status)
	})
	if cm, _ := e.configMap("crash-config"); cm.Data["message"] != "v2" {
		t.Errorf("configmap after recovery = %q", cm.Data["message"])
	}
	e.waitEvent("crash", "Unlocked", "pending-upgrade")
	for _, r := range e.history("crash") {
		if r.Status.IsPending() {
			t.Errorf("revision %d still %s", r.Revision, r.Status)
		}
	}
}

// TestForceUpgradeAndHistoryCap: a new force-upgrade token makes one upgrade
// on unchanged values; stored revisions never exceed maxHistory; metrics
// describe the release.
func TestForceUpgradeAndHistoryCap(t *testing.T) {
	e := newEnv(t)
	startOperator(t, cluster.Config, []watches.Watch{webappWatch(t, func(w *watches.Watch) { w.MaxHistory = 3 })})
	e.create("hist", map[string]any{"message": "m0"}, nil, nil)
	e.waitCondition("hist", v1alpha1.ConditionReady, metav1.ConditionTrue, "")
	waitRevision := func(rev int) {
		t.Helper()
		e.waitFor(fmt.Sprintf("revision %d ready", rev), func() (bool, string) {
			u := e.get("hist")
			st := status(u)
			c := condition(u, v1alpha1.ConditionReady)
			return st.Release != nil && st.Release.Revision == rev && c != nil && c.Status == metav1.ConditionTrue,
				fmt.Sprintf("%+v", st.Release)
		})
	}
	e.patch("hist", fmt.Sprintf(`{"metadata":{"annotations":{%q:"one"}}}`, v1alpha1.AnnotationForceUpgrade))
	waitRevision(2)
	if h := e.history("hist"); h[len(h)-1].Labels[release.LabelForceToken] != "one" {
		t.Errorf("force token not recorded: %v", h[len(h)-1].Labels)
	}
	for i := 1; i <= 4; i++ {
		e.patch("hist", fmt.Sprintf(`{"spec":{"message":"m%d"}}`, i))
		waitRevision(2 + i)
	}
	if h := e.history("hist"); len(h) > 3 {
		t.Errorf("%d revisions stored, maxHistory is 3", len(h))
	}
	if st := status(e.get("hist")); len(st.History) == 0 || st.History[0].Action != "Upgrade" || st.History[0].Revision != 6 {
		t.Errorf("status.history[0] = %+v", st.History)
	}
	families, err := ctrlmetrics.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, f := range families {
		if f.GetName() != "chartpilot_release_info" {
			continue
		}
		for _, m := range f.GetMetric() {
			l := map[string]string{}
			for _, lp := range m.GetLabel() {
				l[lp.GetName()] = lp.GetValue()
			}
			if l["namespace"] == e.ns && l["name"] == "hist" && l["chart"] == "webapp" && l["version"] == "1.0.0" && l["status"] == "deployed" {
				found = true
			}
		}
	}
	if !found {
		t.Errorf("chartpilot_release_info has no series for %s/hist", e.ns)
	}
}
