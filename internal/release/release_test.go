package release_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"

	"github.com/chartpilot/chartpilot/internal/api/v1alpha1"
	"github.com/chartpilot/chartpilot/internal/helm"
	"github.com/chartpilot/chartpilot/internal/watches"
)

// describe the release.

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
	if l := st.ValuesLayers; len(l) != 1 || l[0].Name != "cr" || len(l[0].Keys) != 1 || l[0].Keys[0] != "message" {
		t.Errorf("status.valuesLayers after install = %+v, want the resource's own layer with key message", l)
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
	if cm.Labels[v1alpha1.LabelRelease] != "shop" || cm.Annotations[v1alpha1.AnnotationOwner] != "Webapp.test.chartpilot.dev/"+e.ns+"/shop" {
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
	// A wrong correction is given time to happen.
	if ok, _ := e.holds(2*time.Second, func() (bool, string) {
		cm, err := e.configMap("shop-config")
		return err == nil && cm.Labels["team"] == "payments", ""
	}); !ok {
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
	// The install's own writes and events end first.
	e.waitFor("the install's writes to end", func() (bool, string) {
		n := writes.Load()
		ok, _ := e.holds(2*time.Second, func() (bool, string) { return writes.Load() == n, "" })
		return ok, fmt.Sprint(writes.Load())
	})
	base := writes.Load()
	writeLog.Clear()
	for i := range 3 {
		since := driftChecks(t)
		e.patch("calm", fmt.Sprintf(`{"metadata":{"annotations":{%q:"%d"},"labels":{"touch":"%d"}}}`, v1alpha1.AnnotationReconcileRequestedAt, i, i))
		// The request's pass is seen by its drift check; a write after it
		// is given a second to show.
		e.waitFor("the reconcile request's drift check", func() (bool, string) {
			d := driftChecks(t) - since
			return d >= 1, fmt.Sprint(d)
		})
		e.holds(time.Second, func() (bool, string) { return writes.Load() == base, "" })
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

func TestPause(t *testing.T) {
	e := newEnv(t)
	startOperator(t, cluster.Config, []watches.Watch{webappWatch(t)})
	e.create("nap", map[string]any{"message": "a"}, nil, nil)
	e.waitCondition("nap", v1alpha1.ConditionReady, metav1.ConditionTrue, "")
	e.patch("nap", fmt.Sprintf(`{"metadata":{"annotations":{%q:"true"}},"spec":{"message":"b"}}`, v1alpha1.AnnotationPause))
	e.waitCondition("nap", v1alpha1.ConditionReconciling, metav1.ConditionFalse, "Paused")
	if ok, seen := e.holds(2*time.Second, func() (bool, string) {
		if cm, _ := e.configMap("nap-config"); cm.Data["message"] != "a" {
			return false, fmt.Sprintf("paused release changed: %q", cm.Data["message"])
		}
		if n := len(e.history("nap")); n != 1 {
			return false, fmt.Sprintf("paused release has %d revisions", n)
		}
		return true, ""
	}); !ok {
		t.Fatal(seen)
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
	if ok, seen := e.holds(2*time.Second, func() (bool, string) {
		if n := len(e.history("b1")); n != 1 {
			return false, fmt.Sprintf("shard a touched b1: %d revisions", n)
		}
		if n := len(e.history("none")); n != 0 {
			return false, "an unlabelled resource was installed by a shard"
		}
		if u := e.get("none"); len(u.GetFinalizers()) != 0 || u.Object["status"] != nil {
			return false, fmt.Sprintf("an unlabelled resource was touched: finalizers %v status %v", u.GetFinalizers(), u.Object["status"])
		}
		return true, ""
	}); !ok {
		t.Error(seen)
	}
}

const operatorHelperEnv = "CHARTPILOT_TEST_OPERATOR_KUBECONFIG"
