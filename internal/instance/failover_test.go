package instance

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/url"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/go-logr/logr/funcr"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/chartpilot/chartpilot/internal/testcluster"
	"github.com/chartpilot/chartpilot/internal/testpg"
)

// memberEnv makes the test binary run one member (a JSON memberSpec)
// instead of tests: each member is a process of its own, killed with SIGKILL.
const memberEnv = "CHARTPILOT_INSTANCE_TEST_MEMBER"

var cluster *testcluster.Cluster

func TestMain(m *testing.M) {
	if spec := os.Getenv(memberEnv); spec != "" {
		os.Exit(runMember(spec))
	}
	os.Exit(testcluster.RunMain(m, testcluster.Options{}, &cluster))
}

type memberSpec struct {
	// APIServer, when set, replaces the kubeconfig's server (a proxy the
	// test can cut).
	Kubeconfig, APIServer, Namespace, Cluster, Member string
	Bin, DataDir, SocketDir, LogDir                   string
	Port                                              int
	UID, GID                                          uint32
	Synchronous                                       int
}

// Lease timing of the tests' members: a failover within seconds.
const (
	testLease  = 4 * time.Second
	testRenew  = 2500 * time.Millisecond
	testPeriod = 250 * time.Millisecond
)

func runMember(raw string) int {
	var s memberSpec
	if err := json.Unmarshal([]byte(raw), &s); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	rc, err := clientcmd.BuildConfigFromFlags("", s.Kubeconfig)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	rc.Timeout = 2 * time.Second
	if s.APIServer != "" {
		rc.Host = s.APIServer
	}
	cs, err := kubernetes.NewForConfig(rc)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	log := funcr.New(func(prefix, args string) { fmt.Fprintln(os.Stderr, time.Now().Format("15:04:05.000"), s.Member, args) }, funcr.Options{})
	m, err := New(Config{
		Cluster: s.Cluster, Namespace: s.Namespace, Member: s.Member, Client: cs, Pod: s.Member,
		Bin: s.Bin, DataDir: s.DataDir, SocketDir: s.SocketDir, LogDir: s.LogDir,
		Address: "127.0.0.1:" + strconv.Itoa(s.Port), ListenAddress: "127.0.0.1", Port: s.Port,
		HostAuth: "trust", ReplicationNetwork: "127.0.0.1/32",
		Credential:    &syscall.Credential{Uid: s.UID, Gid: s.GID},
		LeaseDuration: testLease, RenewDeadline: testRenew, Period: testPeriod,
		Synchronous: s.Synchronous, Log: log,
	})
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

// pgCluster is a test's members, their pods and the read-write endpoint.
type pgCluster struct {
	t       *testing.T
	ns      string
	cs      kubernetes.Interface
	runner  *testpg.Runner
	bin     string
	dir     string
	sync    int
	ports   map[string]int
	procs   map[string]*exec.Cmd
	rwPort  int
	members []string
	// apis are the members' ways to the API server, each one cuttable.
	apis map[string]*cutProxy
}

func newPGCluster(t *testing.T, sync int, members ...string) *pgCluster {
	t.Helper()
	cluster.Skip(t)
	bin := testpg.Bin(t)
	r := testpg.NewRunner(t, bin)
	cs, err := kubernetes.NewForConfig(cluster.Config)
	if err != nil {
		t.Fatal(err)
	}
	c := &pgCluster{t: t, ns: cluster.Namespace(t), cs: cs, runner: r, bin: bin, dir: r.TempDir(t), sync: sync,
		ports: map[string]int{}, procs: map[string]*exec.Cmd{}, members: members, apis: map[string]*cutProxy{}}
	for _, m := range members {
		api, err := url.Parse(cluster.Config.Host)
		if err != nil {
			t.Fatal(err)
		}
		c.apis[m] = newCutProxy(t, api.Host)
		c.ports[m] = testpg.FreePort(t)
		// The member's pod (the local API tier runs no pods: the object
		// carries the role label the read-write Service would select).
		pod := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: m, Namespace: c.ns, Labels: map[string]string{LabelCluster: "pg"}},
			Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "postgres", Image: "postgres"}}, AutomountServiceAccountToken: new(bool)},
		}
		if _, err := cs.CoreV1().Pods(c.ns).Create(context.Background(), pod, metav1.CreateOptions{}); err != nil {
			t.Fatalf("pod %s: %v", m, err)
		}
	}
	t.Cleanup(func() {
		if !t.Failed() {
			return
		}
		logs, _ := filepath.Glob(filepath.Join(c.dir, "*", "*.log"))
		more, _ := filepath.Glob(filepath.Join(c.dir, "*.log"))
		for _, l := range append(more, logs...) {
			b, _ := os.ReadFile(l)
			lines := strings.Split(strings.TrimSpace(string(b)), "\n")
			if len(lines) > 25 {
				lines = lines[len(lines)-25:]
			}
			t.Logf("%s:\n%s", l, strings.Join(lines, "\n"))
		}
	})
	c.rwPort = c.readWriteEndpoint()
	for _, m := range members {
		c.start(m)
	}
	return c
}

// start runs a member's process.
func (c *pgCluster) start(m string) {
	c.t.Helper()
	spec, _ := json.Marshal(memberSpec{
		Kubeconfig: cluster.KubeconfigPath, APIServer: "https://" + c.apis[m].addr(), Namespace: c.ns, Cluster: "pg", Member: m,
		Bin: c.bin, DataDir: filepath.Join(c.dir, m, "data"), SocketDir: filepath.Join(c.dir, m), LogDir: filepath.Join(c.dir, m),
		Port: c.ports[m], UID: uint32(c.runner.UID), GID: uint32(c.runner.GID), Synchronous: c.sync,
	})
	c.runner.Mkdir(c.t, filepath.Join(c.dir, m))
	logf, err := os.OpenFile(filepath.Join(c.dir, m+"-manager.log"), os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		c.t.Fatal(err)
	}
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), memberEnv+"="+string(spec))
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		c.t.Fatal(err)
	}
	c.procs[m] = cmd
	c.t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		done := make(chan struct{})
		go func() { _ = cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(30 * time.Second):
			_ = cmd.Process.Kill()
		}
		logf.Close()
	})
}

// kill SIGKILLs a member's manager (its server dies with it).
func (c *pgCluster) kill(m string) {
	c.t.Helper()
	if err := c.procs[m].Process.Kill(); err != nil {
		c.t.Fatal(err)
	}
	_, _ = c.procs[m].Process.Wait()
}

// primaries lists the pods labelled primary.
func (c *pgCluster) primaries() []string {
	pods, err := c.cs.CoreV1().Pods(c.ns).List(context.Background(), metav1.ListOptions{LabelSelector: LabelRole + "=" + RolePrimary})
	if err != nil {
		return nil
	}
	var out []string
	for _, p := range pods.Items {
		out = append(out, p.Name)
	}
	return out
}

// readWriteEndpoint is what the read-write Service does: each connection
// goes to the pod labelled primary (none or two: refused).
func (c *pgCluster) readWriteEndpoint() int {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		c.t.Fatal(err)
	}
	c.t.Cleanup(func() { l.Close() })
	go func() {
		for {
			conn, err := l.Accept()
			if err != nil {
				return
			}
			go func() {
				defer conn.Close()
				ps := c.primaries()
				if len(ps) != 1 {
					return
				}
				up, err := net.DialTimeout("tcp", "127.0.0.1:"+strconv.Itoa(c.ports[ps[0]]), 2*time.Second)
				if err != nil {
					return
				}
				defer up.Close()
				go func() { _, _ = io.Copy(up, conn) }()
				_, _ = io.Copy(conn, up)
			}()
		}
	}()
	return l.Addr().(*net.TCPAddr).Port
}

// psql runs SQL on a port within timeout; ok means the server answered
// without error (for an INSERT: the row is acknowledged).
func (c *pgCluster) psql(port int, timeout time.Duration, sql string) (string, bool) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, filepath.Join("/usr/bin", "psql"), "-XAtq", "-v", "ON_ERROR_STOP=1", "-h", "127.0.0.1", "-p", strconv.Itoa(port), "-U", "postgres", "-d", "postgres", "-c", sql)
	cmd.Env = []string{"PGCONNECT_TIMEOUT=2", "LANG=C"}
	out, err := cmd.Output()
	return strings.TrimSpace(string(out)), err == nil
}

func (c *pgCluster) waitFor(what string, timeout time.Duration, cond func() (bool, string)) {
	c.t.Helper()
	var last string
	if err := wait.PollUntilContextTimeout(context.Background(), 200*time.Millisecond, timeout, true, func(context.Context) (bool, error) {
		ok, obs := cond()
		last = obs
		return ok, nil
	}); err != nil {
		c.t.Fatalf("waiting for %s: %v; last seen: %s (logs in %s)", what, err, last, c.dir)
	}
}

// roles reads each member's reported role.
func (c *pgCluster) roles() map[string]string {
	out := map[string]string{}
	for _, m := range c.members {
		l, err := c.cs.CoordinationV1().Leases(c.ns).Get(context.Background(), "pg-"+m, metav1.GetOptions{})
		if err == nil {
			out[m] = l.Annotations[AnnotationRole]
		}
	}
	return out
}

func (c *pgCluster) waitSettled(primary string, standbys ...string) {
	c.t.Helper()
	c.waitFor("one primary and streaming standbys", 3*time.Minute, func() (bool, string) {
		roles, ps := c.roles(), c.primaries()
		ok := len(ps) == 1 && (primary == "" || ps[0] == primary) && roles[ps[0]] == RolePrimary
		for _, s := range standbys {
			ok = ok && roles[s] == RoleStandby
		}
		return ok, fmt.Sprintf("primary pods %v, roles %v", ps, roles)
	})
}

// ack is one acknowledged insert: the value and the server's port.
type ack struct {
	v    int
	port int
	at   time.Time
}

// writer inserts rows through the read-write endpoint until stopped,
// recording which server acknowledged each.
type writer struct {
	mu   sync.Mutex
	acks []ack
	stop chan struct{}
	done chan struct{}
}

func (c *pgCluster) startWriter() *writer {
	w := &writer{stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(w.done)
		for v := 1; ; v++ {
			select {
			case <-w.stop:
				return
			default:
			}
			out, ok := c.psql(c.rwPort, 5*time.Second, fmt.Sprintf("INSERT INTO t VALUES (%d) RETURNING inet_server_port()", v))
			if ok {
				port, _ := strconv.Atoi(out)
				w.mu.Lock()
				w.acks = append(w.acks, ack{v: v, port: port, at: time.Now()})
				w.mu.Unlock()
			} else {
				time.Sleep(50 * time.Millisecond)
			}
		}
	}()
	return w
}

func (w *writer) halt() []ack {
	close(w.stop)
	<-w.done
	w.mu.Lock()
	defer w.mu.Unlock()
	return append([]ack(nil), w.acks...)
}

func (w *writer) count() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return len(w.acks)
}

// failover kills the primary under a steady write load and returns the
// time to the first write acknowledged by the new primary, the rows
// acknowledged and lost, and the new primary.
func (c *pgCluster) failover() (time.Duration, []ack, int, string) {
	c.t.Helper()
	ps := c.primaries()
	old := ps[0]
	if _, ok := c.psql(c.rwPort, 10*time.Second, "CREATE TABLE IF NOT EXISTS t (v int PRIMARY KEY)"); !ok {
		c.t.Fatal("creating the table through the read-write endpoint failed")
	}
	w := c.startWriter()
	c.waitFor("writes acknowledged", time.Minute, func() (bool, string) { return w.count() >= 20, strconv.Itoa(w.count()) })
	killed := time.Now()
	c.kill(old)
	var newPrimary string
	c.waitFor("a write acknowledged by a new primary", time.Minute, func() (bool, string) {
		w.mu.Lock()
		defer w.mu.Unlock()
		for _, a := range w.acks {
			if a.port != c.ports[old] && a.at.After(killed) {
				for m, p := range c.ports {
					if p == a.port {
						newPrimary = m
					}
				}
				return true, ""
			}
		}
		return false, fmt.Sprintf("primaries %v, roles %v", c.primaries(), c.roles())
	})
	took := 0 * time.Second
	w.mu.Lock()
	for _, a := range w.acks {
		if a.port == c.ports[newPrimary] {
			took = a.at.Sub(killed)
			break
		}
	}
	w.mu.Unlock()
	c.waitFor("more writes on the new primary", time.Minute, func() (bool, string) {
		n := 0
		w.mu.Lock()
		for _, a := range w.acks {
			if a.port == c.ports[newPrimary] {
				n++
			}
		}
		w.mu.Unlock()
		return n >= 20, strconv.Itoa(n)
	})
	acks := w.halt()
	// Which acknowledged rows does the new primary have?
	have := map[int]bool{}
	out, ok := c.psql(c.ports[newPrimary], 10*time.Second, "SELECT v FROM t")
	if !ok {
		c.t.Fatalf("reading the rows on the new primary %s failed", newPrimary)
	}
	for _, l := range strings.Fields(out) {
		v, _ := strconv.Atoi(l)
		have[v] = true
	}
	lost := 0
	for _, a := range acks {
		if !have[a.v] {
			lost++
		}
	}
	// Two primaries never accepted writes at once: once the new primary
	// acknowledged a row, the old one acknowledged none.
	firstNew := time.Time{}
	for _, a := range acks {
		if a.port == c.ports[newPrimary] && (firstNew.IsZero() || a.at.Before(firstNew)) {
			firstNew = a.at
		}
	}
	for _, a := range acks {
		if a.port == c.ports[old] && a.at.After(firstNew) {
			c.t.Errorf("row %d acknowledged by the old primary %s at %s, after the new primary %s acknowledged its first at %s", a.v, old, a.at.Format(time.RFC3339Nano), newPrimary, firstNew.Format(time.RFC3339Nano))
		}
	}
	return took, acks, lost, newPrimary
}

// TestFailoverLosesNothingSynchronous: three members with one synchronous
// standby. The primary's manager and server are SIGKILLed under a steady
// write load: a standby is primary within 15 s, the writer reconnects
// through the read-write endpoint, no acknowledged row is lost, and the old
// primary, started again, rejoins as a standby with every row.
func TestFailoverLosesNothingSynchronous(t *testing.T) {
	c := newPGCluster(t, 1, "pg-0", "pg-1", "pg-2")
	c.waitSettled("")
	old := c.primaries()[0]
	var standbys []string
	for _, m := range c.members {
		if m != old {
			standbys = append(standbys, m)
		}
	}
	c.waitSettled(old, standbys...)
	took, acks, lost, primary := c.failover()
	t.Logf("failover %s → %s: %s to the first acknowledged write; %d rows acknowledged, %d lost", old, primary, took.Round(time.Millisecond), len(acks), lost)
	if took > 15*time.Second {
		t.Errorf("the first write on the new primary %s came %s after the kill, more than 15 s", primary, took)
	}
	if lost != 0 {
		t.Errorf("%d acknowledged rows lost with a synchronous standby", lost)
	}
	// The old primary comes back as a standby of the new one, with every row.
	c.start(old)
	rest := []string{old}
	for _, s := range standbys {
		if s != primary {
			rest = append(rest, s)
		}
	}
	c.waitSettled(primary, rest...)
	want, _ := c.psql(c.ports[primary], 10*time.Second, "SELECT count(*) FROM t")
	c.waitFor("the old primary caught up", time.Minute, func() (bool, string) {
		got, ok := c.psql(c.ports[old], 5*time.Second, "SELECT count(*) FROM t")
		return ok && got == want, fmt.Sprintf("%s rows of %s", got, want)
	})
	if out, _ := c.psql(c.ports[old], 5*time.Second, "SELECT pg_is_in_recovery()"); out != "t" {
		t.Errorf("the old primary is not a standby: pg_is_in_recovery = %q", out)
	}
}

// cutProxy forwards TCP connections to the API server until cut: then it
// drops every connection and accepts none (a network partition).
type cutProxy struct {
	l      net.Listener
	target string
	mu     sync.Mutex
	cut    bool
	conns  []net.Conn
}

func newCutProxy(t *testing.T, target string) *cutProxy {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &cutProxy{l: l, target: target}
	t.Cleanup(func() { l.Close(); p.setCut(true) })
	go func() {
		for {
			conn, err := l.Accept()
			if err != nil {
				return
			}
			p.mu.Lock()
			if p.cut {
				p.mu.Unlock()
				conn.Close()
				continue
			}
			up, err := net.DialTimeout("tcp", target, 2*time.Second)
			if err != nil {
				p.mu.Unlock()
				conn.Close()
				continue
			}
			p.conns = append(p.conns, conn, up)
			p.mu.Unlock()
			go func() { _, _ = io.Copy(up, conn); up.Close() }()
			go func() { _, _ = io.Copy(conn, up); conn.Close() }()
		}
	}()
	return p
}

func (p *cutProxy) addr() string { return p.l.Addr().String() }

func (p *cutProxy) setCut(on bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.cut = on
	if on {
		for _, c := range p.conns {
			c.Close()
		}
		p.conns = nil
	}
}

// TestFencedBeforeAnotherPromotes: the primary's manager loses the API
// server (a partition: it cannot renew the Lease). Its server stops
// accepting writes before a standby takes the Lease, and once the API
// server is back it rejoins as a standby of the new primary.
func TestFencedBeforeAnotherPromotes(t *testing.T) {
	c := newPGCluster(t, 1, "pg-0", "pg-1", "pg-2")
	c.waitSettled("")
	old := c.primaries()[0]
	var standbys []string
	for _, m := range c.members {
		if m != old {
			standbys = append(standbys, m)
		}
	}
	c.waitSettled(old, standbys...)
	if _, ok := c.psql(c.ports[old], 10*time.Second, "CREATE TABLE t (v int PRIMARY KEY)"); !ok {
		t.Fatal("creating the table failed")
	}
	cut := time.Now()
	c.apis[old].setCut(true)
	var fenced time.Time
	lastOK := time.Time{}
	for v := 1; fenced.IsZero() && time.Since(cut) < time.Minute; v++ {
		if _, ok := c.psql(c.ports[old], time.Second, fmt.Sprintf("INSERT INTO t VALUES (%d)", v)); ok {
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
	c.waitFor("another member holding the primary's lease", time.Minute, func() (bool, string) {
		l, err := c.cs.CoordinationV1().Leases(c.ns).Get(context.Background(), "pg-primary", metav1.GetOptions{})
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
	c.apis[old].setCut(false)
	rest := []string{old}
	for _, s := range standbys {
		if s != primary {
			rest = append(rest, s)
		}
	}
	c.waitSettled(primary, rest...)
}
