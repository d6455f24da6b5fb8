package nodes

import (
	"context"
	"fmt"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	authorizationv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/util/retry"
	"k8s.io/utils/ptr"

	"github.com/chartpilot/chartpilot/internal/rbac"
	"github.com/chartpilot/chartpilot/internal/testing/testcluster"
	"github.com/chartpilot/chartpilot/internal/testing/testpg"
)

// realNodePostgres is the spec of a Postgres of major version on the real
// node, from the image repo, with extra fields over it.
func realNodePostgres(repo, version string, extra map[string]any) map[string]any {
	spec := map[string]any{
		"version": version, "storage": map[string]any{"size": "1Gi"},
		"nodeSelector": map[string]any{testcluster.RealNodeLabel: "true"},
		"tolerations":  []any{map[string]any{"key": testcluster.RealNodeTaint, "operator": "Exists", "effect": "NoSchedule"}},
		"values":       map[string]any{"image": map[string]any{"repository": repo}},
	}
	for k, v := range extra {
		spec[k] = v
	}
	return spec
}

// superuser returns the superuser's name and password of Postgres name in
// ns, from its Secret.
func superuser(t *testing.T, cs kubernetes.Interface, ns, name string) (string, string) {
	t.Helper()
	secret, err := cs.CoreV1().Secrets(ns).Get(context.Background(), name+"-auth", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return string(secret.Data["username"]), string(secret.Data["password"])
}

// serviceIP is the cluster IP of Service name in ns.
func serviceIP(t *testing.T, cs kubernetes.Interface, ns, name string) string {
	t.Helper()
	svc, err := cs.CoreV1().Services(ns).Get(context.Background(), name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return svc.Spec.ClusterIP
}

// ack is an insert a server acknowledged: the value, the server (its
// address, the start of its postmaster, so that a restarted server is
// another, and its version number)
// and when it was sent and acknowledged.
type ack struct {
	v        int
	server   string
	sent, at time.Time
}

// rowWriter inserts rows one connection at a time through a Service, as
// an application does, and records each acknowledged row.
type rowWriter struct {
	mu   sync.Mutex
	acks []ack
	next int
	stop chan struct{}
	done chan struct{}
}

// startRowWriter inserts into table t (v int) of database db at
// host:5432 from value from on until halted.
func startRowWriter(t *testing.T, host, user, password, db string, from int) *rowWriter {
	w := &rowWriter{next: from, stop: make(chan struct{}), done: make(chan struct{})}
	psqlBin := filepath.Join(testpg.Bin(t), "psql")
	go func() {
		defer close(w.done)
		for v := from; ; v++ {
			select {
			case <-w.stop:
				return
			default:
			}
			// No statement timeout: a commit waiting on the synchronous
			// standby is acknowledged only once it is there. A client that
			// gives up (the timeout kills psql) has no acknowledgement.
			sent := time.Now()
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			cmd := exec.CommandContext(ctx, psqlBin, "-h", host, "-p", "5432", "-U", user, "-d", db, "-XAtq", "-v", "ON_ERROR_STOP=1",
				"-c", fmt.Sprintf("INSERT INTO t VALUES (%d) RETURNING host(inet_server_addr()) || '/' || pg_postmaster_start_time() || '/' || current_setting('server_version_num')", v))
			cmd.Env = []string{"PGPASSWORD=" + password, "PGCONNECT_TIMEOUT=2", "PGSSLMODE=require"}
			out, err := cmd.Output()
			cancel()
			if err == nil {
				w.mu.Lock()
				w.acks = append(w.acks, ack{v: v, server: strings.TrimSpace(string(out)), sent: sent, at: time.Now()})
				w.mu.Unlock()
			} else {
				time.Sleep(100 * time.Millisecond)
			}
		}
	}()
	return w
}

// lostOf counts the acknowledged rows missing from stored (the values of
// t, separated by white space) and the values stored.
func lostOf(acks []ack, stored string) (lost, n int) {
	have := map[int]bool{}
	for _, f := range strings.Fields(stored) {
		v, _ := strconv.Atoi(f)
		have[v] = true
	}
	for _, a := range acks {
		if !have[a.v] {
			lost++
		}
	}
	return lost, len(have)
}

func (w *rowWriter) snapshot() []ack {
	w.mu.Lock()
	defer w.mu.Unlock()
	return slices.Clone(w.acks)
}

func (w *rowWriter) halt() []ack {
	close(w.stop)
	<-w.done
	return w.snapshot()
}

// waitAcks waits until cond holds for the acknowledged rows.
func (w *rowWriter) waitAcks(t *testing.T, what string, timeout time.Duration, cond func([]ack) bool) {
	t.Helper()
	err := wait.PollUntilContextTimeout(context.Background(), 200*time.Millisecond, timeout, true, func(context.Context) (bool, error) {
		return cond(w.snapshot()), nil
	})
	if err != nil {
		acks := w.snapshot()
		last := "none"
		if len(acks) > 0 {
			last = fmt.Sprintf("%s at %s", acks[len(acks)-1].server, acks[len(acks)-1].at.Format(time.TimeOnly))
		}
		t.Fatalf("waiting %s for %s: %d rows acknowledged, the last by %s", timeout, what, len(acks), last)
	}
}

// primaryPod returns the pod of Postgres name labelled primary, when
// exactly one is.
func primaryPod(cs kubernetes.Interface, ns, name string) (corev1.Pod, bool) {
	pods, err := cs.CoreV1().Pods(ns).List(context.Background(), metav1.ListOptions{LabelSelector: "app.kubernetes.io/instance=" + name + ",chartpilot.dev/role=primary"})
	if err != nil || len(pods.Items) != 1 {
		return corev1.Pod{}, false
	}
	return pods.Items[0], true
}

// TestFailoverOnRealPods: a Postgres 15 of three pods with failover and
// one synchronous standby, from charts/postgresql as the operator (its
// pod on the real node) renders it, with a writer inserting through the
// read-write Service throughout. The primary's container killed and
// restarted at once; killed and kept down past its Lease; its pod deleted
// with no grace period and the replacement kept unscheduled: each time a
// primary acknowledges the writer's rows again through the same Service
// (another member, when the old one was kept away), no acknowledged row
// is lost, no row sent after the new primary's first is acknowledged by
// the old server,
// and every other member is a standby with every row. The instance
// managers run as the chart's ServiceAccount, whose Role reaches the
// cluster's own Leases and pods only.
func TestFailoverOnRealPods(t *testing.T) {
	ctx := context.Background()
	cs, dyn := clients(t)
	pgRepo, _ := postgresImages(t)
	ops := cluster.Namespace(t)
	installOperator(t, ops, 1, map[string]any{"postgresImage": pgRepo})
	ns := cluster.Namespace(t)
	if _, err := rbac.CreateDeployer(ctx, cs, ns, rbac.DefaultDeployer, rbac.DefaultDeployer); err != nil {
		t.Fatal(err)
	}
	const name = "ha"
	createThroughWebhook(t, dyn, postgresGVR, ns, "Postgres", name, realNodePostgres(pgRepo, "15", map[string]any{
		"replicas": int64(3), "failover": map[string]any{"synchronous": int64(1)},
	}))
	start := time.Now()
	waitReady(t, dyn, postgresGVR, ns, name, "True", 10*time.Minute)
	t.Logf("3 members Ready %s after create", time.Since(start).Round(time.Second))

	pods, err := cs.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/instance=" + name})
	if err != nil || len(pods.Items) != 3 {
		t.Fatalf("pods of %s: %v (%d)", name, err, len(pods.Items))
	}
	sa := name + "-instance"
	for _, p := range pods.Items {
		if p.Spec.ServiceAccountName != sa || p.Spec.NodeName != testcluster.RealNodeName(0) {
			t.Errorf("pod %s runs as ServiceAccount %q on %s, want %s on the real node", p.Name, p.Spec.ServiceAccountName, p.Spec.NodeName, sa)
		}
	}
	checkInstanceRights(t, cs, ns, sa, name)

	user, password := superuser(t, cs, ns, name)
	host := serviceIP(t, cs, ns, name)
	if _, err := psql(t, host, user, password, "CREATE TABLE t (v int PRIMARY KEY)"); err != nil {
		t.Fatal(err)
	}
	if v, err := psql(t, host, user, password, "SHOW synchronous_standby_names"); err != nil || v == "" {
		t.Errorf("the primary names no synchronous standby: %q, %v", v, err)
	}
	checkLinks(t, cs, ns, name, host, user, password, 2)
	checkServerFilesHoldNoSuperuser(t, host, user, password)

	members := []string{name + "-0", name + "-1", name + "-2"}
	next := 1
	// lose makes the primary unavailable by loseIt under the writer; once
	// a primary acknowledges rows again, back (from loseIt) undoes what
	// kept the old member away. newMember: another member must have taken
	// over. Then every member but the primary is a standby with every row.
	lose := func(t *testing.T, newMember bool, loseIt func(old corev1.Pod) (back func())) {
		t.Helper()
		t.Cleanup(func() {
			if t.Failed() {
				describeMembers(t, cs, ns, name)
			}
		})
		old, ok := primaryPod(cs, ns, name)
		if !ok {
			t.Fatal("no one pod labelled primary")
		}
		w := startRowWriter(t, host, user, password, "postgres", next)
		w.waitAcks(t, "20 rows acknowledged", 2*time.Minute, func(a []ack) bool { return len(a) >= 20 })
		oldServer := w.snapshot()[0].server
		if !strings.HasPrefix(oldServer, old.Status.PodIP+"/") {
			t.Fatalf("rows acknowledged by %s, not by the primary %s (%s)", oldServer, old.Name, old.Status.PodIP)
		}
		lost := time.Now()
		back := loseIt(old)
		defer back()
		var took time.Duration
		newServer := ""
		// after counts the rows acknowledged by a primary since the loss.
		after := func(acks []ack) int {
			n := 0
			for _, a := range acks {
				if a.server != oldServer && a.sent.After(lost) {
					if n == 0 {
						took = a.at.Sub(lost)
					}
					newServer, n = a.server, n+1
				}
			}
			return n
		}
		w.waitAcks(t, "a row acknowledged by a primary again", 3*time.Minute, func(acks []ack) bool { return after(acks) > 0 })
		back()
		w.waitAcks(t, "20 rows acknowledged by it", 2*time.Minute, func(acks []ack) bool { return after(acks) >= 20 })
		acks := w.halt()
		next = acks[len(acks)-1].v + 1
		// Two primaries: the old server acknowledging a row sent after the
		// new one acknowledged its first. (A deleted pod's server runs on
		// until the kubelet stops it, and may acknowledge rows until then:
		// it is still the only primary, and they must not be lost.)
		var firstNew time.Time
		for _, a := range acks {
			if a.server == newServer && (firstNew.IsZero() || a.at.Before(firstNew)) {
				firstNew = a.at
			}
		}
		for _, a := range acks {
			if a.server != oldServer && a.server != newServer {
				t.Errorf("row %d acknowledged by %s, neither the old primary %s nor the new %s", a.v, a.server, oldServer, newServer)
			}
			if a.server == oldServer && a.sent.After(firstNew) {
				t.Errorf("row %d, sent after the new primary acknowledged its first, acknowledged by the old one", a.v)
			}
		}
		primary, ok := primaryPod(cs, ns, name)
		if !ok || !strings.HasPrefix(newServer, primary.Status.PodIP+"/") {
			t.Fatalf("the new primary %s is not the pod labelled primary (%s)", newServer, primary.Name)
		}
		if newMember && primary.Name == old.Name {
			t.Fatalf("%s, kept away past its Lease, is primary again: no standby took over", old.Name)
		}
		rows, err := psql(t, primary.Status.PodIP, user, password, "SELECT v FROM t")
		if err != nil {
			t.Fatal(err)
		}
		lostRows, stored := lostOf(acks, rows)
		t.Logf("%s → %s: the first row acknowledged %s after, %d of %d acknowledged rows lost",
			old.Name, primary.Name, took.Round(100*time.Millisecond), lostRows, len(acks))
		report(t, "failover", map[string]any{"case": t.Name(), "from": old.Name, "to": primary.Name, "seconds": took.Seconds(), "acked": len(acks), "lost": lostRows})
		if lostRows != 0 {
			t.Errorf("%d acknowledged rows lost", lostRows)
		}
		for _, m := range members {
			if m != primary.Name {
				rejoined(t, cs, ns, m, user, password, stored)
			}
		}
	}

	// Restarted at once (the kubelet's first restart is immediate), the
	// member finds its Lease still its own and resumes as the primary;
	// a standby may have taken over instead if the restart was slow.
	t.Run("container killed, restarted", func(t *testing.T) {
		lose(t, false, func(p corev1.Pod) func() {
			killContainer(t, string(p.UID), "chartpilot")
			return func() {}
		})
	})
	// Kept down past its Lease (the node's kubelet paused: the container
	// is not restarted), a standby takes over; resumed, the kubelet
	// restarts the old member, which rewinds and follows.
	for range *failoverRuns {
		t.Run("container killed, kept down", func(t *testing.T) {
			lose(t, true, func(p corev1.Pod) func() {
				resume, err := cluster.PauseKubelet(0)
				if err != nil {
					t.Fatal(err)
				}
				killContainer(t, string(p.UID), "chartpilot")
				return resume
			})
		})
	}
	// Deleted with no grace period, its replacement held unscheduled (a
	// taint on the node) until a standby took over; then it starts on the
	// old volume and follows.
	t.Run("pod deleted", func(t *testing.T) {
		lose(t, true, func(p corev1.Pod) func() {
			untaint := holdScheduling(t, cs, testcluster.RealNodeName(0))
			zero := int64(0)
			if err := cs.CoreV1().Pods(ns).Delete(ctx, p.Name, metav1.DeleteOptions{GracePeriodSeconds: &zero}); err != nil {
				t.Fatal(err)
			}
			return untaint
		})
	})
}

// holdScheduling taints node NoSchedule with a key no pod tolerates and
// returns what removes the taint again (at the end of the test at the
// latest).
func holdScheduling(t *testing.T, cs kubernetes.Interface, node string) func() {
	t.Helper()
	const key = "chartpilot.dev/test-hold"
	change := func(taint bool) error {
		return retry.RetryOnConflict(retry.DefaultRetry, func() error {
			n, err := cs.CoreV1().Nodes().Get(context.Background(), node, metav1.GetOptions{})
			if err != nil {
				return err
			}
			n.Spec.Taints = slices.DeleteFunc(n.Spec.Taints, func(t corev1.Taint) bool { return t.Key == key })
			if taint {
				n.Spec.Taints = append(n.Spec.Taints, corev1.Taint{Key: key, Effect: corev1.TaintEffectNoSchedule})
			}
			_, err = cs.CoreV1().Nodes().Update(context.Background(), n, metav1.UpdateOptions{})
			return err
		})
	}
	if err := change(true); err != nil {
		t.Fatal(err)
	}
	var once sync.Once
	untaint := func() {
		once.Do(func() {
			if err := change(false); err != nil {
				t.Errorf("removing taint %s from %s: %v", key, node, err)
			}
		})
	}
	t.Cleanup(untaint)
	return untaint
}

// describeMembers logs what a failed case needs to be understood: the
// kubelet's process state, the primary's Lease, and for each pod of
// Postgres name its readiness, containers' states and the last lines of
// their logs.
func describeMembers(t *testing.T, cs kubernetes.Interface, ns, name string) {
	t.Helper()
	ctx := context.Background()
	t.Logf("real node 0's kubelet: state %s", cluster.KubeletState(0))
	if l, err := cs.CoordinationV1().Leases(ns).Get(ctx, name+"-primary", metav1.GetOptions{}); err == nil {
		t.Logf("lease %s: holder %q, renewed %v, transitions %d", l.Name, ptr.Deref(l.Spec.HolderIdentity, ""), l.Spec.RenewTime, ptr.Deref(l.Spec.LeaseTransitions, 0))
	}
	pods, err := cs.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/instance=" + name})
	if err != nil {
		t.Logf("pods of %s: %v", name, err)
		return
	}
	for _, p := range pods.Items {
		t.Logf("pod %s: phase %s, ready %v, role %q, ip %s, deleting %v", p.Name, p.Status.Phase, podReady(&p), p.Labels["chartpilot.dev/role"], p.Status.PodIP, p.DeletionTimestamp != nil)
		for _, c := range p.Status.ContainerStatuses {
			t.Logf("  container %s: ready %v, restarts %d, state %s, last %s", c.Name, c.Ready, c.RestartCount, containerState(c.State), containerState(c.LastTerminationState))
		}
		for container, log := range cluster.PodLogs(ns, p.Name) {
			lines := strings.Split(strings.TrimSpace(log), "\n")
			t.Logf("  %s's log, last %d of %d lines:\n%s", container, min(len(lines), 40), len(lines), strings.Join(lines[max(0, len(lines)-40):], "\n"))
		}
	}
}

func containerState(s corev1.ContainerState) string {
	switch {
	case s.Running != nil:
		return "running since " + s.Running.StartedAt.Format(time.TimeOnly)
	case s.Waiting != nil:
		return "waiting: " + s.Waiting.Reason + " " + s.Waiting.Message
	case s.Terminated != nil:
		return fmt.Sprintf("terminated %s: %s, exit %d", s.Terminated.FinishedAt.Format(time.TimeOnly), s.Terminated.Reason, s.Terminated.ExitCode)
	}
	return "none"
}

// rejoined waits until member pod of ns is Ready, in recovery (a standby)
// and has rows rows of t.
func rejoined(t *testing.T, cs kubernetes.Interface, ns, pod, user, password string, rows int) {
	t.Helper()
	var last string
	err := wait.PollUntilContextTimeout(context.Background(), time.Second, 5*time.Minute, true, func(ctx context.Context) (bool, error) {
		p, err := cs.CoreV1().Pods(ns).Get(ctx, pod, metav1.GetOptions{})
		if err != nil || !podReady(p) || p.Status.PodIP == "" {
			last = fmt.Sprintf("pod not ready (%v)", err)
			return false, nil
		}
		out, err := psql(t, p.Status.PodIP, user, password, "SELECT pg_is_in_recovery() || ' ' || count(*) FROM t")
		last = fmt.Sprintf("role label %q, answer %q, %v", p.Labels["chartpilot.dev/role"], out, err)
		return err == nil && out == "true "+strconv.Itoa(rows) && p.Labels["chartpilot.dev/role"] != "primary", nil
	})
	if err != nil {
		t.Errorf("%s not a standby with %d rows: %s", pod, rows, last)
	}
}

// checkInstanceRights asks the API server what ServiceAccount sa of ns may
// do: the Leases and pods of cluster name, not another cluster's, not
// Secrets, not its own Role.
func checkInstanceRights(t *testing.T, cs kubernetes.Interface, ns, sa, name string) {
	t.Helper()
	user := "system:serviceaccount:" + ns + ":" + sa
	for _, c := range []struct {
		verb, group, resource, object string
		want                          bool
	}{
		{"update", "coordination.k8s.io", "leases", name + "-primary", true},
		{"patch", "", "pods", name + "-0", true},
		{"update", "coordination.k8s.io", "leases", "other-primary", false},
		{"patch", "", "pods", "other-0", false},
		{"delete", "", "pods", name + "-0", false},
		{"get", "", "secrets", name + "-auth", false},
		{"list", "", "secrets", "", false},
		{"create", "", "pods", "", false},
		{"update", "rbac.authorization.k8s.io", "roles", sa, false},
	} {
		review := &authorizationv1.SubjectAccessReview{Spec: authorizationv1.SubjectAccessReviewSpec{
			User: user, Groups: []string{"system:serviceaccounts", "system:serviceaccounts:" + ns, "system:authenticated"},
			ResourceAttributes: &authorizationv1.ResourceAttributes{Namespace: ns, Verb: c.verb, Group: c.group, Resource: c.resource, Name: c.object},
		}}
		got, err := cs.AuthorizationV1().SubjectAccessReviews().Create(context.Background(), review, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if got.Status.Allowed != c.want {
			t.Errorf("%s may %s %s %q: %v, want %v", sa, c.verb, c.resource, c.object, got.Status.Allowed, c.want)
		}
	}
}
