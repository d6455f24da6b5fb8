package main

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
)

// crashRow is one phase of the crash matrix.
type crashRow struct {
	phase      string
	n          int
	kills      int
	wall       time.Duration
	pending    int // revisions left pending-* (must be 0)
	failed     int // newest revisions failed (must be 0)
	duplicates int // revisions beyond the first with the same inputs (digest) in a release
	orphans    int // objects of a release left after its resource is gone (delete phase)
	records    int // release records left after the delete phase
}

// runCrashes installs, upgrades and deletes n resources with the operator
// killed (SIGKILL) kills times at random moments during each phase and
// started again, and checks what each phase leaves behind.
func runCrashes(root string, n, bound, concurrency, kills int) ([]crashRow, error) {
	ctx := context.Background()
	logf("crashes N=%d: starting the full local cluster", n)
	c, dyn, cs, stopCluster, err := startKeptCluster(ctx, root, "crashes")
	if err != nil {
		return nil, err
	}
	defer stopCluster()
	watchesFile := filepath.Join(c.Dir, "watches.yaml")
	if err := os.WriteFile(watchesFile, []byte(fmt.Sprintf(
		"- {group: test.chartpilot.dev, version: v1alpha1, kind: Webapp, chart: %s, maxConcurrentReconciles: %d, maxConcurrentUpgrades: %d}\n",
		filepath.Join(root, "test", "charts", "webapp"), concurrency, bound)), 0o644); err != nil {
		return nil, err
	}
	_, op, stop, err := startOperator(c, root, watchesFile)
	if err != nil {
		return nil, err
	}
	var mu sync.Mutex
	defer func() {
		mu.Lock()
		defer mu.Unlock()
		stop()
	}()
	const ns = "crashes"
	if _, err := cs.CoreV1().Namespaces().Create(ctx, nsObject(ns), metav1.CreateOptions{}); err != nil {
		return nil, err
	}
	rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 1))
	// during runs work while the operator is killed at random moments, 1 to
	// 5 s apart, until it has been killed kills times or work is done.
	during := func(work func() error) (int, error) {
		done := make(chan struct{})
		killed := make(chan int, 1)
		go func() {
			k := 0
			defer func() { killed <- k }()
			for k < kills {
				select {
				case <-done:
					return
				case <-time.After(time.Second + time.Duration(rng.Int64N(int64(4*time.Second)))):
				}
				mu.Lock()
				logf("crashes: SIGKILL %d of %d", k+1, kills)
				_ = op.Process.Kill()
				stop()
				var err error
				var next *exec.Cmd
				if _, next, stop, err = startOperator(c, root, watchesFile); err != nil {
					mu.Unlock()
					fail(err)
				}
				op = next
				mu.Unlock()
				k++
			}
		}()
		err := work()
		close(done)
		return <-killed, err
	}
	check := func(row *crashRow) error {
		records, err := cs.CoreV1().Secrets(ns).List(ctx, metav1.ListOptions{LabelSelector: "owner=helm"})
		if err != nil {
			return err
		}
		newest := map[string]int{}
		status := map[string]string{}
		digests := map[string]map[string]int{}
		for _, s := range records.Items {
			name, st := s.Labels["name"], s.Labels["status"]
			v, _ := strconv.Atoi(s.Labels["version"])
			switch st {
			case "pending-install", "pending-upgrade", "pending-rollback":
				row.pending++
			}
			if v > newest[name] {
				newest[name], status[name] = v, st
			}
			if digests[name] == nil {
				digests[name] = map[string]int{}
			}
			digests[name][s.Labels["chartpilot.dev/digest"]]++
		}
		for name, st := range status {
			if st == "failed" {
				row.failed++
			}
			for _, k := range digests[name] {
				row.duplicates += k - 1
			}
		}
		return nil
	}
	nsOf := func(int) string { return ns }
	var rows []crashRow
	for _, ph := range []struct {
		name string
		work func() error
	}{
		{"install", func() error {
			if err := createWebapps(ctx, dyn, n, nsOf); err != nil {
				return err
			}
			return waitAllOn(ctx, dyn, n, "", 30*time.Minute)
		}},
		{"values upgrade", func() error {
			if err := parallel(n, 16, func(i int) error {
				_, err := dyn.Resource(gvr).Namespace(ns).Patch(ctx, fmt.Sprintf("app-%04d", i),
					types.MergePatchType, []byte(fmt.Sprintf(`{"spec":{"message":"crash-upgraded %d"}}`, i)), metav1.PatchOptions{})
				return err
			}); err != nil {
				return err
			}
			return waitAllOn(ctx, dyn, n, "", 30*time.Minute)
		}},
		{"delete", func() error {
			if err := parallel(n, 16, func(i int) error {
				return dyn.Resource(gvr).Namespace(ns).Delete(ctx, fmt.Sprintf("app-%04d", i), metav1.DeleteOptions{})
			}); err != nil {
				return err
			}
			return waitGone(ctx, dyn, 30*time.Minute)
		}},
	} {
		row := crashRow{phase: ph.name, n: n}
		start := time.Now()
		if row.kills, err = during(ph.work); err != nil {
			return nil, fmt.Errorf("%s with kills: %w", ph.name, err)
		}
		row.wall = time.Since(start)
		if ph.name == "delete" {
			row.orphans, row.records, err = leftovers(ctx, cs, ns)
		} else {
			err = check(&row)
		}
		if err != nil {
			return nil, err
		}
		rows = append(rows, row)
	}
	return rows, nil
}

// leftovers counts the objects of releases (label chartpilot.dev/release)
// and the release records still in ns.
func leftovers(ctx context.Context, cs kubernetes.Interface, ns string) (objects, records int, err error) {
	sel := metav1.ListOptions{LabelSelector: "chartpilot.dev/release"}
	cms, err := cs.CoreV1().ConfigMaps(ns).List(ctx, sel)
	if err != nil {
		return 0, 0, err
	}
	svcs, err := cs.CoreV1().Services(ns).List(ctx, sel)
	if err != nil {
		return 0, 0, err
	}
	deps, err := cs.AppsV1().Deployments(ns).List(ctx, sel)
	if err != nil {
		return 0, 0, err
	}
	recs, err := cs.CoreV1().Secrets(ns).List(ctx, metav1.ListOptions{LabelSelector: "owner=helm"})
	if err != nil {
		return 0, 0, err
	}
	return len(cms.Items) + len(svcs.Items) + len(deps.Items), len(recs.Items), nil
}

func printCrashes(rows []crashRow) {
	if len(rows) == 0 {
		return
	}
	fmt.Printf("\nCrashes — the operator SIGKILLed at random moments (1–5 s apart) during each phase and started again\n\n")
	fmt.Println("| phase | N | SIGKILLs | to all converged (s) | revisions left pending | newest revisions failed | revisions repeating the same inputs | objects left after delete | records left after delete |")
	fmt.Println("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
	for _, r := range rows {
		fmt.Printf("| %s | %d | %d | %.1f | %d | %d | %d | %d | %d |\n", r.phase, r.n, r.kills, r.wall.Seconds(), r.pending, r.failed, r.duplicates, r.orphans, r.records)
	}
}
