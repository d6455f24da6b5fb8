package main

import (
	"context"
	"fmt"
	"math"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/dynamic/dynamicinformer"

	"github.com/chartpilot/chartpilot/internal/helm/helmtest"
)

// waveResult is one upgrade wave: a chart version published in a chart
// repository reaching every resource.
type waveResult struct {
	n, bound    int
	kills       int // SIGKILLs of the operator during the wave
	pending     int // release records left pending-* at the end (must be 0)
	revisions   int // release revisions stored by the wave (one per resource when nothing was retried)
	install     time.Duration
	wave        time.Duration
	peak        float64 // upgrades in progress at once (operator's gauge)
	peakWaiting float64 // resources queued behind the bound at once
	helm        float64 // Helm actions during the wave
}

// runWave installs n resources from webapp 1.0.0 served by a loopback chart
// repository, publishes 1.0.1, and measures the wave until every resource
// is Ready on 1.0.1.
//
// With kills > 0 the operator is killed with SIGKILL that many times while
// the wave runs (every killEvery) and started again, as a node failure or an
// OOM kill would; the wave must still complete with no release left pending.
func runWave(root string, n, bound, concurrency, kills int) (waveResult, error) {
	const killEvery = 8 * time.Second
	res := waveResult{n: n, bound: bound, kills: kills}
	ctx := context.Background()
	logf("wave N=%d: starting the full local cluster", n)
	c, dyn, cs, stopCluster, err := startKeptCluster(ctx, root, "wave")
	if err != nil {
		return res, err
	}
	defer stopCluster()
	repoDir := filepath.Join(c.Dir, "repo")
	repo := httptest.NewServer(http.FileServer(http.Dir(repoDir)))
	defer repo.Close()
	publish := func(version string) error {
		if _, err := helmtest.PackageAs(filepath.Join(root, "test", "charts", "webapp"), version, repoDir); err != nil {
			return err
		}
		return helmtest.WriteIndex(repoDir, repo.URL)
	}
	if err := publish("1.0.0"); err != nil {
		return res, err
	}
	watchesFile := filepath.Join(c.Dir, "watches.yaml")
	if err := os.WriteFile(watchesFile, []byte(fmt.Sprintf(
		"- {group: test.chartpilot.dev, version: v1alpha1, kind: Webapp, chart: {repo: %q, name: webapp, interval: 10s}, maxConcurrentReconciles: %d, maxConcurrentUpgrades: %d}\n",
		repo.URL, concurrency, bound)), 0o644); err != nil {
		return res, err
	}
	metricsAddr, op, stop, err := startOperator(c, root, watchesFile)
	if err != nil {
		return res, err
	}
	defer func() { stop() }()
	ns := "wave"
	if _, err := cs.CoreV1().Namespaces().Create(ctx, nsObject(ns), metav1.CreateOptions{}); err != nil {
		return res, err
	}
	start := time.Now()
	if err := createWebapps(ctx, dyn, n, func(int) string { return ns }); err != nil {
		return res, err
	}
	if err := waitAllOn(ctx, dyn, n, "1.0.0", 20*time.Minute); err != nil {
		return res, err
	}
	res.install = time.Since(start)
	logf("wave N=%d: installed in %s; publishing 1.0.1", n, res.install.Round(time.Millisecond))

	var mu sync.Mutex
	url := "http://" + metricsAddr + "/metrics"
	before, err := scrape(url)
	if err != nil {
		return res, err
	}
	done := make(chan struct{})
	go func() {
		for {
			select {
			case <-done:
				return
			case <-time.After(100 * time.Millisecond):
			}
			mu.Lock()
			u := url
			mu.Unlock()
			if m, err := scrape(u); err == nil {
				mu.Lock()
				res.peak = math.Max(res.peak, m.sum("chartpilot_upgrades_in_progress", nil))
				res.peakWaiting = math.Max(res.peakWaiting, m.sum("chartpilot_rollout_waiting", map[string]string{"reason": "UpgradeQueued"}))
				mu.Unlock()
			}
		}
	}()
	start = time.Now()
	if err := publish("1.0.1"); err != nil {
		return res, err
	}
	helmBefore := 0.0
	for k := range kills {
		time.Sleep(killEvery)
		if m, err := scrape(url); err == nil {
			helmBefore += m.sum("chartpilot_helm_action_duration_seconds_count", nil) - before.sum("chartpilot_helm_action_duration_seconds_count", nil)
		}
		logf("wave N=%d: SIGKILL %d of %d", n, k+1, kills)
		_ = op.Process.Kill()
		stop()
		var addr string
		if addr, op, stop, err = startOperator(c, root, watchesFile); err != nil {
			return res, err
		}
		mu.Lock()
		url = "http://" + addr + "/metrics"
		mu.Unlock()
		before = metrics{}
	}
	err = waitAllOn(ctx, dyn, n, "1.0.1", 30*time.Minute)
	res.wave = time.Since(start)
	close(done)
	if err != nil {
		return res, err
	}
	after, err := scrape(url)
	if err != nil {
		return res, err
	}
	res.helm = helmBefore + after.sum("chartpilot_helm_action_duration_seconds_count", nil) - before.sum("chartpilot_helm_action_duration_seconds_count", nil)
	records, err := cs.CoreV1().Secrets(ns).List(ctx, metav1.ListOptions{LabelSelector: "owner=helm"})
	if err != nil {
		return res, err
	}
	for _, s := range records.Items {
		switch s.Labels["status"] {
		case "pending-install", "pending-upgrade", "pending-rollback":
			res.pending++
		}
		if v, _ := strconv.Atoi(s.Labels["version"]); v > 1 {
			res.revisions++
		}
	}
	mu.Lock()
	defer mu.Unlock()
	logf("wave N=%d: all on 1.0.1 after %s, peak %.0f upgrading at once", n, res.wave.Round(time.Millisecond), res.peak)
	return res, nil
}

// waitAllOn waits until n resources are Ready for their current
// generation with chart version deployed ("" for any version). It follows
// the resources with one LIST and a WATCH (an informer), so that watching
// the fleet does not load the API server it measures.
func waitAllOn(ctx context.Context, dyn dynamic.Interface, n int, version string, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	inf := dynamicinformer.NewDynamicSharedInformerFactory(dyn, 0).ForResource(gvr).Informer()
	go inf.Run(ctx.Done())
	on := 0
	for ctx.Err() == nil {
		if inf.HasSynced() {
			on = 0
			for _, o := range inf.GetStore().List() {
				if u, ok := o.(*unstructured.Unstructured); ok && readyOn(u, version) {
					on++
				}
			}
			if on >= n {
				return nil
			}
		}
		time.Sleep(250 * time.Millisecond)
	}
	return fmt.Errorf("only %d of %d resources Ready (chart version %q) after %s", on, n, version, timeout)
}

// readyOn reports whether u is Ready for its generation with chart version
// deployed ("" for any).
func readyOn(u *unstructured.Unstructured, version string) bool {
	if v, _, _ := unstructured.NestedString(u.Object, "status", "chart", "deployedVersion"); version != "" && v != version {
		return false
	}
	conds, _, _ := unstructured.NestedSlice(u.Object, "status", "conditions")
	for _, c := range conds {
		m, _ := c.(map[string]any)
		gen, _ := m["observedGeneration"].(int64)
		if m["type"] == "Ready" && m["status"] == "True" && gen == u.GetGeneration() {
			return true
		}
	}
	return false
}

func printWave(rows []waveResult) {
	if len(rows) == 0 {
		return
	}
	fmt.Println("\nUpgrade wave — webapp 1.0.0 → 1.0.1 published in a loopback chart repository (refresh interval 10s); wave = publish until every resource is Ready on 1.0.1 (includes up to one refresh interval)")
	fmt.Println()
	fmt.Println("| N | maxConcurrentUpgrades | operator SIGKILLs during wave | install (s) | wave (s) | upgrades/s | peak upgrading at once | peak queued | Helm actions in wave | revisions stored by the wave | releases left pending |")
	fmt.Println("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
	for _, r := range rows {
		fmt.Printf("| %d | %d | %d | %.1f | %.1f | %.1f | %.0f | %.0f | %.0f | %d | %d |\n", r.n, r.bound, r.kills, r.install.Seconds(), r.wave.Seconds(), float64(r.n)/r.wave.Seconds(), r.peak, r.peakWaiting, r.helm, r.revisions, r.pending)
	}
	fmt.Println("\nPeaks are sampled every 100 ms from the operator's gauges (after a SIGKILL, from the new process). Helm actions are summed from each process's metrics (a kill loses what its process did since the last scrape); revisions are counted from the release records: one per resource means no upgrade was retried.")
}
