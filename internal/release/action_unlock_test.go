package release_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/go-logr/logr"
	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/utils/ptr"

	"github.com/chartpilot/chartpilot/internal/api/v1alpha1"
	"github.com/chartpilot/chartpilot/internal/helm"
	"github.com/chartpilot/chartpilot/internal/operator"
	"github.com/chartpilot/chartpilot/internal/watches"
)

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
	e.waitPendingUpgrade("crash")
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

// TestLiveHoldersPendingRevisionNotUnlocked: a revision left pending by a
// replica that still holds its Lease (another shard's leader, say) is not
// unlocked (Reconciling=True, LockHeld); once that Lease lapses, it is
// unlocked and the work finished.
func TestLiveHoldersPendingRevisionNotUnlocked(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	startOperator(t, cluster.Config, []watches.Watch{webappWatch(t)})
	u := e.create("held", map[string]any{"message": "v1"}, nil, nil)
	e.waitCondition("held", v1alpha1.ConditionReady, metav1.ConditionTrue, "")

	// Replica B of another shard holds its Lease and has an upgrade in
	// flight (its pre-upgrade hook never completes), signed like any record
	// chartpilot writes.
	now := time.Now()
	lease := &coordinationv1.Lease{
		ObjectMeta: metav1.ObjectMeta{Name: "shard-b", Namespace: e.ns},
		Spec: coordinationv1.LeaseSpec{HolderIdentity: ptr.To("replica-b"), LeaseDurationSeconds: ptr.To(int32(3600)),
			RenewTime: &metav1.MicroTime{Time: now}, AcquireTime: &metav1.MicroTime{Time: now}},
	}
	lease, err := e.cs.CoordinationV1().Leases(e.ns).Create(ctx, lease, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	keySecret, err := e.cs.CoreV1().Secrets("default").Get(ctx, "chartpilot-release-records", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	replicaB, err := helm.NewClient(cluster.Config, logr.Discard())
	if err != nil {
		t.Fatal(err)
	}
	replicaB.UseRecords(helm.Records{Key: keySecret.Data["key"]})
	ch, err := helm.LoadChart(filepath.Join("..", "..", "test", "charts", "webapp"))
	if err != nil {
		t.Fatal(err)
	}
	upgradeCtx, cancel := context.WithCancel(ctx)
	t.Cleanup(cancel)
	go func() {
		_, _ = replicaB.Upgrade(upgradeCtx, ch, helm.ActionOptions{Namespace: e.ns, Name: "held", Timeout: 10 * time.Minute,
			Values: map[string]any{"message": "from replica b", "slowHook": true},
			Labels: map[string]string{v1alpha1.LabelOwnerUID: string(u.GetUID()), v1alpha1.LabelOwnerKind: "Webapp.test.chartpilot.dev",
				v1alpha1.LabelHolder: "replica-b", v1alpha1.LabelHolderLease: "shard-b", v1alpha1.LabelHolderLeaseNS: e.ns,
				v1alpha1.LabelStartedAt: fmt.Sprint(now.Unix())}})
	}()
	pending := func() (bool, string) {
		h := e.history("held")
		last := h[len(h)-1]
		return last.Status == helm.StatusPendingUpgrade, fmt.Sprintf("revision %d %s", last.Revision, last.Status)
	}
	e.waitFor("replica b's upgrade pending", pending)

	e.patch("held", `{"metadata":{"annotations":{"chartpilot.dev/reconcile-requested-at":"look"}}}`)
	e.waitCondition("held", v1alpha1.ConditionReconciling, metav1.ConditionTrue, "LockHeld")
	if ok, state := e.holds(3*time.Second, pending); !ok {
		t.Fatalf("a live replica's pending revision was touched: %s", state)
	}

	// B's Lease lapses: B is gone, and its revision is unlocked.
	lease.Spec.RenewTime = &metav1.MicroTime{Time: now.Add(-2 * time.Hour)}
	if _, err := e.cs.CoordinationV1().Leases(e.ns).Update(ctx, lease, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	e.waitEvent("held", "Unlocked", "pending-upgrade")
	e.waitFor("the resource's own spec deployed", func() (bool, string) {
		cm, err := e.configMap("held-config")
		if err != nil {
			return false, err.Error()
		}
		c := condition(e.get("held"), v1alpha1.ConditionReady)
		return cm.Data["message"] == "v1" && c != nil && c.Status == metav1.ConditionTrue, fmt.Sprint(cm.Data, c)
	})
}
