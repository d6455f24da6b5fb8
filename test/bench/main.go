// Command bench measures chartpilot on the local cluster and prints a table.
//
//	go run ./test/bench -n 100,500
//
// For each N it starts a fresh full-tier cluster, runs bin/chartpilot as its
// own process, and measures:
//   - converge: N resources of a small passthrough chart (ConfigMap, Service,
//     Deployment) created at once; wall time until every one is Ready=True;
//   - reconcile request: chartpilot.dev/reconcile-requested-at bumped on every
//     resource (which also checks drift); the operator's API requests by verb
//     (from its own client metrics), Helm actions run, releases rendered;
//   - resync: a label touched on every resource (a plain re-reconcile, the
//     same path as the periodic resync); same figures;
//   - idle: 30 seconds with nothing to do; API requests by verb;
//   - the operator's peak RSS (VmHWM) and peak Go heap in use;
//   - upgrade wave (-wave 200): N resources installed from a loopback chart
//     repository, then a patch version published; wall time until every one
//     is Ready on it, and the peak number upgrading at once;
//   - crash matrix (-crashes 200 -kills 3): install, values upgrade and
//     delete of N resources with the operator SIGKILLed at random moments
//     during each; what each phase leaves behind (pending or failed
//     revisions, revisions repeating the same inputs, objects and records
//     left after the delete);
//   - faults (-faults 0,5,10,20 -fault-n 100): the operator behind a proxy
//     that faults that share of its requests; create and upgrade times and
//     requests (audit log) relative to no faults;
//   - failover (-failovers 5): the primary of three `chartpilot instance`
//     members SIGKILLed under writes, that many times; time to the first
//     write on the new primary, rows lost;
//   - CLI (-cli-n 5000): chartpilot get / rollout status over a fleet of
//     that many Postgres resources (objects with a status; no operator):
//     wall time and requests (audit log);
//   - major upgrade (-major-mb 1024): a database of that size moved from
//     PostgreSQL 15 to 17 (dump, restore, checksums compared);
//   - backup (-backup-mb 1024): a database of that size backed up and
//     restored through chartpilot's data path to a local S3 server, beside
//     plain pg_dump | zstd to a file, in the same run;
//   - restore (-load-mb 1024): a database of that size, its table owned by
//     an application role, fully restored into a new server and drilled
//     into its own, each table's rows loaded as its owner, beside one
//     pg_restore as the superuser (how both loaded before), in the same run;
//   - real pods (-real-failovers 5 -real-mb 1024): test/nodes' failover,
//     backup and major-upgrade tests on real pods, the primary kept down
//     past its Lease that many times and that many MiB added to the
//     databases: failover times, backup and restore time and size, major
//     upgrade time, rows lost.
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/dynamic/dynamicinformer"
	"k8s.io/client-go/kubernetes"

	"github.com/chartpilot/chartpilot/internal/agent/instance/instancetest"
	"github.com/chartpilot/chartpilot/internal/testing/testcluster"
)

// profileDir, when set, receives heap profiles of the operator.
var profileDir string

// gcPercent, when set, is the operator's --gc-percent.
var gcPercent int

var gvr = schema.GroupVersionResource{Group: "test.chartpilot.dev", Version: "v1alpha1", Resource: "webapps"}

func main() {
	ns := flag.String("n", "100,500", "comma-separated numbers of resources to converge")
	concurrency := flag.Int("concurrency", 10, "maxConcurrentReconciles of the benchmark's watch")
	economyBound := flag.Int("economy-max-upgrades", 5, "maxConcurrentUpgrades of the main table's watch")
	idle := flag.Duration("idle", 30*time.Second, "idle period measured after convergence")
	wave := flag.String("wave", "200", "comma-separated numbers of resources for the upgrade wave (empty: none)")
	bound := flag.Int("max-upgrades", 5, "maxConcurrentUpgrades of the upgrade wave's watch")
	kills := flag.Int("kills", 3, "SIGKILLs of the operator during each phase (install, upgrade, delete) of the crash matrix")
	crashes := flag.Int("crashes", 200, "resources in the crash matrix (0: skip it)")
	faults := flag.String("faults", "0,5,10,20", "comma-separated percentages of the operator's requests faulted in the faults table (empty: none)")
	faultN := flag.Int("fault-n", 100, "resources in the faults table")
	cliN := flag.Int("cli-n", 5000, "Postgres resources in the CLI table (0: skip)")
	majorMB := flag.Int("major-mb", 1024, "MiB of the database moved from PostgreSQL 15 to 17 in the major upgrade table (0: skip)")
	failovers := flag.Int("failovers", 5, "primary failovers measured in the failover table (0: skip)")
	loadMB := flag.Int("load-mb", 1024, "MiB of the database restored and drilled in the restore table (0: skip)")
	backupMB := flag.Int("backup-mb", 1024, "MiB of the database backed up and restored in the backup table (0: skip)")
	pitrMB := flag.Int("pitr-mb", 1024, "MiB of the database archived, base-backed-up and recovered in the point-in-time recovery table (0: skip)")
	realFailovers := flag.Int("real-failovers", 5, "failovers of a primary kept down past its Lease on real pods, with test/nodes' backup and major-upgrade tests (0: skip the real pods' tables; needs root)")
	realMB := flag.Int("real-mb", 1024, "MiB added to the databases backed up and upgraded on real pods")
	flag.IntVar(&gcPercent, "gc-percent", 0, "the operator's --gc-percent (0: its default)")
	flag.StringVar(&profileDir, "profile", "", "write the operator's heap profile after install and after upgrade, and its CPU profile of the upgrade wave's first 60 s, into this directory (go tool pprof reads them)")
	flag.Parse()
	root, err := testcluster.ModuleRoot()
	if err != nil {
		fail(err)
	}
	var rows []result
	for _, f := range strings.Split(*ns, ",") {
		if strings.TrimSpace(f) == "" {
			continue
		}
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n <= 0 {
			fail(fmt.Errorf("-n: %q is not a positive number", f))
		}
		r, err := runOne(root, n, *concurrency, *economyBound, *idle)
		if err != nil {
			fail(fmt.Errorf("with %d resources: %w", n, err))
		}
		rows = append(rows, r)
	}
	var waves []waveResult
	for _, f := range strings.Split(*wave, ",") {
		if strings.TrimSpace(f) == "" {
			continue
		}
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n <= 0 {
			fail(fmt.Errorf("-wave: %q is not a positive number", f))
		}
		w, err := runWave(root, n, *bound, *concurrency, 0)
		if err != nil {
			fail(fmt.Errorf("upgrade wave with %d resources: %w", n, err))
		}
		waves = append(waves, w)
	}
	var crashRows []crashRow
	if *crashes > 0 && *kills > 0 {
		var err error
		if crashRows, err = runCrashes(root, *crashes, *bound, *concurrency, *kills); err != nil {
			fail(fmt.Errorf("crash matrix: %w", err))
		}
	}
	var rates []float64
	for _, f := range strings.Split(*faults, ",") {
		if strings.TrimSpace(f) == "" {
			continue
		}
		p, err := strconv.ParseFloat(strings.TrimSpace(f), 64)
		if err != nil || p < 0 || p >= 100 {
			fail(fmt.Errorf("-faults: %q is not a percentage below 100", f))
		}
		rates = append(rates, p/100)
	}
	var faultRows []faultRow
	if len(rates) > 0 {
		var err error
		if faultRows, err = runFaults(root, *faultN, *concurrency, rates); err != nil {
			fail(fmt.Errorf("faults table: %w", err))
		}
	}
	backupRows := table(*backupMB > 0, "backup table", func() ([]backupRow, error) { return runBackupBench(*backupMB) })
	pitr := table(*pitrMB > 0, "point-in-time recovery table", func() (*pitrResult, error) { return runPITRBench(root, *pitrMB) })
	failoverRows := table(*failovers > 0, "failover table", func() ([]instancetest.Result, error) { return runFailoverBench(root, *failovers) })
	cliRows := table(*cliN > 0, "CLI table", func() ([]cliRow, error) { return runCLIBench(root, *cliN) })
	var loadRows []loadRow
	var loadDBMB float64
	if *loadMB > 0 {
		var err error
		if loadRows, loadDBMB, err = runLoadBench(*loadMB); err != nil {
			fail(fmt.Errorf("restore table: %w", err))
		}
	}
	var major *majorRow
	if *majorMB > 0 {
		r, err := runMajorBench(root, *majorMB)
		if err != nil {
			fail(fmt.Errorf("major upgrade table: %w", err))
		}
		major = &r
	}
	realPods := table(*realFailovers > 0, "real pods' tables", func() (*realPodsResult, error) { return runRealPodsBench(root, *realFailovers, *realMB) })
	printTable(rows, *concurrency, *economyBound)
	printWave(waves)
	printCrashes(crashRows)
	printFaults(*faultN, faultRows)
	printBackup(backupRows)
	printPITR(pitr)
	printFailover(failoverRows)
	printLoad(loadRows, loadDBMB)
	printMajor(major)
	printCLI(*cliN, cliRows)
	printRealPods(realPods)
}

// table runs one table of the benchmark when on (what names it in a
// failure, which ends the benchmark); the zero value when off.
func table[T any](on bool, what string, run func() (T, error)) T {
	var zero T
	if !on {
		return zero
	}
	v, err := run()
	if err != nil {
		fail(fmt.Errorf("%s: %w", what, err))
	}
	return v
}

func fail(err error) {
	fmt.Fprintf(os.Stderr, "bench: %v\n", err)
	os.Exit(1)
}

type phase struct {
	name    string
	req     testcluster.Requests // the operator's API requests, from the audit log
	passes  float64              // reconcile passes
	helm    float64              // Helm actions run
	skipped float64              // passes that rendered nothing (fast path)
	drift   float64              // drift checks
	wall    time.Duration
	// converged is how long the phase's action took: its writes and the
	// wait for its convergence rule, without the quiet period measure
	// waits for after it (zero: the same as wall).
	converged time.Duration
	// procs is the CPU seconds of each process of the bench's from the
	// phase's start to its convergence, and convMachine the machine's busy
	// CPU seconds over the same time.
	procs       procCPU
	convMachine float64
	// api is what the API server served every client until convergence.
	api     apiCounts
	cpu     float64 // the operator's CPU seconds
	machine float64 // the whole machine's busy CPU seconds (every core)
	self    float64 // the bench's own CPU seconds
	stolen  float64 // CPU seconds the hypervisor gave to others (steal)
}

// toConverge is how long p took to converge: its action's time when
// measured, else its wall time.
func (p phase) toConverge() float64 {
	if p.converged > 0 {
		return p.converged.Seconds()
	}
	return p.wall.Seconds()
}

// machineToConverge is the machine's busy CPU seconds until p converged.
func (p phase) machineToConverge() float64 {
	if p.converged > 0 {
		return p.convMachine
	}
	return p.machine
}

type result struct {
	n        int
	converge time.Duration
	upgrade  time.Duration
	phases   []phase
	peakRSS  float64 // MiB
	peakHeap float64 // MiB
	// peakAnon is the most anonymous memory resident (heap, stacks) seen,
	// peakFile the most resident pages of mapped files (the binary's code
	// and read-only data, mapped at start before any resource), in MiB.
	peakAnon, peakFile float64
	// series counts the operator's own metric series (chartpilot_*) by
	// name, after the upgrade.
	series map[string]int
	// get is how long `chartpilot get webapps -A` took over the fleet.
	get time.Duration
	// direct is the baseline without the operator, on the same cluster
	// (nil when not run); directWrites the same with chartpilot's own
	// writes added, run after the operator's phases.
	direct, directWrites *directResult
}

func runOne(root string, n, concurrency, bound int, idle time.Duration) (result, error) {
	res := result{n: n}
	ctx := context.Background()
	logf("N=%d: starting the full local cluster", n)
	c, dyn, cs, err := startCluster(ctx, root)
	if err != nil {
		return res, err
	}
	defer func() { _ = c.Stop() }()
	audit := &testcluster.AuditLog{Path: c.AuditLogPath}
	watchesFile := filepath.Join(c.Dir, "watches.yaml")
	if err := os.WriteFile(watchesFile, []byte(fmt.Sprintf(
		"- {group: test.chartpilot.dev, version: v1alpha1, kind: Webapp, chart: %s, maxConcurrentReconciles: %d, maxConcurrentUpgrades: %d}\n",
		filepath.Join(root, "test", "charts", "webapp"), concurrency, bound)), 0o644); err != nil {
		return res, err
	}
	nsOf, err := benchNamespaces(ctx, cs)
	if err != nil {
		return res, err
	}
	if res.direct, err = directIf(ctx, c, root, audit, n, concurrency, nsOf); err != nil {
		return res, err
	}
	if _, err := audit.Take(operatorUser); err != nil {
		return res, err
	}
	metricsAddr, op, stopOp, err := startOperator(c, root, watchesFile)
	if err != nil {
		return res, err
	}
	defer func() { stopOp() }()

	// Sample peak heap and resident memory while the operator works.
	sampling := sampleMemory(op.Process.Pid, metricsAddr)
	logf("N=%d: creating %d resources", n, n)
	install, err := measure(audit, metricsAddr, op, "install (create → all Ready)", n, func() error {
		start := time.Now()
		if err := createWebapps(ctx, dyn, n, nsOf); err != nil {
			return err
		}
		if err := waitAllOn(ctx, dyn, n, "", 20*time.Minute); err != nil {
			return err
		}
		res.converge = time.Since(start)
		return nil
	})
	if err != nil {
		return res, err
	}
	logf("N=%d: converged in %s", n, res.converge.Round(time.Millisecond))
	res.phases = append(res.phases, install)
	heapProfile(metricsAddr, fmt.Sprintf("heap-%d-install.pb.gz", n))

	patchAll := func(patch func(i int) string) error {
		return parallel(n, 16, func(i int) error {
			_, err := dyn.Resource(gvr).Namespace(nsOf(i)).Patch(ctx, fmt.Sprintf("app-%04d", i),
				types.MergePatchType, []byte(patch(i)), metav1.PatchOptions{})
			return err
		})
	}
	cpuDone := cpuProfile(metricsAddr, fmt.Sprintf("cpu-%d-upgrade.pb.gz", n))
	upgrade, err := measure(audit, metricsAddr, op, "upgrade (values change → all Ready)", n, func() error {
		start := time.Now()
		if err := patchAll(func(i int) string { return fmt.Sprintf(`{"spec":{"message":"hello again %d"}}`, i) }); err != nil {
			return err
		}
		if err := waitAllOn(ctx, dyn, n, "", 20*time.Minute); err != nil {
			return err
		}
		res.upgrade = time.Since(start)
		return nil
	})
	if err != nil {
		return res, err
	}
	res.phases = append(res.phases, upgrade)
	writes, err := captureWritesIf(ctx, res.direct != nil, cs, dyn, nsOf(0))
	if err != nil {
		return res, err
	}
	cpuDone()
	heapProfile(metricsAddr, fmt.Sprintf("heap-%d-upgrade.pb.gz", n))
	getStart := time.Now()
	if out, err := exec.Command(filepath.Join(root, "bin", "chartpilot"), "get", "webapps", "-A", "--kubeconfig", c.KubeconfigPath).Output(); err != nil {
		return res, fmt.Errorf("chartpilot get: %w", err)
	} else if lines := strings.Count(string(out), "\n"); lines != n+1 {
		return res, fmt.Errorf("chartpilot get listed %d lines for %d resources", lines, n)
	}
	res.get = time.Since(getStart)
	if m, err := scrape("http://" + metricsAddr + "/metrics"); err == nil {
		res.series = map[string]int{}
		for name, samples := range m {
			if strings.HasPrefix(name, "chartpilot_") {
				res.series[name] = len(samples)
			}
		}
	}
	for _, ph := range []struct {
		name  string
		patch func(int) string
	}{
		{"reconcile request (+drift check)", func(int) string {
			return `{"metadata":{"annotations":{"chartpilot.dev/reconcile-requested-at":"` + time.Now().Format(time.RFC3339Nano) + `"}}}`
		}},
		{"resync (label touch)", func(int) string { return `{"metadata":{"labels":{"bench-touch":"1"}}}` }},
	} {
		p, err := measure(audit, metricsAddr, op, ph.name, n, func() error { return patchAll(ph.patch) })
		if err != nil {
			return res, err
		}
		res.phases = append(res.phases, p)
	}
	res.peakHeap, res.peakAnon, res.peakFile = sampling()
	// Idle: nothing scrapes the operator meanwhile, so its CPU time is its own.
	if _, err := audit.Take(operatorUser); err != nil {
		return res, err
	}
	cpu0, _ := cpuSeconds(op.Process.Pid)
	busy0, steal0, _ := machineBusySeconds()
	self0, _ := cpuSeconds(os.Getpid())
	time.Sleep(idle)
	cpu1, _ := cpuSeconds(op.Process.Pid)
	busy1, steal1, _ := machineBusySeconds()
	self1, _ := cpuSeconds(os.Getpid())
	time.Sleep(time.Second) // the audit log is written as requests complete
	p := phase{wall: idle, cpu: cpu1 - cpu0, machine: busy1 - busy0, self: self1 - self0, stolen: steal1 - steal0}
	if p.req, err = audit.Take(operatorUser); err != nil {
		return res, err
	}
	p.name = fmt.Sprintf("idle %s (%.2f CPU-s per minute)", idle, p.cpu/idle.Minutes())
	logf("%s: %d requests", p.name, p.req.Total)
	res.phases = append(res.phases, p)
	if res.peakRSS, err = peakRSS(op.Process.Pid); err != nil {
		return res, err
	}

	// Restart over the converged fleet: a new process, from its start
	// until it has been quiet for a while.
	stopOp()
	if _, err := audit.Take(operatorUser); err != nil {
		return res, err
	}
	start := time.Now()
	var addr string
	if addr, op, stopOp, err = startOperator(c, root, watchesFile); err != nil {
		return res, err
	}
	restart, err := measure(audit, addr, op, "restart (new process over the converged fleet)", n, func() error { return nil })
	if err != nil {
		return res, err
	}
	restart.wall = time.Since(start)
	res.phases = append(res.phases, restart)

	del, err := measure(audit, addr, op, "delete (all → gone)", n, func() error {
		if err := parallel(n, 16, func(i int) error {
			return dyn.Resource(gvr).Namespace(nsOf(i)).Delete(ctx, fmt.Sprintf("app-%04d", i), metav1.DeleteOptions{})
		}); err != nil {
			return err
		}
		return waitGone(ctx, dyn, 20*time.Minute)
	})
	if err != nil {
		return res, err
	}
	res.phases = append(res.phases, del)
	res.directWrites, err = directWritesIf(ctx, c, root, audit, n, concurrency, nsOf, writes, stopOp)
	return res, err
}

// sampleMemory samples the operator's peak heap (its gauge, every 2 s: a
// scrape of its metrics costs it CPU, at every 0.5 s a twentieth of its
// CPU in the upgrade wave) and its peak resident memory (from /proc, which
// costs it nothing, every 0.5 s) until the returned function is called,
// which returns them: heap in MiB, anonymous and file pages as rssParts.
func sampleMemory(pid int, metricsAddr string) func() (heap, anon, file float64) {
	var mu sync.Mutex
	peakHeap, peakAnon, peakFile := 0.0, 0.0, 0.0
	stop := make(chan struct{})
	go func() {
		for tick := 0; ; tick++ {
			select {
			case <-stop:
				return
			case <-time.After(500 * time.Millisecond):
			}
			if tick%4 == 3 {
				if m, err := scrape("http://" + metricsAddr + "/metrics"); err == nil {
					mu.Lock()
					peakHeap = math.Max(peakHeap, m.sum("go_memstats_heap_inuse_bytes", nil))
					mu.Unlock()
				}
			}
			if anon, file, err := rssParts(pid); err == nil {
				mu.Lock()
				peakAnon, peakFile = math.Max(peakAnon, anon), math.Max(peakFile, file)
				mu.Unlock()
			}
		}
	}()
	return func() (float64, float64, float64) {
		close(stop)
		mu.Lock()
		defer mu.Unlock()
		return peakHeap / (1 << 20), peakAnon, peakFile
	}
}

// benchNamespaces makes the 10 namespaces a fleet is spread over, and
// says which one the i-th resource is in.
func benchNamespaces(ctx context.Context, cs kubernetes.Interface) (func(int) string, error) {
	namespaces := make([]string, 10)
	for i := range namespaces {
		namespaces[i] = fmt.Sprintf("bench-%d", i)
		if _, err := cs.CoreV1().Namespaces().Create(ctx, nsObject(namespaces[i]), metav1.CreateOptions{}); err != nil {
			return nil, err
		}
	}
	return func(i int) string { return namespaces[i%len(namespaces)] }, nil
}

// waitGone waits until no resource of the kind is left (following them
// with an informer, as waitAllOn does).
func waitGone(ctx context.Context, dyn dynamic.Interface, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	inf := dynamicinformer.NewDynamicSharedInformerFactory(dyn, 0).ForResource(gvr).Informer()
	go inf.Run(ctx.Done())
	left := -1
	for ctx.Err() == nil {
		if inf.HasSynced() {
			if left = len(inf.GetStore().ListKeys()); left == 0 {
				return nil
			}
		}
		time.Sleep(250 * time.Millisecond)
	}
	return fmt.Errorf("%d resources left after %s", left, timeout)
}

// startKeptCluster starts a cluster for a part of the bench; stop stops
// it, first copying the operator's log to /tmp/chartpilot-bench-<part>.log
// for a look afterwards.
func startKeptCluster(ctx context.Context, root, part string) (*testcluster.Cluster, dynamic.Interface, kubernetes.Interface, func(), error) {
	c, dyn, cs, err := startCluster(ctx, root)
	if err != nil {
		return nil, nil, nil, nil, err
	}
	stop := func() {
		if data, err := os.ReadFile(filepath.Join(c.LogDir, "chartpilot.log")); err == nil {
			_ = os.WriteFile(filepath.Join(os.TempDir(), "chartpilot-bench-"+part+".log"), data, 0o644)
		}
		_ = c.Stop()
	}
	return c, dyn, cs, stop, nil
}

// startCluster starts a full-tier local cluster with the test CRDs.
func startCluster(ctx context.Context, root string) (*testcluster.Cluster, dynamic.Interface, kubernetes.Interface, error) {
	c, err := testcluster.Start(ctx, testcluster.Options{Tier: testcluster.TierFull, CRDDirs: []string{filepath.Join(root, "test", "crds")}, AuditUsers: []string{operatorUser, directUser}})
	if err != nil {
		return nil, nil, nil, err
	}
	dyn, err := dynamic.NewForConfig(c.Config)
	if err == nil {
		var cs kubernetes.Interface
		if cs, err = kubernetes.NewForConfig(c.Config); err == nil {
			apiServer = cs // the newest cluster's, for snapAPI and profiles
			return c, dyn, cs, nil
		}
	}
	_ = c.Stop()
	return nil, nil, nil, err
}

// createWebapps creates app-0000 … app-<n-1>, 16 at a time, in namespace(i).
func createWebapps(ctx context.Context, dyn dynamic.Interface, n int, namespace func(i int) string) error {
	return parallel(n, 16, func(i int) error {
		u := &unstructured.Unstructured{}
		u.SetAPIVersion("test.chartpilot.dev/v1alpha1")
		u.SetKind("Webapp")
		u.SetName(fmt.Sprintf("app-%04d", i))
		u.Object["spec"] = map[string]any{"message": fmt.Sprintf("hello %d", i)}
		_, err := dyn.Resource(gvr).Namespace(namespace(i)).Create(ctx, u, metav1.CreateOptions{})
		return err
	})
}

// startOperator runs bin/chartpilot against c as its own process.
func startOperator(c *testcluster.Cluster, root, watchesFile string) (string, *exec.Cmd, func(), error) {
	// The operator authenticates as its own user, whose every request the
	// API server's audit log records.
	kubeconfig, err := c.User(operatorUser, []string{"system:masters"})
	if err != nil {
		return "", nil, nil, err
	}
	return startOperatorWith(c, root, watchesFile, kubeconfig)
}

// startOperatorWith runs bin/chartpilot with the given kubeconfig.
func startOperatorWith(c *testcluster.Cluster, root, watchesFile, kubeconfig string) (string, *exec.Cmd, func(), error) {
	addrs, err := freeAddrs(3)
	if err != nil {
		return "", nil, nil, err
	}
	metricsAddr, probeAddr := addrs[0], addrs[1]
	pprofAddrs[metricsAddr] = addrs[2]
	logPath := filepath.Join(c.LogDir, "chartpilot.log")
	// Appended: after a kill, the next process's log follows the last one's.
	logFile, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return "", nil, nil, err
	}
	// chartpilot-manager, as the image runs it: the manager without the
	// backup data path's object-store clients.
	op := exec.Command(filepath.Join(root, "bin", "chartpilot-manager"), "run",
		"--kubeconfig", kubeconfig, "--watches", watchesFile,
		"--metrics-bind-address", metricsAddr, "--health-probe-bind-address", probeAddr, "--pprof-bind-address", addrs[2],
		"--chart-cache-dir", filepath.Join(c.Dir, "chart-cache"))
	if gcPercent > 0 {
		op.Args = append(op.Args, "--gc-percent", fmt.Sprint(gcPercent))
	}
	op.Stdout, op.Stderr = logFile, logFile
	op.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := op.Start(); err != nil {
		logFile.Close()
		return "", nil, nil, fmt.Errorf("starting bin/chartpilot-manager (run make build): %w", err)
	}
	stop := func() {
		_ = op.Process.Signal(syscall.SIGTERM)
		_ = op.Wait()
		logFile.Close()
	}
	if err := waitHTTP("http://" + probeAddr + "/readyz"); err != nil {
		stop()
		return "", nil, nil, fmt.Errorf("operator not ready (log %s): %w", logPath, err)
	}
	return metricsAddr, op, stop, nil
}

// measure runs action and reports the operator's work until it is quiet
// again: its API requests from the audit log, its passes and Helm actions
// from its metrics, its CPU time from /proc.
func measure(audit *testcluster.AuditLog, metricsAddr string, op *exec.Cmd, name string, passes int, action func() error) (phase, error) {
	url := "http://" + metricsAddr + "/metrics"
	if _, err := audit.Take(operatorUser); err != nil {
		return phase{}, err
	}
	before, err := scrape(url)
	if err != nil {
		return phase{}, err
	}
	cpu0, _ := cpuSeconds(op.Process.Pid)
	busy0, steal0, _ := machineBusySeconds()
	self0, _ := cpuSeconds(os.Getpid())
	procs0, api0 := snapProcCPU(), snapAPI()
	start := time.Now()
	if err := action(); err != nil {
		return phase{}, err
	}
	converged := time.Since(start)
	convBusy, _, _ := machineBusySeconds()
	procs, api := snapProcCPU().since(procs0), snapAPI().since(api0)
	// Wait until the operator has run the passes and then been quiet for 3s.
	deadline := time.Now().Add(10 * time.Minute)
	var after metrics
	last, quietSince := -1.0, time.Now()
	for time.Now().Before(deadline) {
		time.Sleep(500 * time.Millisecond)
		after, err = scrape(url)
		if err != nil {
			return phase{}, err
		}
		total := after.sum("chartpilot_reconcile_total", nil) - before.sum("chartpilot_reconcile_total", nil)
		if total != last {
			last, quietSince = total, time.Now()
			continue
		}
		if total >= float64(passes) && time.Since(quietSince) > 3*time.Second {
			break
		}
	}
	p := phase{name: name, wall: time.Since(start), converged: converged, procs: procs, convMachine: convBusy - busy0, api: api}
	cpu1, _ := cpuSeconds(op.Process.Pid)
	busy1, steal1, _ := machineBusySeconds()
	self1, _ := cpuSeconds(os.Getpid())
	p.cpu, p.machine, p.self, p.stolen = cpu1-cpu0, busy1-busy0, self1-self0, steal1-steal0
	time.Sleep(time.Second) // the audit log is written as requests complete
	if p.req, err = audit.Take(operatorUser); err != nil {
		return phase{}, err
	}
	p.passes = after.sum("chartpilot_reconcile_total", nil) - before.sum("chartpilot_reconcile_total", nil)
	p.helm = after.sum("chartpilot_helm_action_duration_seconds_count", nil) - before.sum("chartpilot_helm_action_duration_seconds_count", nil)
	p.skipped = after.sum("chartpilot_renders_skipped_total", nil) - before.sum("chartpilot_renders_skipped_total", nil)
	p.drift = after.sum("chartpilot_drift_checks_total", nil) - before.sum("chartpilot_drift_checks_total", nil)
	logf("%s: %d requests in %s (%s)", name, p.req.Total, p.wall.Round(time.Millisecond), p.req.Top(6))
	return p, nil
}

func parallel(n, workers int, f func(i int) error) error {
	var wg sync.WaitGroup
	errs := make(chan error, n)
	next := make(chan int)
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range next {
				if err := f(i); err != nil {
					errs <- err
				}
			}
		}()
	}
	for i := range n {
		next <- i
	}
	close(next)
	wg.Wait()
	close(errs)
	return <-errs
}

func waitHTTP(url string) error {
	deadline := time.Now().Add(2 * time.Minute)
	for time.Now().Before(deadline) {
		resp, err := http.Get(url)
		if err == nil {
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		time.Sleep(200 * time.Millisecond)
	}
	return fmt.Errorf("%s did not answer 200 within 2 minutes", url)
}

// freeAddrs returns n distinct free loopback addresses (all held open
// until every one is chosen, so that two calls cannot get the same port).
func freeAddrs(n int) ([]string, error) {
	var out []string
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		defer l.Close()
		out = append(out, l.Addr().String())
	}
	return out, nil
}

func logf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "bench: "+format+"\n", args...)
}

var verbs = []string{"get", "list", "watch", "create", "update", "patch", "delete"}

func printTable(rows []result, concurrency, bound int) {
	if len(rows) == 0 {
		return
	}
	fmt.Printf("\nchartpilot benchmark — passthrough chart (ConfigMap, Service, Deployment), full local cluster, maxConcurrentReconciles=%d, maxConcurrentUpgrades=%d, GOMAXPROCS host=%d cores\n\n", concurrency, bound, numCPU())
	fmt.Println("| N | install to all Ready (s) | installs/s | values upgrade to all Ready (s) | upgrades/s | peak RSS (MiB) | binary's pages (MiB) | peak anonymous (MiB) | peak heap (MiB) | RSS per resource (KiB) |")
	fmt.Println("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
	for _, r := range rows {
		fmt.Printf("| %d | %.1f | %.1f | %.1f | %.1f | %.0f | %.0f | %.0f | %.0f | %.0f |\n", r.n, r.converge.Seconds(), float64(r.n)/r.converge.Seconds(),
			r.upgrade.Seconds(), float64(r.n)/r.upgrade.Seconds(), r.peakRSS, r.peakFile, r.peakAnon, r.peakHeap, r.peakRSS*1024/float64(r.n))
	}
	fmt.Println("\nPeak RSS is VmHWM. The binary's pages are the resident pages of mapped files (RssFile: its code and read-only data, mapped at start before")
	fmt.Println("any resource, and the same at every N); peak anonymous is RssAnon (heap, stacks), sampled every 0.5 s; peak heap is the operator's gauge, every 2 s.")
	fmt.Println()
	fmt.Println("| N | phase | wall (s) | operator CPU (s) | machine CPU (s) | bench CPU (s) | stolen (s) | passes | Helm actions | fast-path passes | drift checks | requests | per resource | " + strings.Join(verbs, " | ") + " |")
	fmt.Println("|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|" + strings.Repeat("---:|", len(verbs)))
	for _, r := range rows {
		for _, p := range r.phases {
			cells := make([]string, 0, len(verbs))
			for _, v := range verbs {
				cells = append(cells, strconv.Itoa(p.req.ByVerb[v]))
			}
			fmt.Printf("| %d | %s | %.1f | %.1f | %.1f | %.1f | %.1f | %.0f | %.0f | %.0f | %.0f | %d | %.1f | %s |\n", r.n, p.name, p.wall.Seconds(), p.cpu, p.machine, p.self, p.stolen, p.passes, p.helm, p.skipped, p.drift,
				p.req.Total, perResource(p.req, r.n), strings.Join(cells, " | "))
		}
	}
	fmt.Printf("\nMachine CPU is the busy time of all %d cores over the phase (at most wall × %d): the operator, the cluster and the bench together; machine less operator and bench is the cluster's. Stolen is the time the hypervisor ran something else while the cores had work (steal): the phase had that much less CPU.\n", numCPU(), numCPU())
	for _, r := range rows {
		total := 0
		names := make([]string, 0, len(r.series))
		for name, k := range r.series {
			total += k
			names = append(names, name)
		}
		sort.Slice(names, func(i, j int) bool {
			return r.series[names[i]] > r.series[names[j]] || (r.series[names[i]] == r.series[names[j]] && names[i] < names[j])
		})
		parts := make([]string, 0, len(names))
		for _, name := range names {
			parts = append(parts, fmt.Sprintf("%s %d", name, r.series[name]))
		}
		fmt.Printf("\nN=%d: the operator's own metric series (chartpilot_*): %d in all, %.2f per resource: %s\n", r.n, total, float64(total)/float64(r.n), strings.Join(parts, ", "))
		fmt.Printf("N=%d: chartpilot get webapps -A (a process: discovery, one paged list): %.2f s\n", r.n, r.get.Seconds())
	}
	fmt.Println("\nRequests are counted from the API server's audit log (every request of the operator's user, each once); the largest by resource:")
	for _, r := range rows {
		for _, p := range r.phases {
			fmt.Printf("- N=%d %s: %s\n", r.n, p.name, p.req.Top(8))
		}
	}
	printDirect(rows)
}

func numCPU() int {
	b, err := os.ReadFile("/proc/cpuinfo")
	if err != nil {
		return 0
	}
	return strings.Count(string(b), "processor\t:")
}

func nsObject(name string) *corev1.Namespace {
	return &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}
}

// pprofAddrs maps an operator's metrics address to its profiles' address.
var pprofAddrs = map[string]string{}

// heapProfile saves the operator's heap profile (after a GC) when -profile is set.
func heapProfile(metricsAddr, name string) {
	if profileDir == "" {
		return
	}
	saveProfile("http://"+pprofAddrs[metricsAddr]+"/debug/pprof/heap?gc=1", name)
}

// cpuProfile records the operator's and the API server's CPU profiles
// over the next cpuProfileSeconds, when -profile is set; the returned
// function waits for them to be written.
func cpuProfile(metricsAddr, name string) func() {
	if profileDir == "" {
		return func() {}
	}
	got := make(chan struct{})
	go func() {
		defer close(got)
		saveProfile(fmt.Sprintf("http://%s/debug/pprof/profile?seconds=%d", pprofAddrs[metricsAddr], cpuProfileSeconds), name)
	}()
	apiDone := apiServerProfile(context.Background(), strings.TrimSuffix(name, ".pb.gz")+"-apiserver.pb.gz")
	return func() { <-got; apiDone() }
}

// apiServerProfile records the API server's CPU profile over the next
// cpuProfileSeconds, when -profile is set, the same way as cpuProfile.
func apiServerProfile(ctx context.Context, name string) func() {
	cs := apiServer
	if profileDir == "" || cs == nil {
		return func() {}
	}
	got := make(chan struct{})
	go func() {
		defer close(got)
		b, err := cs.CoreV1().RESTClient().Get().AbsPath("/debug/pprof/profile").
			Param("seconds", fmt.Sprint(cpuProfileSeconds)).Timeout(2 * cpuProfileSeconds * time.Second).DoRaw(ctx)
		if err == nil {
			err = os.WriteFile(filepath.Join(profileDir, name), b, 0o644)
		}
		if err != nil {
			logf("%s: %v", name, err)
		}
	}()
	return func() { <-got }
}

// saveProfile writes what url answers to name in the profile directory.
func saveProfile(url, name string) {
	resp, err := http.Get(url)
	if err != nil {
		logf("%s: %v", name, err)
		return
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if err := os.WriteFile(filepath.Join(profileDir, name), b, 0o644); err != nil {
		logf("%s: %v", name, err)
	}
}

// cpuProfileSeconds is how long the upgrade wave's CPU profile runs: the
// wave at N=500 takes about 80 s on two cores.
const cpuProfileSeconds = 60

// operatorUser is the user the benchmarked operator authenticates as: the
// API server's audit log records its requests, and only its.
const operatorUser = "chartpilot-operator"

// perResource is r's requests per resource (all of them when n is 0).
func perResource(r testcluster.Requests, n int) float64 {
	if n == 0 {
		return float64(r.Total)
	}
	return float64(r.Total) / float64(n)
}
