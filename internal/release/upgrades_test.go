package release_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ctrlmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"

	"github.com/chartpilot/chartpilot/internal/api/v1alpha1"
	"github.com/chartpilot/chartpilot/internal/helm/helmtest"
	"github.com/chartpilot/chartpilot/internal/operator"
	"github.com/chartpilot/chartpilot/internal/watches"
)

// chartRepo is a chart repository served on loopback: index.yaml and the
// webapp test chart packaged at the versions published so far.
type chartRepo struct {
	t    *testing.T
	dir  string
	srv  *httptest.Server
	down atomic.Bool
}

func newChartRepo(t *testing.T) *chartRepo {
	t.Helper()
	r := &chartRepo{t: t, dir: t.TempDir()}
	files := http.FileServer(http.Dir(r.dir))
	r.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		if r.down.Load() {
			http.Error(w, "repository down for the test", http.StatusServiceUnavailable)
			return
		}
		files.ServeHTTP(w, req)
	}))
	t.Cleanup(r.srv.Close)
	return r
}

// publish packages test/charts/webapp as version; a broken version's pods
// never become ready (no node matches their selector).
func (r *chartRepo) publish(version string, broken bool) {
	r.t.Helper()
	src := filepath.Join("..", "..", "test", "charts", "webapp")
	if broken {
		tmp := filepath.Join(r.t.TempDir(), "webapp")
		if err := os.CopyFS(tmp, os.DirFS(src)); err != nil {
			r.t.Fatal(err)
		}
		f, err := os.OpenFile(filepath.Join(tmp, "values.yaml"), os.O_APPEND|os.O_WRONLY, 0)
		if err != nil {
			r.t.Fatal(err)
		}
		fmt.Fprintln(f, "nodeSelector: {chartpilot.dev/no-such-node: \"true\"}")
		f.Close()
		src = tmp
	}
	if _, err := helmtest.PackageAs(src, version, r.dir); err != nil {
		r.t.Fatal(err)
	}
	if err := helmtest.WriteIndex(r.dir, r.srv.URL); err != nil {
		r.t.Fatal(err)
	}
}

// repoWatch is the Webapp watch with its chart from repo.
func repoWatch(t *testing.T, repo *chartRepo, mutate ...func(*watches.Watch)) watches.Watch {
	return webappWatch(t, append([]func(*watches.Watch){func(w *watches.Watch) {
		w.Chart = ""
		w.Remote = &watches.RemoteChart{Repo: repo.srv.URL, Name: "webapp", Interval: time.Second}
	}}, mutate...)...)
}

func withCache(dir string) func(*operator.Options) {
	return func(o *operator.Options) { o.ChartCacheDir = dir }
}

// chartState is status.chart of a resource, with Ready.
func (e *env) chartState(name string) (deployed string, st *v1alpha1.ReleaseStatus, ready bool) {
	u := e.get(name)
	st = status(u)
	if st.Chart != nil {
		deployed = st.Chart.DeployedVersion
	}
	c := condition(u, v1alpha1.ConditionReady)
	return deployed, st, c != nil && c.Status == metav1.ConditionTrue && c.ObservedGeneration == u.GetGeneration()
}

func (e *env) waitVersion(name, version string) {
	e.t.Helper()
	e.waitFor(name+" Ready on chart "+version, func() (bool, string) {
		d, st, ready := e.chartState(name)
		c := apimetaReady(st)
		return d == version && ready && st.Release != nil && st.Release.ChartVersion == version, fmt.Sprintf("deployed %q ready=%v (%s)", d, ready, c)
	})
}

func apimetaReady(st *v1alpha1.ReleaseStatus) string {
	for _, c := range st.Conditions {
		if c.Type == v1alpha1.ConditionReconciling {
			return c.Reason + ": " + c.Message
		}
	}
	return ""
}

// chartVersions lists the chart versions in a release's history, oldest first.
func (e *env) chartVersions(name string) []string {
	var out []string
	for _, h := range e.history(name) {
		out = append(out, h.ChartVersion)
	}
	return out
}

// TestFleetRolloutFromRepository: a patch version published in a chart
// repository reaches 20 resources with at most maxConcurrentUpgrades at
// once; a maintenance window holds one of them; a major version waits for
// the opt-in annotation; a downgrade asked by a resource is refused.
func TestFleetRolloutFromRepository(t *testing.T) {
	e := newEnv(t)
	repo := newChartRepo(t)
	repo.publish("1.0.0", false)
	startOperator(t, cluster.Config, []watches.Watch{repoWatch(t, repo, func(w *watches.Watch) {
		w.MaxConcurrentUpgrades = 3
		w.MaxConcurrentReconciles = 8
	})}, withCache(t.TempDir()))
	const n = 20
	names := make([]string, n)
	for i := range n {
		names[i] = fmt.Sprintf("fleet-%02d", i)
		var ann map[string]string
		if i == 0 {
			// Closed now: only on the day after today, for one minute.
			tomorrow := time.Now().UTC().Add(24 * time.Hour).Weekday().String()[:3]
			ann = map[string]string{v1alpha1.AnnotationMaintenanceWindow: tomorrow + " 12:00-12:01 UTC"}
		}
		e.create(names[i], map[string]any{"message": "v"}, nil, ann)
	}
	for _, name := range names {
		e.waitVersion(name, "1.0.0") // a maintenance window does not hold an install
	}

	var mu sync.Mutex
	peak := 0.0
	queued := atomic.Bool{}
	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	sample(ctx, 20*time.Millisecond, func() {
		v := gauge("chartpilot_upgrades_in_progress", "Webapp")
		mu.Lock()
		peak = max(peak, v)
		mu.Unlock()
		if gaugeWith("chartpilot_rollout_waiting", map[string]string{"kind": "Webapp", "reason": "UpgradeQueued"}) > 0 {
			queued.Store(true)
		}
	})
	repo.publish("1.0.1", false)
	for _, name := range names[1:] {
		e.waitVersion(name, "1.0.1")
	}
	stop()
	mu.Lock()
	t.Logf("patch rollout to %d resources: peak upgrades at once %.0f (bound 3), queued seen: %v", n-1, peak, queued.Load())
	if peak > 3 {
		t.Errorf("%.0f upgrades ran at once; maxConcurrentUpgrades is 3", peak)
	}
	if peak < 3 && !queued.Load() {
		t.Errorf("the bound was never reached (peak %.0f), so this rollout proves nothing about it", peak)
	}
	mu.Unlock()
	// Every slot is given back once the upgrades are healthy (a leaked slot
	// once slowed a 200-resource wave to one upgrade at a time).
	e.waitFor("no upgrade slot held", func() (bool, string) {
		v := gauge("chartpilot_upgrades_in_progress", "Webapp")
		return v == 0, fmt.Sprintf("%.0f in progress", v)
	})

	// The resource outside its maintenance window waits, and says until when.
	e.waitFor("fleet-00 waiting for its window", func() (bool, string) {
		u := e.get("fleet-00")
		c, ready := condition(u, v1alpha1.ConditionUpgradeBlocked), condition(u, v1alpha1.ConditionReady)
		return c != nil && c.Status == metav1.ConditionTrue && c.Reason == "WaitingForMaintenanceWindow" && strings.Contains(c.Message, "next at") &&
			ready != nil && ready.Status == metav1.ConditionTrue, fmt.Sprint(c, ready)
	})
	if got := e.chartVersions("fleet-00"); !slices.Equal(got, []string{"1.0.0"}) {
		t.Errorf("fleet-00 upgraded outside its window: %v", got)
	}
	e.patch("fleet-00", fmt.Sprintf(`{"metadata":{"annotations":{%q:null}}}`, v1alpha1.AnnotationMaintenanceWindow))
	e.waitVersion("fleet-00", "1.0.1")

	// A major version waits for the opt-in; Ready stays True.
	repo.publish("2.0.0", false)
	for _, name := range []string{"fleet-01", "fleet-02"} {
		u := e.waitCondition(name, v1alpha1.ConditionUpgradeBlocked, metav1.ConditionTrue, "MajorUpgradeBlocked")
		msg := condition(u, v1alpha1.ConditionUpgradeBlocked).Message
		if !strings.Contains(msg, "2.0.0") || !strings.Contains(msg, `chartpilot.dev/allow-major-upgrade: "2"`) {
			t.Errorf("UpgradeBlocked message %q does not say what is available and how to opt in", msg)
		}
		if st := status(u); st.Chart == nil || st.Chart.AvailableUpgrade != "2.0.0" || st.Chart.DesiredVersion != "2.0.0" || st.Chart.DeployedVersion != "1.0.1" {
			t.Errorf("status.chart = %+v", st.Chart)
		}
		if c := condition(u, v1alpha1.ConditionReady); c == nil || c.Status != metav1.ConditionTrue {
			t.Errorf("an available major made %s not Ready: %v", name, c)
		}
	}
	e.waitEvent("fleet-01", "MajorUpgradeBlocked", "2.0.0")
	e.patch("fleet-01", fmt.Sprintf(`{"metadata":{"annotations":{%q:"2"}}}`, v1alpha1.AnnotationAllowMajorUpgrade))
	e.waitVersion("fleet-01", "2.0.0")
	if c := condition(e.get("fleet-01"), v1alpha1.ConditionUpgradeBlocked); c != nil {
		t.Errorf("UpgradeBlocked left after the opt-in: %v", c)
	}
	if got := e.chartVersions("fleet-02"); slices.Contains(got, "2.0.0") {
		t.Errorf("fleet-02 took a major upgrade without opting in: %v", got)
	}

	// A resource's own constraint that would downgrade it is refused.
	before := len(e.history("fleet-02"))
	e.patch("fleet-02", fmt.Sprintf(`{"metadata":{"annotations":{%q:"<1.0.1"}}}`, v1alpha1.AnnotationChartVersion))
	u := e.waitCondition("fleet-02", v1alpha1.ConditionUpgradeBlocked, metav1.ConditionTrue, "DowngradeRefused")
	if msg := condition(u, v1alpha1.ConditionUpgradeBlocked).Message; !strings.Contains(msg, `chartpilot.dev/allow-downgrade: "1.0.0"`) {
		t.Errorf("DowngradeRefused message %q does not say how to allow it", msg)
	}
	e.waitCondition("fleet-02", v1alpha1.ConditionReady, metav1.ConditionFalse, "DowngradeRefused")
	if n := len(e.history("fleet-02")); n != before {
		t.Errorf("a refused downgrade changed the release: %d revisions, was %d", n, before)
	}
	// An unsatisfiable constraint names the annotation.
	e.patch("fleet-02", fmt.Sprintf(`{"metadata":{"annotations":{%q:">=9"}}}`, v1alpha1.AnnotationChartVersion))
	u = e.waitCondition("fleet-02", v1alpha1.ConditionStalled, metav1.ConditionTrue, "")
	if msg := condition(u, v1alpha1.ConditionStalled).Message; !strings.Contains(msg, "annotation chartpilot.dev/chart-version") || !strings.Contains(msg, "2.0.0, 1.0.1, 1.0.0") {
		t.Errorf("Stalled message %q does not name the annotation and the versions", msg)
	}
	if n := len(e.history("fleet-02")); n != before {
		t.Errorf("bad input changed the release: %d revisions, was %d", n, before)
	}
}

// TestCanaryFailureHaltsRollout: canaries take a new version first; one
// whose pods never become ready is rolled back, and the others never get
// that version; the next good version goes to the canaries, soaks, then to
// the rest.
func TestCanaryFailureHaltsRollout(t *testing.T) {
	e := newEnv(t)
	repo := newChartRepo(t)
	repo.publish("1.0.0", false)
	startOperator(t, cluster.Config, []watches.Watch{repoWatch(t, repo, func(w *watches.Watch) {
		w.HealthTimeout = 8 * time.Second
		w.CanarySoak = 4 * time.Second
		w.MaxConcurrentReconciles = 8
	})}, withCache(t.TempDir()))
	canaries := []string{"canary-a", "canary-b"}
	rest := []string{"main-a", "main-b", "main-c"}
	for _, name := range canaries {
		e.create(name, map[string]any{"message": "v"}, map[string]string{v1alpha1.LabelCanary: "true"}, nil)
	}
	for _, name := range rest {
		e.create(name, map[string]any{"message": "v"}, nil, nil)
	}
	for _, name := range append(slices.Clone(canaries), rest...) {
		e.waitVersion(name, "1.0.0")
	}

	repo.publish("1.1.0", true)
	for _, name := range canaries {
		u := e.waitRolledBack(name)
		if st := status(u); st.Chart == nil || st.Chart.FailedVersion != "1.1.0" {
			t.Errorf("%s: status.chart = %+v, want failedVersion 1.1.0", name, st.Chart)
		}
	}
	for _, name := range rest {
		u := e.waitCondition(name, v1alpha1.ConditionUpgradeBlocked, metav1.ConditionTrue, "RolloutHalted")
		if c := condition(u, v1alpha1.ConditionReady); c == nil || c.Status != metav1.ConditionTrue {
			t.Errorf("%s, held by a halted rollout but serving, is not Ready: %v", name, c)
		}
		// Both canaries fail; the message names whichever was seen first.
		if msg := condition(u, v1alpha1.ConditionUpgradeBlocked).Message; !slices.ContainsFunc(canaries, func(c string) bool { return strings.Contains(msg, "/"+c+" ") }) || !strings.Contains(msg, "1.1.0") {
			t.Errorf("RolloutHalted message %q does not name the canary and the version", msg)
		}
		e.waitEvent(name, "RolloutHalted", "1.1.0")
	}
	if v := gaugeWith("chartpilot_rollout_halted", map[string]string{"kind": "Webapp", "version": "1.1.0"}); v != 1 {
		t.Errorf("chartpilot_rollout_halted{version=1.1.0} = %v, want 1", v)
	}
	// The halted resources keep serving what they had.
	for _, name := range rest {
		if got := e.chartVersions(name); !slices.Equal(got, []string{"1.0.0"}) {
			t.Errorf("%s got a halted version: %v", name, got)
		}
		if cm, err := e.configMap(name + "-config"); err != nil || cm.Data["message"] != "v" {
			t.Errorf("%s config: %v %v", name, cm, err)
		}
	}

	// A fixed version: canaries first, then (after the soak) the rest.
	repo.publish("1.1.1", false)
	for _, name := range canaries {
		e.waitVersion(name, "1.1.1")
	}
	for _, name := range rest {
		e.waitVersion(name, "1.1.1")
		if slices.Contains(e.chartVersions(name), "1.1.0") {
			t.Errorf("%s ran the version its canaries failed on", name)
		}
	}
	// The soak held the rest for at least canarySoak after the canaries were Ready.
	for _, name := range rest {
		h := e.history(name)
		upgraded := h[len(h)-1].LastDeployed
		for _, c := range canaries {
			ch := e.history(c)
			if canaryAt := ch[len(ch)-1].LastDeployed; upgraded.Sub(canaryAt) < 3*time.Second {
				t.Errorf("%s upgraded %s after canary %s: less than the 4s soak", name, upgraded.Sub(canaryAt), c)
			}
		}
	}
	if v := gaugeWith("chartpilot_rollout_upgrades_total", map[string]string{"kind": "Webapp", "version": "1.1.0", "result": "rolled_back"}); v < 2 {
		t.Errorf("chartpilot_rollout_upgrades_total{1.1.0, rolled_back} = %v, want 2", v)
	}
}

// TestRepositoryDownKeepsReleases: with the repository down (even across
// an operator restart) nothing is uninstalled, resources say the source
// is unreachable, new resources install from the cache, and the fleet
// catches up when it is back.
func TestRepositoryDownKeepsReleases(t *testing.T) {
	e := newEnv(t)
	repo := newChartRepo(t)
	repo.publish("1.0.0", false)
	cache := t.TempDir()
	w := repoWatch(t, repo)
	stop := startOperator(t, cluster.Config, []watches.Watch{w}, withCache(cache))
	for _, name := range []string{"down-a", "down-b"} {
		e.create(name, map[string]any{"message": "v"}, nil, nil)
		e.waitVersion(name, "1.0.0")
	}
	repo.down.Store(true)
	for _, name := range []string{"down-a", "down-b"} {
		u := e.waitCondition(name, v1alpha1.ConditionSourceAvailable, metav1.ConditionFalse, "SourceUnreachable")
		if msg := condition(u, v1alpha1.ConditionSourceAvailable).Message; !strings.Contains(msg, "503") {
			t.Errorf("SourceAvailable message %q does not say what the repository answered", msg)
		}
		if c := condition(u, v1alpha1.ConditionReady); c == nil || c.Status != metav1.ConditionTrue {
			t.Errorf("%s not Ready while its repository is down: %v", name, c)
		}
	}
	e.waitEvent("down-a", "SourceUnreachable", "503")

	// Restart while the repository is still down.
	stop()
	startOperator(t, cluster.Config, []watches.Watch{w}, withCache(cache))
	e.create("down-c", map[string]any{"message": "v"}, nil, nil)
	e.waitVersion("down-c", "1.0.0")
	for _, name := range []string{"down-a", "down-b"} {
		if got := e.chartVersions(name); !slices.Equal(got, []string{"1.0.0"}) {
			t.Errorf("%s changed while the repository was down: %v", name, got)
		}
	}

	repo.publish("1.0.1", false)
	repo.down.Store(false)
	for _, name := range []string{"down-a", "down-b", "down-c"} {
		e.waitVersion(name, "1.0.1")
		e.waitCondition(name, v1alpha1.ConditionSourceAvailable, metav1.ConditionTrue, "")
	}
}

// gaugeWith reads a gauge or counter of the operator's registry by labels.
func gaugeWith(name string, want map[string]string) float64 {
	families, err := ctrlmetrics.Registry.Gather()
	if err != nil {
		return -1
	}
	for _, f := range families {
		if f.GetName() != name {
			continue
		}
	metrics:
		for _, m := range f.GetMetric() {
			got := map[string]string{}
			for _, l := range m.GetLabel() {
				got[l.GetName()] = l.GetValue()
			}
			for k, v := range want {
				if got[k] != v {
					continue metrics
				}
			}
			if m.GetCounter() != nil {
				return m.GetCounter().GetValue()
			}
			return m.GetGauge().GetValue()
		}
	}
	return 0
}

// TestMaintenanceWindowOfNamespace: a namespace's maintenance window holds
// chart version upgrades of the resources in it (not installs).
func TestMaintenanceWindowOfNamespace(t *testing.T) {
	e := newEnv(t)
	repo := newChartRepo(t)
	repo.publish("1.0.0", false)
	tomorrow := time.Now().UTC().Add(24 * time.Hour).Weekday().String()[:3]
	nsPatch := func(value string) {
		body := fmt.Sprintf(`{"metadata":{"annotations":{%q:%s}}}`, v1alpha1.AnnotationMaintenanceWindow, value)
		if _, err := e.cs.CoreV1().Namespaces().Patch(context.Background(), e.ns, "application/merge-patch+json", []byte(body), metav1.PatchOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	nsPatch(fmt.Sprintf("%q", tomorrow+" 03:00-03:01 UTC"))
	startOperator(t, cluster.Config, []watches.Watch{repoWatch(t, repo)}, withCache(t.TempDir()))
	e.create("win", map[string]any{"message": "v"}, nil, nil)
	e.waitVersion("win", "1.0.0")
	repo.publish("1.1.0", false)
	u := e.waitCondition("win", v1alpha1.ConditionUpgradeBlocked, metav1.ConditionTrue, "WaitingForMaintenanceWindow")
	if msg := condition(u, v1alpha1.ConditionUpgradeBlocked).Message; !strings.Contains(msg, "of namespace "+e.ns) || !strings.Contains(msg, "1.1.0") {
		t.Errorf("message %q does not name the namespace's window and the version", msg)
	}
	if got := e.chartVersions("win"); !slices.Equal(got, []string{"1.0.0"}) {
		t.Errorf("upgraded outside the window: %v", got)
	}
	// Now inside a window: a reconcile request (or the next look, within 5m) upgrades.
	nsPatch(`"* 00:00-23:59 UTC; * 23:59-00:00 UTC"`)
	e.patch("win", fmt.Sprintf(`{"metadata":{"annotations":{%q:"now"}}}`, v1alpha1.AnnotationReconcileRequestedAt))
	e.waitVersion("win", "1.1.0")
}

// TestRepositoryCredentialsAndOnDemandRefresh: a repository behind basic
// auth is read with the credentials of the Secret named in chart.secretRef;
// with an hour-long interval, a reconcile request reads it again at once.
func TestRepositoryCredentialsAndOnDemandRefresh(t *testing.T) {
	e := newEnv(t)
	repo := newChartRepo(t)
	repo.publish("1.0.0", false)
	files := repo.srv.Config.Handler
	repo.srv.Config.Handler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if u, p, ok := r.BasicAuth(); !ok || u != "reader" || p != "s3cret" {
			http.Error(w, "credentials required", http.StatusUnauthorized)
			return
		}
		files.ServeHTTP(w, r)
	})
	secret := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "repo-creds", Namespace: e.ns}, StringData: map[string]string{"username": "reader", "password": "s3cret"}}
	if _, err := e.cs.CoreV1().Secrets(e.ns).Create(context.Background(), secret, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	startOperator(t, cluster.Config, []watches.Watch{repoWatch(t, repo, func(w *watches.Watch) {
		w.Remote.Interval = time.Hour
		w.Remote.SecretRef = &watches.SecretRef{Namespace: e.ns, Name: "repo-creds"}
	})}, withCache(t.TempDir()))
	e.create("auth", map[string]any{"message": "v"}, nil, nil)
	e.waitVersion("auth", "1.0.0")
	if c := condition(e.get("auth"), v1alpha1.ConditionSourceAvailable); c == nil || c.Status != metav1.ConditionTrue {
		t.Errorf("SourceAvailable = %v", c)
	}
	repo.publish("1.0.1", false)
	e.patch("auth", fmt.Sprintf(`{"metadata":{"annotations":{%q:"refresh-1"}}}`, v1alpha1.AnnotationReconcileRequestedAt))
	e.waitVersion("auth", "1.0.1")
}
