package main

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"flag"
	"fmt"
	"path/filepath"
	"sync/atomic"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	appslisters "k8s.io/client-go/listers/apps/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/chartpilot/chartpilot/internal/helm"
	"github.com/chartpilot/chartpilot/internal/testing/testcluster"
)

// directUser writes the direct baseline: the chart's objects with no
// operator and no Helm, its requests counted apart in the audit log.
const directUser = "bench-direct"

// directBaseline: -direct.
var directBaseline = flag.Bool("direct", true, "before each economy run, write the chart's objects directly (no operator, no Helm) on the same cluster, and print each phase of the operator as a ratio to it")

// directLabel marks the baseline's objects.
const directLabel = "bench-direct"

// directResult is the baseline's phases, as the operator's are measured:
// wall time, the machine's CPU, requests.
type directResult struct {
	create, bump, del phase
}

// directRun is one run of the baseline: its client, objects and the
// Deployments it follows.
type directRun struct {
	ctx     context.Context
	dyn     dynamic.Interface
	deps    appslisters.DeploymentLister
	audit   *testcluster.AuditLog
	n       int
	workers int
	nsOf    func(int) string
	objs    [][]*unstructured.Unstructured
	// extra, when set, adds chartpilot's own writes (directwrites.go).
	extra *chartpilotWrites
}

// runDirect writes the webapp chart's objects (ConfigMap, Service,
// Deployment) for n names with workers clients in parallel, directly, and
// waits for the same convergence the operator's phases wait for: every
// Deployment ready on its newest generation (the ConfigMap holds the
// message once its write returns). Then it changes the message (the
// ConfigMap, and the checksum annotation of the pod template, as the chart
// does), and deletes the objects. The cluster is the operator's, before
// the operator has any resource.
func runDirect(ctx context.Context, c *testcluster.Cluster, root string, audit *testcluster.AuditLog, n, workers int, nsOf func(int) string) (directResult, error) {
	return runDirectWith(ctx, c, root, audit, n, workers, nsOf, nil)
}

// runDirectWith is runDirect, with chartpilot's own writes added when
// extra is set.
func runDirectWith(ctx context.Context, c *testcluster.Cluster, root string, audit *testcluster.AuditLog, n, workers int, nsOf func(int) string, extra *chartpilotWrites) (directResult, error) {
	var res directResult
	kubeconfig, err := c.User(directUser, []string{"system:masters"})
	if err != nil {
		return res, err
	}
	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		return res, err
	}
	cfg.QPS, cfg.Burst = 200, 400
	d := &directRun{ctx: ctx, audit: audit, n: n, workers: workers, nsOf: nsOf, extra: extra}
	if d.dyn, err = dynamic.NewForConfig(cfg); err != nil {
		return res, err
	}
	if d.objs, err = renderDirect(root, n, nsOf); err != nil {
		return res, err
	}
	// Convergence is followed with the admin's client, as for the operator.
	cs, err := kubernetes.NewForConfig(c.Config)
	if err != nil {
		return res, err
	}
	factory := informers.NewSharedInformerFactoryWithOptions(cs, 0, informers.WithTweakListOptions(func(o *metav1.ListOptions) {
		o.LabelSelector = directLabel + "=true"
	}))
	inf := factory.Apps().V1().Deployments()
	d.deps = inf.Lister()
	stop := make(chan struct{})
	defer close(stop)
	factory.Start(stop)
	if !cache.WaitForCacheSync(stop, inf.Informer().HasSynced) {
		return res, fmt.Errorf("direct baseline: the Deployments' informer did not sync")
	}
	if res.create, err = d.phase("create", d.create, d.ready(""), n); err != nil {
		return res, err
	}
	bumped := messageSum("hello again")
	if res.bump, err = d.phase("bump", func() error { return d.bump(bumped) }, d.ready(bumped), n); err != nil {
		return res, err
	}
	res.del, err = d.phase("delete", d.delete, func() (int, error) {
		list, err := d.deps.List(labels.Everything())
		return n - len(list), err
	}, n)
	return res, err
}

// phase runs act and waits until converged counts want, measured as the
// operator's phases are.
func (d *directRun) phase(name string, act func() error, converged func() (int, error), want int) (phase, error) {
	if _, err := d.audit.Take(directUser); err != nil {
		return phase{}, err
	}
	busy0, steal0, _ := machineBusySeconds()
	procs0, api0 := snapProcCPU(), snapAPI()
	start := time.Now()
	if err := act(); err != nil {
		return phase{}, err
	}
	if err := waitCount(d.ctx, converged, want, 20*time.Minute); err != nil {
		return phase{}, fmt.Errorf("direct %s: %w", name, err)
	}
	p := phase{name: name, wall: time.Since(start), procs: snapProcCPU().since(procs0), api: snapAPI().since(api0)}
	busy1, steal1, _ := machineBusySeconds()
	p.machine, p.stolen = busy1-busy0, steal1-steal0
	time.Sleep(time.Second) // the audit log is written as requests complete
	var err error
	p.req, err = d.audit.Take(directUser)
	logf("direct %s: %d requests in %s", name, p.req.Total, p.wall.Round(time.Millisecond))
	return p, err
}

// ready counts the Deployments ready on their newest generation with the
// pod template's checksum sum ("": each its own first one).
func (d *directRun) ready(sum string) func() (int, error) {
	return func() (int, error) {
		list, err := d.deps.List(labels.Everything())
		count := 0
		for _, dep := range list {
			want := sum
			if want == "" {
				want = dep.Spec.Template.Annotations["checksum/config"]
			}
			if directReady(dep, want) {
				count++
			}
		}
		return count, err
	}
}

func (d *directRun) create() error {
	return parallel(d.n, d.workers, func(i int) error {
		return d.around(i, d.extra.beforeCreate, d.extra.afterCreate, func() error {
			for _, o := range d.objs[i] {
				if _, err := d.dyn.Resource(directGVR(o)).Namespace(o.GetNamespace()).Create(d.ctx, o, metav1.CreateOptions{}); err != nil {
					return err
				}
			}
			return nil
		})
	})
}

// around runs write for the i-th name, between before and after when
// chartpilot's writes are added.
func (d *directRun) around(i int, before, after func(context.Context, []*unstructured.Unstructured) error, write func() error) error {
	if d.extra != nil {
		if err := before(d.ctx, d.objs[i]); err != nil {
			return err
		}
	}
	if err := write(); err != nil {
		return err
	}
	if d.extra != nil {
		return after(d.ctx, d.objs[i])
	}
	return nil
}

// bump changes the message: the ConfigMap, and the pod template's checksum.
func (d *directRun) bump(sum string) error {
	cm := fmt.Sprintf(`{"data":{"message":%q}}`, "hello again")
	tpl := fmt.Sprintf(`{"spec":{"template":{"metadata":{"annotations":{"checksum/config":%q}}}}}`, sum)
	return parallel(d.n, d.workers, func(i int) error {
		return d.around(i, d.extra.beforeBump, d.extra.afterBump, func() error {
			for _, o := range d.objs[i] {
				patch := map[string]string{"ConfigMap": cm, "Deployment": tpl}[o.GetKind()]
				if patch == "" {
					continue
				}
				if _, err := d.dyn.Resource(directGVR(o)).Namespace(o.GetNamespace()).Patch(d.ctx, o.GetName(), types.MergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
					return err
				}
			}
			return nil
		})
	})
}

func (d *directRun) delete() error {
	return parallel(d.n, d.workers, func(i int) error {
		return d.around(i, d.extra.beforeDelete, d.extra.afterDelete, func() error {
			for _, o := range d.objs[i] {
				if err := d.dyn.Resource(directGVR(o)).Namespace(o.GetNamespace()).Delete(d.ctx, o.GetName(), metav1.DeleteOptions{}); err != nil {
					return err
				}
			}
			return nil
		})
	})
}

// directIf runs the baseline when -direct asks for it (nil when not).
func directIf(ctx context.Context, c *testcluster.Cluster, root string, audit *testcluster.AuditLog, n, workers int, nsOf func(int) string) (*directResult, error) {
	if !*directBaseline {
		return nil, nil
	}
	logf("N=%d: the direct baseline", n)
	d, err := runDirect(ctx, c, root, audit, n, workers, nsOf)
	return &d, err
}

// renderDirect renders the webapp chart for direct-0000 … direct-<n-1>,
// each with its own message, as the operator's fleet is: the objects of
// each name, labelled for the baseline.
func renderDirect(root string, n int, nsOf func(int) string) ([][]*unstructured.Unstructured, error) {
	ch, err := helm.LoadChart(filepath.Join(root, "test", "charts", "webapp"))
	if err != nil {
		return nil, err
	}
	out := make([][]*unstructured.Unstructured, n)
	for i := range n {
		name := fmt.Sprintf("direct-%04d", i)
		manifest, err := helm.Template(ch, name, nsOf(i), map[string]any{"message": "hello " + fmt.Sprint(i)}, "")
		if err != nil {
			return nil, err
		}
		objs, err := helm.ParseManifest(manifest)
		if err != nil {
			return nil, err
		}
		for _, o := range objs {
			l := o.GetLabels()
			if l == nil {
				l = map[string]string{}
			}
			l[directLabel] = "true"
			o.SetLabels(l)
			o.SetNamespace(nsOf(i))
		}
		if len(objs) != 3 {
			return nil, fmt.Errorf("the webapp chart rendered %d objects, want 3 (ConfigMap, Service, Deployment)", len(objs))
		}
		out[i] = objs
	}
	return out, nil
}

// directGVR is the resource of one of the chart's three kinds.
func directGVR(o *unstructured.Unstructured) schema.GroupVersionResource {
	switch o.GetKind() {
	case "ConfigMap":
		return schema.GroupVersionResource{Version: "v1", Resource: "configmaps"}
	case "Service":
		return schema.GroupVersionResource{Version: "v1", Resource: "services"}
	}
	return schema.GroupVersionResource{Group: "apps", Version: "v1", Resource: "deployments"}
}

// directReady: the Deployment runs its newest generation, every replica
// ready and updated, with the pod template's checksum sum.
func directReady(d *appsv1.Deployment, sum string) bool {
	replicas := int32(1)
	if d.Spec.Replicas != nil {
		replicas = *d.Spec.Replicas
	}
	return d.Spec.Template.Annotations["checksum/config"] == sum && d.Status.ObservedGeneration >= d.Generation &&
		d.Status.UpdatedReplicas == replicas && d.Status.ReadyReplicas == replicas && d.Status.AvailableReplicas == replicas
}

// messageSum is the chart's checksum/config of a message.
func messageSum(message string) string {
	s := sha256.Sum256([]byte(message))
	return hex.EncodeToString(s[:])
}

// waitCount waits until count says want.
func waitCount(ctx context.Context, count func() (int, error), want int, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	var have atomic.Int64
	for time.Now().Before(deadline) {
		n, err := count()
		if err != nil {
			return err
		}
		have.Store(int64(n))
		if n >= want {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
	return fmt.Errorf("%d of %d after %s", have.Load(), want, timeout)
}

// printDirect prints the baseline beside the operator's phases of the same
// run, as ratios, with where the difference goes.
func printDirect(rows []result) {
	if !anyRow(rows, func(r result) bool { return r.direct != nil }) {
		return
	}
	fmt.Println("\nDirect baseline — the same chart's three objects written by the bench itself (no operator, no Helm), on the same cluster in the same run, as many clients as the operator has workers, converged by the same rule (every Deployment ready on its newest generation); chartpilot's phase over the direct one. Both are timed to convergence (chartpilot's: every resource Ready, or gone), without the 3 s of quiet the main table's phases also wait for; machine CPU likewise:")
	fmt.Println()
	fmt.Println("| N | phase | direct (s) | chartpilot (s) | ratio | direct requests per name | chartpilot requests per resource | direct machine CPU (s) | chartpilot machine CPU (s) | chartpilot's own CPU (s) |")
	fmt.Println("|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|")
	for _, r := range rows {
		for _, pair := range r.directPairs(r.direct) {
			fmt.Printf("| %d | %s | %.1f | %.1f | %.2f× | %.1f | %.1f | %.1f | %.1f | %.1f |\n", r.n, pair.name, pair.d.wall.Seconds(), pair.c.toConverge(),
				pair.c.toConverge()/pair.d.wall.Seconds(), perResource(pair.d.req, r.n), perResource(pair.c.req, r.n), pair.d.machine, pair.c.machineToConverge(), pair.c.procs[operatorComm])
		}
	}
	fmt.Println("\nRequests by resource, direct:")
	for _, r := range rows {
		if r.direct == nil {
			continue
		}
		for _, p := range []phase{r.direct.create, r.direct.bump, r.direct.del} {
			fmt.Printf("- N=%d %s: %s\n", r.n, p.name, p.req.Top(8))
		}
	}
	printDirectWrites(rows)
	printProcCPU(rows)
	printAPICounts(rows)
}

// anyRow reports whether any of rows has what has looks for.
func anyRow(rows []result, has func(result) bool) bool {
	for _, r := range rows {
		if has(r) {
			return true
		}
	}
	return false
}

// directPair is a phase of a direct baseline and the operator's phase it
// compares with.
type directPair struct {
	name string
	d    phase
	c    *phase
}

// directPairs pairs the phases of d (a baseline of r's run) with the
// operator's (none when d is nil).
func (r result) directPairs(d *directResult) []directPair {
	if d == nil {
		return nil
	}
	var out []directPair
	for _, p := range []directPair{
		{"create → all ready", d.create, r.phaseNamed("install")},
		{"change → all ready", d.bump, r.phaseNamed("upgrade")},
		{"delete → all gone", d.del, r.phaseNamed("delete")},
	} {
		if p.c != nil {
			out = append(out, p)
		}
	}
	return out
}

// printDirectWrites prints the baseline with chartpilot's own writes added
// beside the plain one and the operator's phases: how much of the
// difference the writes explain.
func printDirectWrites(rows []result) {
	if !anyRow(rows, func(r result) bool { return r.directWrites != nil }) {
		return
	}
	fmt.Println("\nThe direct baseline with chartpilot's writes — the same clients also write what chartpilot writes for each resource, in its order (the resource itself by its user, its finalizer, the release record pending then deployed, the older record superseded, an event, the status: once on create, twice on change, as an upgrade queued for a slot writes it; on delete the records, an event and the finalizer), with a record and a status copied from the operator's run; run after the operator's phases on the same cluster. What is left to chartpilot is the operator itself:")
	fmt.Println()
	fmt.Println("| N | phase | direct (s) | direct + writes (s) | chartpilot (s) | chartpilot / direct | chartpilot / (direct + writes) | requests per name, direct + writes | machine CPU, direct + writes (s) |")
	fmt.Println("|---:|---|---:|---:|---:|---:|---:|---:|---:|")
	for _, r := range rows {
		plain := r.directPairs(r.direct)
		for i, pair := range r.directPairs(r.directWrites) {
			base := pair.d.wall.Seconds()
			if i < len(plain) {
				base = plain[i].d.wall.Seconds()
			}
			fmt.Printf("| %d | %s | %.1f | %.1f | %.1f | %.2f× | %.2f× | %.1f | %.1f |\n", r.n, pair.name, base, pair.d.wall.Seconds(), pair.c.toConverge(),
				pair.c.toConverge()/base, pair.c.toConverge()/pair.d.wall.Seconds(), perResource(pair.d.req, r.n), pair.d.machine)
		}
	}
	fmt.Println("\nRequests by resource, direct + writes:")
	for _, r := range rows {
		if r.directWrites == nil {
			continue
		}
		for _, p := range []phase{r.directWrites.create, r.directWrites.bump, r.directWrites.del} {
			fmt.Printf("- N=%d %s: %s\n", r.n, p.name, p.req.Top(10))
		}
	}
}

// phaseNamed is the first of r's phases whose name starts with prefix.
func (r result) phaseNamed(prefix string) *phase {
	for i := range r.phases {
		if len(r.phases[i].name) >= len(prefix) && r.phases[i].name[:len(prefix)] == prefix {
			return &r.phases[i]
		}
	}
	return nil
}
