package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/chartpilot/chartpilot/internal/testing/testcluster"
)

// faultRow is one fault rate: a fleet created and then upgraded with that
// share of the operator's requests faulted.
type faultRow struct {
	rate             float64
	create, upgrade  time.Duration
	createReq        testcluster.Requests // reached the API server (audit log)
	upgradeReq       testcluster.Requests
	createInjected   int64
	upgradeInjected  int64
	revisions        int // release revisions stored by create and upgrade (2 per resource when nothing was redone)
	failedRevisions  int // of which failed
	pendingRevisions int // left pending at the end (must be 0)
}

// runFaults runs one operator through a fault-injecting proxy and, for each
// rate, creates n resources in fresh namespaces, waits until all are Ready,
// changes every resource's values, waits again, and deletes them (faults
// off). Times and requests are per rate; the first rate is the baseline.
func runFaults(root string, n, concurrency int, rates []float64) ([]faultRow, error) {
	ctx := context.Background()
	logf("faults N=%d: starting the full local cluster", n)
	c, dyn, cs, stopCluster, err := startKeptCluster(ctx, root, "faults")
	if err != nil {
		return nil, err
	}
	defer stopCluster()
	audit := &testcluster.AuditLog{Path: c.AuditLogPath}
	watchesFile := filepath.Join(c.Dir, "watches.yaml")
	if err := os.WriteFile(watchesFile, []byte(fmt.Sprintf(
		"- {group: test.chartpilot.dev, version: v1alpha1, kind: Webapp, chart: %s, maxConcurrentReconciles: %d}\n",
		filepath.Join(root, "test", "charts", "webapp"), concurrency)), 0o644); err != nil {
		return nil, err
	}
	userKubeconfig, err := c.User(operatorUser, []string{"system:masters"})
	if err != nil {
		return nil, err
	}
	upstream, err := clientcmd.BuildConfigFromFlags("", userKubeconfig)
	if err != nil {
		return nil, err
	}
	proxy, err := testcluster.StartFaultProxy(upstream, 0, 42)
	if err != nil {
		return nil, err
	}
	defer proxy.Close()
	proxyKubeconfig := filepath.Join(c.Dir, "kubeconfig-faults")
	if err := proxy.WriteKubeconfig(proxyKubeconfig); err != nil {
		return nil, err
	}
	_, _, stop, err := startOperatorWith(c, root, watchesFile, proxyKubeconfig)
	if err != nil {
		return nil, err
	}
	defer func() { stop() }()

	var rows []faultRow
	for k, rate := range rates {
		row := faultRow{rate: rate}
		namespaces := make([]string, 10)
		for i := range namespaces {
			namespaces[i] = fmt.Sprintf("faults-%d-%d", k, i)
			if _, err := cs.CoreV1().Namespaces().Create(ctx, nsObject(namespaces[i]), metav1.CreateOptions{}); err != nil {
				return nil, err
			}
		}
		nsOf := func(i int) string { return namespaces[i%len(namespaces)] }
		take := func() (testcluster.Requests, error) {
			time.Sleep(time.Second) // the audit log is written as requests complete
			return audit.Take(operatorUser)
		}
		if _, err := take(); err != nil {
			return nil, err
		}
		proxy.SetRate(rate)
		in0 := proxy.Injected()
		start := time.Now()
		if err := createWebapps(ctx, dyn, n, nsOf); err != nil {
			return nil, err
		}
		if err := waitAllOn(ctx, dyn, n, "", 30*time.Minute); err != nil {
			return nil, fmt.Errorf("create at %.0f%% faults: %w", rate*100, err)
		}
		row.create = time.Since(start)
		row.createInjected = proxy.Injected() - in0
		if row.createReq, err = take(); err != nil {
			return nil, err
		}
		logf("faults %.0f%%: created %d in %s, %d requests, %d faults", rate*100, n, row.create.Round(time.Millisecond), row.createReq.Total, row.createInjected)

		in0 = proxy.Injected()
		start = time.Now()
		if err := parallel(n, 16, func(i int) error {
			_, err := dyn.Resource(gvr).Namespace(nsOf(i)).Patch(ctx, fmt.Sprintf("app-%04d", i),
				types.MergePatchType, []byte(fmt.Sprintf(`{"spec":{"message":"upgraded %d"}}`, i)), metav1.PatchOptions{})
			return err
		}); err != nil {
			return nil, err
		}
		if err := waitAllOn(ctx, dyn, n, "", 30*time.Minute); err != nil {
			return nil, fmt.Errorf("upgrade at %.0f%% faults: %w", rate*100, err)
		}
		row.upgrade = time.Since(start)
		row.upgradeInjected = proxy.Injected() - in0
		if row.upgradeReq, err = take(); err != nil {
			return nil, err
		}
		logf("faults %.0f%%: upgraded %d in %s, %d requests, %d faults", rate*100, n, row.upgrade.Round(time.Millisecond), row.upgradeReq.Total, row.upgradeInjected)
		proxy.SetRate(0)

		for _, ns := range namespaces {
			records, err := cs.CoreV1().Secrets(ns).List(ctx, metav1.ListOptions{LabelSelector: "owner=helm"})
			if err != nil {
				return nil, err
			}
			for _, s := range records.Items {
				row.revisions++
				switch s.Labels["status"] {
				case "failed":
					row.failedRevisions++
				case "pending-install", "pending-upgrade", "pending-rollback":
					row.pendingRevisions++
				}
			}
		}
		rows = append(rows, row)
		if err := parallel(n, 16, func(i int) error {
			return dyn.Resource(gvr).Namespace(nsOf(i)).Delete(ctx, fmt.Sprintf("app-%04d", i), metav1.DeleteOptions{})
		}); err != nil {
			return nil, err
		}
		if err := waitGone(ctx, dyn, 20*time.Minute); err != nil {
			return nil, err
		}
	}
	return rows, nil
}

func printFaults(n int, rows []faultRow) {
	if len(rows) == 0 {
		return
	}
	base := rows[0]
	fmt.Printf("\nFaults — %d resources created, then every one's values changed, with a share of the operator's non-watch requests answered by a proxy with 429 (Retry-After: 1), 500, or passed on 2 s late (a third each); requests are those that reached the API server (audit log)\n\n", n)
	fmt.Println("| faults | create to all Ready (s) | × | requests per resource | × | faults injected | upgrade to all Ready (s) | × | requests per resource | × | faults injected | revisions stored | failed | left pending |")
	fmt.Println("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
	ratio := func(a, b float64) float64 {
		if b == 0 {
			return 0
		}
		return a / b
	}
	for _, r := range rows {
		cr, ur := float64(r.createReq.Total)/float64(n), float64(r.upgradeReq.Total)/float64(n)
		fmt.Printf("| %.0f%% | %.1f | %.2f | %.1f | %.2f | %d | %.1f | %.2f | %.1f | %.2f | %d | %d | %d | %d |\n",
			r.rate*100, r.create.Seconds(), ratio(r.create.Seconds(), base.create.Seconds()),
			cr, ratio(cr, float64(base.createReq.Total)/float64(n)), r.createInjected,
			r.upgrade.Seconds(), ratio(r.upgrade.Seconds(), base.upgrade.Seconds()),
			ur, ratio(ur, float64(base.upgradeReq.Total)/float64(n)), r.upgradeInjected,
			r.revisions, r.failedRevisions, r.pendingRevisions)
	}
}
