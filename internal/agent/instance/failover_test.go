package instance_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/go-logr/logr/funcr"
	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/utils/ptr"

	"github.com/chartpilot/chartpilot/internal/agent/instance"
	"github.com/chartpilot/chartpilot/internal/agent/instance/instancetest"
	"github.com/chartpilot/chartpilot/internal/api/v1alpha1"
	"github.com/chartpilot/chartpilot/internal/testing/testcluster"
	"github.com/chartpilot/chartpilot/internal/testing/testwait"
)

// memberEnv makes the test binary run one member (a JSON MemberSpec)
// instead of tests: each member is a process of its own, killed with SIGKILL.
const memberEnv = "CHARTPILOT_INSTANCE_TEST_MEMBER"

var cluster *testcluster.Cluster

func TestMain(m *testing.M) {
	if spec := os.Getenv(memberEnv); spec != "" {
		os.Exit(runMember(spec))
	}
	os.Exit(testcluster.RunMain(m, testcluster.Options{}, &cluster))
}

func runMember(raw string) int {
	var s instancetest.MemberSpec
	if err := json.Unmarshal([]byte(raw), &s); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	rc, err := clientcmd.BuildConfigFromFlags("", s.Kubeconfig)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	rc.Host, rc.Timeout = s.APIServer, 2*time.Second
	cfg := s.Config()
	if cfg.Client, err = kubernetes.NewForConfig(rc); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	cfg.Log = funcr.New(func(_, args string) { fmt.Fprintln(os.Stderr, time.Now().Format("15:04:05.000"), s.Member, args) }, funcr.Options{})
	m, err := instance.New(cfg)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	if err := m.Run(ctx); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	return 0
}

func newCluster(t *testing.T, synchronous int) *instancetest.Cluster {
	t.Helper()
	cluster.Skip(t)
	return instancetest.New(t, instancetest.Options{
		API: cluster, Namespace: cluster.Namespace(t), Synchronous: synchronous, Members: []string{"pg-0", "pg-1", "pg-2"},
		Command: memberCommand,
	})
}

// memberCommand runs a member as a process of this test binary.
func memberCommand(spec instancetest.MemberSpec) *exec.Cmd {
	b, _ := json.Marshal(spec)
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), memberEnv+"="+string(b))
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	return cmd
}

// checkFailover checks what every failover must give: a new primary within
// 15 s, and never two primaries accepting writes.
func checkFailover(t *testing.T, r instancetest.Result) {
	t.Helper()
	if r.Took > 15*time.Second {
		t.Errorf("the first write on the new primary %s came %s after the kill, more than 15 s", r.To, r.Took)
	}
	for _, a := range r.LateOldAcks {
		t.Errorf("row %d acknowledged by the old primary %s at %s, after the new primary %s acknowledged its first", a.V, r.From, a.At.Format(time.RFC3339Nano), r.To)
	}
}

// TestFailoverLosesNothingSynchronous: three members with one synchronous
// standby. The primary's manager and server are SIGKILLed under a steady
// write load: a standby is primary within 15 s, the writer reconnects
// through the read-write endpoint, no acknowledged row is lost, and the old
// primary, started again, rejoins as a standby with every row.
func TestFailoverLosesNothingSynchronous(t *testing.T) {
	c := newCluster(t, 1)
	old, standbys := c.WaitSettled("")
	c.WaitSettled(old, standbys...)
	r := c.Failover(1)
	t.Logf("failover %s → %s: %s to the first acknowledged write; %d rows acknowledged, %d lost", r.From, r.To, r.Took.Round(time.Millisecond), r.Acked, r.Lost)
	checkFailover(t, r)
	if r.Lost != 0 {
		t.Errorf("%d acknowledged rows lost with a synchronous standby", r.Lost)
	}
	// The new primary says whom it took over from (status.lastFailover is
	// read from this), with an event on its pod.
	l, err := c.CS.CoordinationV1().Leases(c.NS).Get(context.Background(), instancetest.ClusterName+"-primary", metav1.GetOptions{})
	if err != nil || l.Annotations[v1alpha1.AnnotationPromotedFrom] != r.From || l.Annotations[v1alpha1.AnnotationPromotedLagBytes] == "" {
		t.Errorf("the primary's Lease after the failover: %v %v", l.GetAnnotations(), err)
	}
	c.WaitFor("a Promoted event on the new primary's pod", time.Minute, func() (bool, string) {
		evs, err := c.CS.CoreV1().Events(c.NS).List(context.Background(), metav1.ListOptions{FieldSelector: "involvedObject.name=" + r.To})
		if err != nil {
			return false, err.Error()
		}
		for _, e := range evs.Items {
			if e.Reason == "Promoted" && strings.Contains(e.Message, r.From) {
				return true, ""
			}
		}
		return false, fmt.Sprintf("%d events", len(evs.Items))
	})
	c.Rejoin(old, r.To)
	if out, _ := c.Psql(c.Ports[old], 5*time.Second, "SELECT pg_is_in_recovery()"); out != "t" {
		t.Errorf("the old primary is not a standby: pg_is_in_recovery = %q", out)
	}
	// Every member reports the new primary's timeline (the election ranks
	// timelines first), the rewound old primary too.
	c.WaitFor("every member on the new timeline", time.Minute, func() (bool, string) {
		seen := map[string]string{}
		for _, m := range c.Members {
			l, err := c.CS.CoordinationV1().Leases(c.NS).Get(context.Background(), instancetest.ClusterName+"-"+m, metav1.GetOptions{})
			if err != nil {
				return false, err.Error()
			}
			seen[m] = l.Annotations[v1alpha1.AnnotationMemberTimeline]
		}
		for _, m := range c.Members {
			if seen[m] != "2" {
				return false, fmt.Sprint(seen)
			}
		}
		return true, ""
	})
}

// TestFailoverAsynchronous: the same without a synchronous standby; what
// it loses is measured and printed (asynchronous replication may lose the
// last acknowledged commits).
func TestFailoverAsynchronous(t *testing.T) {
	c := newCluster(t, 0)
	old, standbys := c.WaitSettled("")
	c.WaitSettled(old, standbys...)
	r := c.Failover(1)
	t.Logf("asynchronous failover %s → %s: %s to the first acknowledged write; %d rows acknowledged, %d lost", r.From, r.To, r.Took.Round(time.Millisecond), r.Acked, r.Lost)
	checkFailover(t, r)
	c.Rejoin(old, r.To)
}

// TestFencedBeforeAnotherPromotes: the primary's manager loses the API
// server (a partition: it cannot renew the Lease). Its server stops
// accepting writes before a standby takes the Lease, and once the API
// server is back it rejoins as a standby of the new primary.
func TestFencedBeforeAnotherPromotes(t *testing.T) {
	c := newCluster(t, 1)
	old, standbys := c.WaitSettled("")
	c.WaitSettled(old, standbys...)
	if _, ok := c.Psql(c.Ports[old], 10*time.Second, "CREATE TABLE t (v int PRIMARY KEY)"); !ok {
		t.Fatal("creating the table failed")
	}
	cut := time.Now()
	c.CutAPI(old, true)
	var fenced, lastOK time.Time
	for v := 1; fenced.IsZero() && time.Since(cut) < time.Minute; v++ {
		if _, ok := c.Psql(c.Ports[old], time.Second, fmt.Sprintf("INSERT INTO t VALUES (%d)", v)); ok {
			lastOK = time.Now()
		} else {
			fenced = time.Now()
		}
		time.Sleep(20 * time.Millisecond)
	}
	if fenced.IsZero() {
		t.Fatalf("the partitioned primary %s still accepts writes a minute after the partition", old)
	}
	var promoted time.Time
	var primary string
	c.WaitFor("another member holding the primary's lease", time.Minute, func() (bool, string) {
		l, err := c.CS.CoordinationV1().Leases(c.NS).Get(context.Background(), instancetest.ClusterName+"-primary", metav1.GetOptions{})
		if err != nil || l.Spec.HolderIdentity == nil || *l.Spec.HolderIdentity == old || l.Spec.AcquireTime == nil {
			return false, fmt.Sprint(err)
		}
		promoted, primary = l.Spec.AcquireTime.Time, *l.Spec.HolderIdentity
		return true, ""
	})
	t.Logf("partition at 0; last write on the old primary at %s; fenced (writes refused) by %s; %s took the lease at %s",
		lastOK.Sub(cut).Round(time.Millisecond), fenced.Sub(cut).Round(time.Millisecond), primary, promoted.Sub(cut).Round(time.Millisecond))
	if !lastOK.Before(promoted) {
		t.Errorf("the old primary acknowledged a write at %s, after %s took the lease at %s: two primaries accepted writes", lastOK.Format(time.RFC3339Nano), primary, promoted.Format(time.RFC3339Nano))
	}
	if !fenced.Before(promoted) {
		t.Errorf("the old primary was fenced at %s, not before %s took the lease at %s", fenced.Format(time.RFC3339Nano), primary, promoted.Format(time.RFC3339Nano))
	}
	c.CutAPI(old, false)
	c.WaitSettled(primary, except(c.Members, primary)...)
}

// TestWholeClusterRestarts: every member down for longer than the Lease
// lasts (a node drained, a StatefulSet re-created), then started again. The
// primary down last: it takes the Lease again (or a synchronous standby,
// as current, is elected) and the others follow. The
// primary down first and kept down: the standbys, started without it,
// elect the most advanced of them; the old primary then rejoins. No
// acknowledged row is lost either way.
func TestWholeClusterRestarts(t *testing.T) {
	c := newCluster(t, 1)
	old, standbys := c.WaitSettled("")
	c.WaitSettled(old, standbys...)
	if _, ok := c.Psql(c.Ports[old], 10*time.Second, "CREATE TABLE restart_rows (v int); INSERT INTO restart_rows SELECT generate_series(1, 100)"); !ok {
		t.Fatal("seeding the primary failed")
	}
	rows := func(m string) string {
		var out string
		c.WaitFor(m+" answering", time.Minute, func() (bool, string) {
			var ok bool
			out, ok = c.Psql(c.Ports[m], 5*time.Second, "SELECT count(*) FROM restart_rows")
			return ok, out
		})
		return out
	}
	for _, s := range standbys {
		c.Kill(s)
	}
	c.Kill(old)
	time.Sleep(instancetest.LeaseDuration + time.Second)
	for _, m := range c.Members {
		c.Start(m)
	}
	p, others := c.WaitSettled("")
	c.WaitSettled(p, others...)
	// The last primary usually takes its Lease back; a synchronous standby
	// started at the same moment may win the election instead, with the
	// same rows: either is right.
	t.Logf("after a restart of all: %s primary (the last primary was %s)", p, old)
	if n := rows(p); n != "100" {
		t.Errorf("the primary has %s rows after the restart, want 100", n)
	}

	c.Kill(p)
	for _, s := range others {
		c.Kill(s)
	}
	time.Sleep(instancetest.LeaseDuration + time.Second)
	for _, s := range others {
		c.Start(s)
	}
	c.WaitFor("a standby elected without the old primary", 3*time.Minute, func() (bool, string) {
		ps := c.Primaries()
		return len(ps) == 1 && ps[0] != p && c.Roles()[ps[0]] == instance.RolePrimary, fmt.Sprintf("primary pods %v, roles %v", ps, c.Roles())
	})
	next := c.Primaries()[0]
	if n := rows(next); n != "100" {
		t.Errorf("the elected standby %s has %s rows, want 100", next, n)
	}
	c.Start(p)
	c.WaitSettled(next, except(c.Members, next)...)
	if n := rows(p); n != "100" {
		t.Errorf("the old primary %s, rejoined as a standby, has %s rows, want 100", p, n)
	}
}

// TestMovedDataLeads: the data moved to a new volume of one member with
// writes stopped (a major upgrade), every member restarted on new volumes
// (the others empty), the Lease naming another member: the member with
// the moved data (MovedMarker) takes the Lease once it expires, without
// being rewound onto anyone's timeline, and the others clone from it.
func TestMovedDataLeads(t *testing.T) {
	c := newCluster(t, 1)
	old, standbys := c.WaitSettled("")
	c.WaitSettled(old, standbys...)
	if _, ok := c.Psql(c.Ports[old], 10*time.Second, "CREATE TABLE moved_rows (v int); INSERT INTO moved_rows SELECT generate_series(1, 250)"); !ok {
		t.Fatal("seeding the primary failed")
	}
	for _, m := range c.Members {
		c.Kill(m)
	}
	// The primary's data goes to a standby's new volume; the others' are new and empty.
	target := standbys[0]
	moved := filepath.Join(c.Dir, "moved-data")
	if out, err := exec.Command("cp", "-a", filepath.Join(c.Dir, old, "data"), moved).CombinedOutput(); err != nil {
		t.Fatalf("copying the data: %v %s", err, out)
	}
	for _, m := range c.Members {
		c.RemoveData(m)
	}
	if err := os.Rename(moved, filepath.Join(c.Dir, target, "data")); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(instance.MovedMarker(filepath.Join(c.Dir, target, "data")), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	for _, m := range c.Members {
		c.Start(m)
	}
	c.WaitSettled(target, except(c.Members, target)...)
	for _, m := range c.Members {
		var n string
		c.WaitFor(m+" with the moved rows", time.Minute, func() (bool, string) {
			var ok bool
			n, ok = c.Psql(c.Ports[m], 5*time.Second, "SELECT count(*) FROM moved_rows")
			return ok && n == "250", n
		})
	}
	if _, err := os.Stat(instance.MovedMarker(filepath.Join(c.Dir, target, "data"))); !os.IsNotExist(err) {
		t.Errorf("the moved-data marker is still there after %s leads: %v", target, err)
	}
}

// TestNoSecondBootstrap: a cluster that had a primary is never initialised
// again by itself. Every member back on an empty volume (the Lease released
// by the old primary, which restarts within its duration and finds no
// data) stays without a primary rather than start an empty cluster that
// would stand for the lost one; deleting the primary's Lease, a person's
// decision, lets a new cluster start.
func TestNoSecondBootstrap(t *testing.T) {
	c := newCluster(t, 0)
	old, standbys := c.WaitSettled("")
	c.WaitSettled(old, standbys...)
	for _, m := range c.Members {
		c.Kill(m)
	}
	for _, m := range c.Members {
		c.RemoveData(m)
		c.Start(m)
	}
	testwait.Holds(3*instancetest.LeaseDuration, 200*time.Millisecond, func() bool {
		for m, role := range c.Roles() {
			if role == instance.RolePrimary {
				if _, err := os.Stat(filepath.Join(c.Dir, m, "data", "PG_VERSION")); err == nil {
					t.Fatalf("%s initialised a new cluster after the old one's data was gone", m)
				}
			}
		}
		return true
	})
	if err := c.CS.CoordinationV1().Leases(c.NS).Delete(context.Background(), instancetest.ClusterName+"-primary", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	p, others := c.WaitSettled("")
	c.WaitSettled(p, others...)
}

// TestSynchronousStandbyTakesPart: the primary names its synchronous
// standby on its Lease. With the other standby down, rows are committed
// (acknowledged by the synchronous standby alone); then the primary and
// the synchronous standby die and the other standby comes back. It must
// not promote (it lacks acknowledged rows); once the synchronous standby
// is back, that one promotes with every row, and the other follows it.
func TestSynchronousStandbyTakesPart(t *testing.T) {
	c := newCluster(t, 1)
	old, standbys := c.WaitSettled("")
	c.WaitSettled(old, standbys...)
	ctx := context.Background()
	named := func() string {
		l, err := c.CS.CoordinationV1().Leases(c.NS).Get(ctx, instancetest.ClusterName+"-"+old, metav1.GetOptions{})
		if err != nil {
			return err.Error()
		}
		return l.Annotations[v1alpha1.AnnotationSynchronousStandby]
	}
	var sync string
	c.WaitFor("the primary naming its synchronous standby", time.Minute, func() (bool, string) {
		sync = named()
		return sync == standbys[0] || sync == standbys[1], sync
	})
	other := except(standbys, sync)[0]
	c.Kill(other)
	if _, ok := c.Psql(c.Ports[old], 30*time.Second, "CREATE TABLE sync_rows (v int); INSERT INTO sync_rows SELECT generate_series(1, 300)"); !ok {
		t.Fatal("writing on the primary failed")
	}
	// The primary reports each period; its last report must still name sync.
	c.WaitFor("the primary still naming "+sync, time.Minute, func() (bool, string) { n := named(); return n == sync, n })
	c.Kill(old)
	c.Kill(sync)
	c.Start(other)
	if !testwait.Holds(4*instancetest.LeaseDuration, 200*time.Millisecond, func() bool { return c.Roles()[other] != instance.RolePrimary }) {
		n, _ := c.Psql(c.Ports[other], 5*time.Second, "SELECT count(*) FROM sync_rows")
		t.Fatalf("%s promoted without the synchronous standby %s: it has %q of the 300 acknowledged rows", other, sync, n)
	}
	c.Start(sync)
	c.WaitSettled(sync, other)
	for _, m := range []string{sync, other} {
		c.WaitFor(m+" with every acknowledged row", time.Minute, func() (bool, string) {
			n, ok := c.Psql(c.Ports[m], 5*time.Second, "SELECT count(*) FROM sync_rows")
			return ok && n == "300", n
		})
	}
	c.Start(old)
	c.WaitSettled(sync, except(c.Members, sync)...)
}

// except is members without one.
func except(members []string, one string) []string {
	var out []string
	for _, m := range members {
		if m != one {
			out = append(out, m)
		}
	}
	return out
}

// TestFailoverBesidePhantomMember: a Lease made by someone who may create
// Leases in the namespace (another cluster's members can), named as a
// member of this cluster with an ordinal it does not have, a newer
// timeline and position, and a renewal time a century ahead, does not
// hold the election up: a standby is primary within 15 s of the kill.
func TestFailoverBesidePhantomMember(t *testing.T) {
	c := newCluster(t, 0)
	old, standbys := c.WaitSettled("")
	c.WaitSettled(old, standbys...)
	phantom := instancetest.ClusterName + "-7"
	_, err := c.CS.CoordinationV1().Leases(c.NS).Create(context.Background(), &coordinationv1.Lease{
		ObjectMeta: metav1.ObjectMeta{Name: instancetest.ClusterName + "-" + phantom, Labels: map[string]string{v1alpha1.LabelCluster: instancetest.ClusterName},
			Annotations: map[string]string{v1alpha1.AnnotationMemberAddress: "127.0.0.1:1", v1alpha1.AnnotationMemberRole: instance.RoleStandby,
				v1alpha1.AnnotationMemberTimeline: "99", v1alpha1.AnnotationMemberLSN: "FF/0", v1alpha1.AnnotationMemberSettled: "true"}},
		Spec: coordinationv1.LeaseSpec{HolderIdentity: ptr.To(phantom), RenewTime: &metav1.MicroTime{Time: time.Now().Add(100 * 365 * 24 * time.Hour)}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	r := c.Failover(1)
	t.Logf("failover %s → %s beside %s: %s", r.From, r.To, phantom, r.Took.Round(time.Millisecond))
	checkFailover(t, r)
}
