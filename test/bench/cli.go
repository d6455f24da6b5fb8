package main

import (
	"context"
	"fmt"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"

	"github.com/chartpilot/chartpilot/internal/testing/testcluster"
)

// cliUser is the user the CLI runs as in the CLI table (its requests are
// counted from the audit log).
const cliUser = "fleet-reader"

type cliRow struct {
	command string
	wall    time.Duration
	req     testcluster.Requests
	lines   int
}

// runCLIBench makes a fleet of n Postgres resources over 10 namespaces on
// the API tier (objects with a status, as the operator writes it: no
// operator runs) and times the fleet commands of the CLI over it, as
// processes, counting their requests from the API server's audit log.
func runCLIBench(root string, n int) ([]cliRow, error) {
	ctx := context.Background()
	c, err := testcluster.Start(ctx, testcluster.Options{Tier: testcluster.TierAPI, BinDir: filepath.Join(root, "bin"), AuditUsers: []string{cliUser}})
	if err != nil {
		return nil, err
	}
	defer func() { _ = c.Stop() }()
	dyn, err := dynamic.NewForConfig(c.Config)
	if err != nil {
		return nil, err
	}
	cs, err := kubernetes.NewForConfig(c.Config)
	if err != nil {
		return nil, err
	}
	kubeconfig, err := c.User(cliUser, []string{"system:masters"})
	if err != nil {
		return nil, err
	}
	pg := schema.GroupVersionResource{Group: "chartpilot.dev", Version: "v1alpha1", Resource: "postgres"}
	const namespaces = 10
	for i := range namespaces {
		if _, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("team-%d", i)}}, metav1.CreateOptions{}); err != nil {
			return nil, err
		}
	}
	logf("cli: creating %d Postgres resources with a status", n)
	start := time.Now()
	work := make(chan int)
	errs := make(chan error, 16)
	var wg sync.WaitGroup
	for range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range work {
				if err := createWithStatus(ctx, dyn, pg, i, namespaces); err != nil {
					select {
					case errs <- err:
					default:
					}
				}
			}
		}()
	}
	for i := range n {
		work <- i
	}
	close(work)
	wg.Wait()
	select {
	case err := <-errs:
		return nil, err
	default:
	}
	logf("cli: fleet of %d made in %.0f s", n, time.Since(start).Seconds())
	audit := &testcluster.AuditLog{Path: c.AuditLogPath}
	if _, err := audit.Take(cliUser); err != nil {
		return nil, err
	}
	var rows []cliRow
	for _, args := range [][]string{{"get", "postgres", "-A"}, {"get", "-A"}, {"rollout", "status", "postgres"}, {"get", "postgres", "-A", "-o", "json"}} {
		start := time.Now()
		out, err := exec.Command(filepath.Join(root, "bin", "chartpilot"), append(args, "--kubeconfig", kubeconfig)...).Output()
		wall := time.Since(start)
		if err != nil {
			return nil, fmt.Errorf("chartpilot %s: %w", strings.Join(args, " "), err)
		}
		time.Sleep(time.Second) // the audit log is written asynchronously
		req, err := audit.Take(cliUser)
		if err != nil {
			return nil, err
		}
		rows = append(rows, cliRow{command: "chartpilot " + strings.Join(args, " "), wall: wall, req: req, lines: strings.Count(string(out), "\n")})
		logf("cli: chartpilot %s: %.2f s, %d requests: %s", strings.Join(args, " "), wall.Seconds(), req.Total, req.Top(6))
	}
	return rows, nil
}

// createWithStatus makes Postgres i with the status the operator would
// have written (Ready, a release, a chart version; every 7th one queued
// for an upgrade).
func createWithStatus(ctx context.Context, dyn dynamic.Interface, gvr schema.GroupVersionResource, i, namespaces int) error {
	ns := fmt.Sprintf("team-%d", i%namespaces)
	u := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "chartpilot.dev/v1alpha1", "kind": "Postgres",
		"metadata": map[string]any{"name": fmt.Sprintf("db-%05d", i), "namespace": ns},
		"spec":     map[string]any{"version": "17", "storage": map[string]any{"size": "1Gi"}},
	}}
	created, err := dyn.Resource(gvr).Namespace(ns).Create(ctx, u, metav1.CreateOptions{})
	if err != nil {
		return err
	}
	now := metav1.Now().UTC().Format(time.RFC3339)
	ready, reason, desired := "True", "UpgradeSucceeded", "0.3.0"
	if i%7 == 0 {
		ready, reason, desired = "False", "UpgradeQueued", "0.4.0"
	}
	created.Object["status"] = map[string]any{
		"observedGeneration": int64(1),
		"conditions":         []any{map[string]any{"type": "Ready", "status": ready, "reason": reason, "message": "m", "lastTransitionTime": now, "observedGeneration": int64(1)}},
		"release":            map[string]any{"name": created.GetName(), "revision": int64(2), "chartName": "postgresql", "chartVersion": "0.3.0", "status": "deployed"},
		"chart":              map[string]any{"name": "postgresql", "deployedVersion": "0.3.0", "desiredVersion": desired},
	}
	_, err = dyn.Resource(gvr).Namespace(ns).UpdateStatus(ctx, created, metav1.UpdateOptions{})
	return err
}

func printCLI(n int, rows []cliRow) {
	if len(rows) == 0 {
		return
	}
	fmt.Printf("\nThe CLI over a fleet of %d Postgres resources in 10 namespaces (each command a process with its own kubeconfig; requests from the API server's audit log)\n\n", n)
	fmt.Println("| command | wall (s) | requests | of which lists | lines out |")
	fmt.Println("|---|---:|---:|---:|---:|")
	for _, r := range rows {
		fmt.Printf("| `%s` | %.2f | %d | %d | %d |\n", r.command, r.wall.Seconds(), r.req.Total, r.req.ByVerb["list"], r.lines)
	}
}
