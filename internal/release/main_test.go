package release_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"go.uber.org/zap/zapcore"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
	"sigs.k8s.io/controller-runtime/pkg/manager"

	"github.com/chartpilot/chartpilot/internal/api/v1alpha1"
	"github.com/chartpilot/chartpilot/internal/helm"
	"github.com/chartpilot/chartpilot/internal/operator"
	"github.com/chartpilot/chartpilot/internal/rbac"
	"github.com/chartpilot/chartpilot/internal/testing/testcluster"
	"github.com/chartpilot/chartpilot/internal/testing/testwait"
	"github.com/chartpilot/chartpilot/internal/watches"
)

var cluster *testcluster.Cluster

// operatorLog is the file the in-process operators log to.
var operatorLog string

var webappGVK = schema.GroupVersionKind{Group: "test.chartpilot.dev", Version: "v1alpha1", Kind: "Webapp"}
var webappGVR = schema.GroupVersionResource{Group: "test.chartpilot.dev", Version: "v1alpha1", Resource: "webapps"}

func TestMain(m *testing.M) {
	if os.Getenv(operatorHelperEnv) != "" {
		runOperatorHelper()
		return
	}
	ctrl.SetLogger(zap.New(zap.WriteTo(testLogWriter()), zap.Level(zapcore.DebugLevel)))
	os.Exit(testcluster.RunMain(m, testcluster.Options{
		// The full tier: the health gate waits for workloads that kwok makes ready.
		Tier:    testcluster.TierFull,
		CRDDirs: []string{filepath.Join("..", "..", "test", "crds")},
		// The operators' requests, counted by the tests of request economy.
		AuditUsers: []string{managerUser},
	}, &cluster))
}

// testLogWriter sends operator logs to a file next to the component logs,
// so a failing test can point at them without flooding the output.
func testLogWriter() *os.File {
	f, err := os.CreateTemp("", "chartpilot-release-test-*.log")
	if err != nil {
		return os.Stderr
	}
	fmt.Fprintf(os.Stderr, "operator logs: %s\n", f.Name())
	operatorLog = f.Name()
	return f
}

// env bundles the clients a test uses.
type env struct {
	t   *testing.T
	ns  string
	dyn dynamic.Interface
	cs  kubernetes.Interface
	hc  *helm.Client
}

func newEnv(t *testing.T) *env {
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
	hc, err := helm.NewClient(cluster.Config, logr.Discard())
	if err != nil {
		t.Fatal(err)
	}
	return &env{t: t, ns: ns, dyn: dyn, cs: cs, hc: hc}
}

// watch returns the watches.yaml entry for the test kind.
func webappWatch(t *testing.T, mutate ...func(*watches.Watch)) watches.Watch {
	t.Helper()
	yaml := fmt.Sprintf("- {group: test.chartpilot.dev, version: v1alpha1, kind: Webapp, chart: %s, timeout: 60s}\n", filepath.Join("..", "..", "test", "charts", "webapp"))
	ws, err := watches.Parse([]byte(yaml), ".", os.LookupEnv)
	if err != nil {
		t.Fatal(err)
	}
	w := ws[0]
	for _, m := range mutate {
		m(&w)
	}
	return w
}

// managerUser is the user the tests' operators authenticate as (managerConfig).
const managerUser = "system:serviceaccount:chartpilot-system:manager"

var (
	managerOnce sync.Once
	managerCfg  *rest.Config
	managerErr  error
)

// managerConfig is what the operators of these tests run as: a
// ServiceAccount bound to the ClusterRole `chartpilot rbac` derives for the
// test kinds and their chart (with impersonation of "deployer"), not
// cluster-admin.
func managerConfig(t *testing.T) *rest.Config {
	t.Helper()
	managerOnce.Do(func() {
		ws := []watches.Watch{webappWatch(t), webappWatch(t, func(w *watches.Watch) { w.GVK.Kind = "Webshop" })}
		var crds [][]byte
		for _, f := range []string{"webapps.yaml", "webshops.yaml"} {
			b, err := os.ReadFile(filepath.Join("..", "..", "test", "crds", f))
			if err != nil {
				managerErr = err
				return
			}
			crds = append(crds, b)
		}
		plurals, err := rbac.Plurals(crds...)
		if err != nil {
			managerErr = err
			return
		}
		rules, err := rbac.Rules(rbac.Options{Watches: ws, Impersonate: []string{"deployer"}, KubeVersion: "v1.37.2", Plurals: plurals})
		if err != nil {
			managerErr = err
			return
		}
		managerCfg, managerErr = cluster.ServiceAccountConfig("chartpilot-system", "manager", rules)
	})
	if managerErr != nil {
		t.Fatalf("the manager's ServiceAccount: %v", managerErr)
	}
	return managerCfg
}

// startOperator runs an operator for ws until the test ends (or stop is
// called). Given the cluster's admin config, the operator runs under the
// derived role instead (managerConfig).
func startOperator(t *testing.T, cfg *rest.Config, ws []watches.Watch, mutate ...func(*operator.Options)) (stop func()) {
	t.Helper()
	_, stop = startManager(t, cfg, ws, mutate...)
	return stop
}

// startManager is startOperator that also returns the operator's manager.
func startManager(t *testing.T, cfg *rest.Config, ws []watches.Watch, mutate ...func(*operator.Options)) (_ manager.Manager, stop func()) {
	t.Helper()
	if cfg == cluster.Config {
		cfg = managerConfig(t)
	}
	opts := operator.Options{Config: cfg, Watches: ws, MetricsAddr: "0", ProbeAddr: "0", SeveralInProcess: true}
	for _, m := range mutate {
		m(&opts)
	}
	mgr, err := operator.New(opts)
	if err != nil {
		t.Fatalf("building operator: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- mgr.Start(ctx) }()
	stopped := false
	stop = func() {
		if stopped {
			return
		}
		stopped = true
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("operator stopped with: %v", err)
			}
		case <-time.After(90 * time.Second):
			t.Errorf("operator did not stop within 90s")
		}
	}
	t.Cleanup(stop)
	return mgr, stop
}

func (e *env) create(name string, spec map[string]any, labels, annotations map[string]string) *unstructured.Unstructured {
	e.t.Helper()
	u := &unstructured.Unstructured{}
	u.SetGroupVersionKind(webappGVK)
	u.SetName(name)
	u.SetNamespace(e.ns)
	u.SetLabels(labels)
	u.SetAnnotations(annotations)
	u.Object["spec"] = spec
	out, err := e.dyn.Resource(webappGVR).Namespace(e.ns).Create(context.Background(), u, metav1.CreateOptions{})
	if err != nil {
		e.t.Fatalf("creating %s: %v", name, err)
	}
	return out
}

func (e *env) get(name string) *unstructured.Unstructured {
	e.t.Helper()
	u, err := e.dyn.Resource(webappGVR).Namespace(e.ns).Get(context.Background(), name, metav1.GetOptions{})
	if err != nil {
		e.t.Fatalf("getting %s: %v", name, err)
	}
	return u
}

// patchSpec merges fields into the resource's spec (a JSON merge patch).
func (e *env) patch(name, body string) {
	e.t.Helper()
	_, err := e.dyn.Resource(webappGVR).Namespace(e.ns).Patch(context.Background(), name, "application/merge-patch+json", []byte(body), metav1.PatchOptions{})
	if err != nil {
		e.t.Fatalf("patching %s: %v", name, err)
	}
}

func status(u *unstructured.Unstructured) *v1alpha1.ReleaseStatus {
	st := &v1alpha1.ReleaseStatus{}
	if raw, ok := u.Object["status"].(map[string]any); ok {
		_ = runtime.DefaultUnstructuredConverter.FromUnstructured(raw, st)
	}
	return st
}

func condition(u *unstructured.Unstructured, typ string) *metav1.Condition {
	return apimeta.FindStatusCondition(status(u).Conditions, typ)
}

// waitFor polls until cond holds, with a deadline generous enough for a
// loaded 2-core machine, and reports the last observation on failure.
func (e *env) waitFor(what string, cond func() (bool, string)) {
	e.t.Helper()
	var last string
	err := wait.PollUntilContextTimeout(context.Background(), 200*time.Millisecond, 2*time.Minute, true, func(context.Context) (bool, error) {
		ok, obs := cond()
		last = obs
		return ok, nil
	})
	if err != nil {
		e.t.Fatalf("waiting for %s: %v; last seen: %s", what, err, last)
	}
}

// holds reports whether cond stays true, looked at every 200 ms for d
// (the room a wrong action is given to show), and what it saw last: it
// ends at the first look that finds cond false.
func (e *env) holds(d time.Duration, cond func() (bool, string)) (bool, string) {
	return testwait.HoldsSaying(d, 200*time.Millisecond, cond)
}

// quietFor takes the manager's requests from audit for d, looked at every
// 250 ms, and reports whether the requests in this test's namespace stayed
// at most max: it ends at the first look that finds more. The requests
// returned are everything since audit's previous Take.
func (e *env) quietFor(audit *testcluster.AuditLog, d time.Duration, max int) testcluster.Requests {
	e.t.Helper()
	r, err := audit.Take(managerUser)
	if err != nil {
		e.t.Fatal(err)
	}
	testwait.Holds(d, 250*time.Millisecond, func() bool {
		more, err := audit.Take(managerUser)
		if err != nil {
			e.t.Fatal(err)
		}
		r.Add(more)
		return r.ByNamespace[e.ns] <= max
	})
	return r
}

// waitCondition waits until the resource's condition has status and (if
// non-empty) reason.
func (e *env) waitCondition(name, typ string, want metav1.ConditionStatus, reason string) *unstructured.Unstructured {
	e.t.Helper()
	var u *unstructured.Unstructured
	e.waitFor(fmt.Sprintf("%s %s=%s %s", name, typ, want, reason), func() (bool, string) {
		got, err := e.dyn.Resource(webappGVR).Namespace(e.ns).Get(context.Background(), name, metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		u = got
		c := condition(got, typ)
		if c == nil {
			return false, fmt.Sprintf("no %s condition; status %v", typ, got.Object["status"])
		}
		return c.Status == want && (reason == "" || c.Reason == reason) && c.ObservedGeneration == got.GetGeneration(),
			fmt.Sprintf("%s=%s reason=%s message=%q", typ, c.Status, c.Reason, c.Message)
	})
	return u
}

// waitRolledBack waits until Released=False (UpgradeFailed) says the
// release was rolled back (the failed upgrade itself sets the same reason first).
func (e *env) waitRolledBack(name string) *unstructured.Unstructured {
	e.t.Helper()
	var u *unstructured.Unstructured
	e.waitFor(name+" rolled back", func() (bool, string) {
		u = e.get(name)
		c := condition(u, v1alpha1.ConditionReleased)
		return c != nil && c.Status == metav1.ConditionFalse && c.Reason == "UpgradeFailed" && strings.Contains(c.Message, "rolled back to revision"), fmt.Sprint(c)
	})
	return u
}

// waitPendingUpgrade waits until the newest revision is pending-upgrade.
func (e *env) waitPendingUpgrade(name string) {
	e.t.Helper()
	e.waitFor(name+" pending-upgrade", func() (bool, string) {
		h := e.history(name)
		last := h[len(h)-1]
		return last.Status == helm.StatusPendingUpgrade, string(last.Status)
	})
}

// history returns the release's revisions, oldest first.
func (e *env) history(name string) []*helm.Release {
	e.t.Helper()
	h, err := e.hc.History(e.ns, name)
	if err != nil {
		e.t.Fatalf("reading history: %v", err)
	}
	return h
}

func (e *env) configMap(name string) (*corev1.ConfigMap, error) {
	return e.cs.CoreV1().ConfigMaps(e.ns).Get(context.Background(), name, metav1.GetOptions{})
}

// events returns "Reason: message" of the resource's events.
func (e *env) events(name string) []string {
	list, err := e.cs.CoreV1().Events(e.ns).List(context.Background(), metav1.ListOptions{FieldSelector: "involvedObject.name=" + name})
	if err != nil {
		e.t.Fatal(err)
	}
	var out []string
	for _, ev := range list.Items {
		out = append(out, ev.Reason+": "+ev.Message)
	}
	return out
}

func (e *env) waitEvent(name, reason, contains string) {
	e.t.Helper()
	e.waitFor("event "+reason, func() (bool, string) {
		evs := e.events(name)
		for _, ev := range evs {
			if strings.HasPrefix(ev, reason+": ") && strings.Contains(ev, contains) {
				return true, ""
			}
		}
		return false, strings.Join(evs, " | ")
	})
}

func isNotFound(err error) bool { return apierrors.IsNotFound(err) }
