// Package instancetest runs PostgreSQL clusters of instance managers for
// tests and the benchmark: real servers (Debian's binaries, as an
// unprivileged user), one process per member, electing through Leases on a
// local API server; each member's pod as an object carrying the role label,
// a read-write endpoint that follows it like the read-write Service, a way
// to the API server per member that can be cut, and a writer that records
// which server acknowledged each row.
package instancetest

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/chartpilot/chartpilot/internal/agent/instance"
	"github.com/chartpilot/chartpilot/internal/api/v1alpha1"
	"github.com/chartpilot/chartpilot/internal/testing/testcluster"
	"github.com/chartpilot/chartpilot/internal/testing/testpg"
)

// T is what the helpers need of a test or benchmark.
type T interface {
	testpg.T
	Logf(format string, args ...any)
	Failed() bool
}

// ClusterName names the test clusters' Leases (pg-primary, pg-MEMBER).
const ClusterName = "pg"

// Lease timing of the members: a failover within seconds.
const (
	LeaseDuration = 4 * time.Second
	RenewDeadline = 2500 * time.Millisecond
	Period        = 250 * time.Millisecond
)

// MemberSpec is what a member process runs with.
type MemberSpec struct {
	// Kubeconfig reaches the API server through APIServer (a proxy the
	// test can cut), which replaces its server.
	Kubeconfig, APIServer, Namespace, Cluster, Member string
	Bin, DataDir, SocketDir, LogDir                   string
	Port                                              int
	UID, GID                                          uint32
	Synchronous                                       int
	// ReplicationUser and ReplicationPassword: the member's replication
	// role (none: the superuser).
	ReplicationUser, ReplicationPassword string
}

// Config is the instance manager's configuration for the spec.
func (s MemberSpec) Config() instance.Config {
	return instance.Config{
		Cluster: s.Cluster, Namespace: s.Namespace, Member: s.Member, Pod: s.Member,
		Bin: s.Bin, DataDir: s.DataDir, SocketDir: s.SocketDir, LogDir: s.LogDir,
		Address: "127.0.0.1:" + strconv.Itoa(s.Port), ListenAddress: "127.0.0.1", Port: s.Port,
		HostAuth: "trust", ReplicationNetwork: "127.0.0.1/32",
		Credential:    &syscall.Credential{Uid: s.UID, Gid: s.GID},
		LeaseDuration: LeaseDuration, RenewDeadline: RenewDeadline, Period: Period,
		Synchronous:     s.Synchronous,
		ReplicationUser: s.ReplicationUser, ReplicationPassword: s.ReplicationPassword,
	}
}

// Options of a cluster.
type Options struct {
	API *testcluster.Cluster
	// Namespace holds the members' Leases and pods.
	Namespace   string
	Synchronous int
	Members     []string
	// Command makes a member's process (not started); it must die with
	// the caller.
	Command func(spec MemberSpec) *exec.Cmd
	// Password is the superuser's, for the members' pg_hba.conf that
	// asks for it over TCP (empty: none sent).
	Password string
	// Replication names the members that replicate as a role of their
	// own (member → role; its password is "replication"); the others use
	// the superuser.
	Replication map[string]string
	// Later are members New does not start (Start starts them).
	Later []string
}

// Cluster is a running test cluster.
type Cluster struct {
	t       T
	o       Options
	NS      string
	CS      kubernetes.Interface
	runner  *testpg.Runner
	bin     string
	Dir     string
	Ports   map[string]int
	procs   map[string]*exec.Cmd
	RWPort  int
	apis    map[string]*cutProxy
	Members []string
}

// New makes the members' pods and starts every member.
func New(t T, o Options) *Cluster {
	t.Helper()
	bin := testpg.Bin(t)
	r := testpg.NewRunner(t, bin)
	cs, err := kubernetes.NewForConfig(o.API.Config)
	if err != nil {
		t.Fatal(err)
	}
	c := &Cluster{t: t, o: o, NS: o.Namespace, CS: cs, runner: r, bin: bin, Dir: r.TempDir(t),
		Ports: map[string]int{}, procs: map[string]*exec.Cmd{}, Members: o.Members, apis: map[string]*cutProxy{}}
	t.Cleanup(c.dumpLogsOnFailure)
	api, err := url.Parse(o.API.Config.Host)
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range o.Members {
		c.apis[m] = newCutProxy(t, api.Host)
		c.Ports[m] = testpg.FreePort(t)
		// The member's pod (no pod runs here: the object carries the role
		// label the read-write Service selects).
		pod := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: m, Namespace: c.NS, Labels: map[string]string{v1alpha1.LabelCluster: ClusterName}},
			Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "postgres", Image: "postgres"}}, AutomountServiceAccountToken: new(bool)},
		}
		if _, err := cs.CoreV1().Pods(c.NS).Create(context.Background(), pod, metav1.CreateOptions{}); err != nil {
			t.Fatalf("pod %s: %v", m, err)
		}
	}
	c.RWPort = c.readWriteEndpoint()
	for _, m := range o.Members {
		if !slices.Contains(o.Later, m) {
			c.Start(m)
		}
	}
	return c
}

func (c *Cluster) dumpLogsOnFailure() {
	if !c.t.Failed() {
		return
	}
	logs, _ := filepath.Glob(filepath.Join(c.Dir, "*", "*.log"))
	more, _ := filepath.Glob(filepath.Join(c.Dir, "*.log"))
	for _, l := range append(more, logs...) {
		b, _ := os.ReadFile(l)
		lines := strings.Split(strings.TrimSpace(string(b)), "\n")
		if len(lines) > 25 {
			lines = lines[len(lines)-25:]
		}
		c.t.Logf("%s:\n%s", l, strings.Join(lines, "\n"))
	}
}

// Start runs a member's process.
func (c *Cluster) Start(m string) {
	c.t.Helper()
	c.runner.Mkdir(c.t, filepath.Join(c.Dir, m))
	spec := MemberSpec{
		Kubeconfig: c.o.API.KubeconfigPath, APIServer: "https://" + c.apis[m].addr(), Namespace: c.NS, Cluster: ClusterName, Member: m,
		Bin: c.bin, DataDir: filepath.Join(c.Dir, m, "data"), SocketDir: filepath.Join(c.Dir, m), LogDir: filepath.Join(c.Dir, m),
		Port: c.Ports[m], UID: uint32(c.runner.UID), GID: uint32(c.runner.GID), Synchronous: c.o.Synchronous,
	}
	if r := c.o.Replication[m]; r != "" {
		spec.ReplicationUser, spec.ReplicationPassword = r, "replication"
	}
	cmd := c.o.Command(spec)
	logf, err := os.OpenFile(filepath.Join(c.Dir, m+"-manager.log"), os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		c.t.Fatal(err)
	}
	cmd.Stdout, cmd.Stderr = logf, logf
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

// Kill SIGKILLs a member's manager (its server dies with it).
func (c *Cluster) Kill(m string) {
	c.t.Helper()
	if err := c.procs[m].Process.Kill(); err != nil {
		c.t.Fatal(err)
	}
	_, _ = c.procs[m].Process.Wait()
	// Its server's processes (which run in the data directory) die on the
	// manager's death signal, a moment later: a test that copies, removes
	// or reuses the data right after the kill waits for them.
	data := filepath.Join(c.Dir, m, "data")
	deadline := time.Now().Add(30 * time.Second)
	for n := processesIn(data); n > 0; n = processesIn(data) {
		if time.Now().After(deadline) {
			c.t.Fatalf("%d processes of %s still run in %s 30 s after its manager was killed", n, m, data)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// processesIn counts the processes whose working directory is dir or
// below it (PostgreSQL's processes work in their data directory).
func processesIn(dir string) int {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return 0
	}
	n := 0
	for _, e := range entries {
		if _, err := strconv.Atoi(e.Name()); err != nil {
			continue
		}
		cwd, err := os.Readlink(filepath.Join("/proc", e.Name(), "cwd"))
		if err == nil && (cwd == dir || strings.HasPrefix(cwd, dir+"/")) {
			n++
		}
	}
	return n
}

// RemoveData deletes a killed member's data directory. Kill waits for the
// server's processes, which die after their manager; where their working
// directories cannot be read, one may still write for a moment, so a
// removal that finds new files is tried again.
func (c *Cluster) RemoveData(m string) {
	c.t.Helper()
	dir := filepath.Join(c.Dir, m, "data")
	deadline := time.Now().Add(30 * time.Second)
	for {
		err := os.RemoveAll(dir)
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			c.t.Fatal(err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// CutAPI cuts (or restores) a member's way to the API server.
func (c *Cluster) CutAPI(m string, cut bool) { c.apis[m].setCut(cut) }

// Primaries lists the pods labelled primary.
func (c *Cluster) Primaries() []string {
	pods, err := c.CS.CoreV1().Pods(c.NS).List(context.Background(), metav1.ListOptions{LabelSelector: v1alpha1.LabelMemberRole + "=" + instance.RolePrimary})
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
func (c *Cluster) readWriteEndpoint() int {
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
				ps := c.Primaries()
				if len(ps) != 1 {
					return
				}
				up, err := net.DialTimeout("tcp", "127.0.0.1:"+strconv.Itoa(c.Ports[ps[0]]), 2*time.Second)
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

// Psql runs SQL on a port within timeout; ok means the server answered
// without error (for an INSERT: the row is acknowledged).
func (c *Cluster) Psql(port int, timeout time.Duration, sql string) (string, bool) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, "psql", "-XAtq", "-v", "ON_ERROR_STOP=1", "-h", "127.0.0.1", "-p", strconv.Itoa(port), "-U", "postgres", "-d", "postgres", "-c", sql)
	cmd.Env = []string{"PATH=/usr/bin:/bin", "PGCONNECT_TIMEOUT=2", "LANG=C"}
	if c.o.Password != "" {
		cmd.Env = append(cmd.Env, "PGPASSWORD="+c.o.Password)
	}
	out, err := cmd.Output()
	return strings.TrimSpace(string(out)), err == nil
}

// WaitFor polls cond until it holds or timeout passes.
func (c *Cluster) WaitFor(what string, timeout time.Duration, cond func() (bool, string)) {
	c.t.Helper()
	var last string
	if err := wait.PollUntilContextTimeout(context.Background(), 200*time.Millisecond, timeout, true, func(context.Context) (bool, error) {
		ok, obs := cond()
		last = obs
		return ok, nil
	}); err != nil {
		c.t.Fatalf("waiting for %s: %v; last seen: %s (logs in %s)", what, err, last, c.Dir)
	}
}

// Roles reads each member's reported role.
func (c *Cluster) Roles() map[string]string {
	out := map[string]string{}
	for _, m := range c.Members {
		l, err := c.CS.CoordinationV1().Leases(c.NS).Get(context.Background(), ClusterName+"-"+m, metav1.GetOptions{})
		if err == nil {
			out[m] = l.Annotations[v1alpha1.AnnotationMemberRole]
		}
	}
	return out
}

// WaitSettled waits for one primary (primary, when named) and the
// standbys streaming; it returns the primary and the other members.
func (c *Cluster) WaitSettled(primary string, standbys ...string) (string, []string) {
	c.t.Helper()
	var p string
	c.WaitFor("one primary and streaming standbys", 3*time.Minute, func() (bool, string) {
		roles, ps := c.Roles(), c.Primaries()
		ok := len(ps) == 1 && (primary == "" || ps[0] == primary) && roles[ps[0]] == instance.RolePrimary
		for _, s := range standbys {
			ok = ok && roles[s] == instance.RoleStandby
		}
		if ok {
			// The primary seen settled, not read again: a moment later
			// the label may be between two writes.
			p = ps[0]
		}
		return ok, fmt.Sprintf("primary pods %v, roles %v", ps, roles)
	})
	var others []string
	for _, m := range c.Members {
		if m != p {
			others = append(others, m)
		}
	}
	return p, others
}

// Ack is one acknowledged insert: the value and the server's port.
type Ack struct {
	V, Port int
	At      time.Time
}

// writer inserts rows through the read-write endpoint until stopped,
// recording which server acknowledged each.
type writer struct {
	mu   sync.Mutex
	acks []Ack
	stop chan struct{}
	done chan struct{}
}

func (c *Cluster) startWriter(from int) *writer {
	w := &writer{stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(w.done)
		for v := from; ; v++ {
			select {
			case <-w.stop:
				return
			default:
			}
			// No statement_timeout: a commit whose wait for the standby is
			// cancelled is reported as committed. A client that gives up
			// (the process killed) has no acknowledgement.
			out, ok := c.Psql(c.RWPort, 5*time.Second, fmt.Sprintf("INSERT INTO t VALUES (%d) RETURNING inet_server_port()", v))
			if ok {
				port, _ := strconv.Atoi(out)
				w.mu.Lock()
				w.acks = append(w.acks, Ack{V: v, Port: port, At: time.Now()})
				w.mu.Unlock()
			} else {
				time.Sleep(50 * time.Millisecond)
			}
		}
	}()
	return w
}

func (w *writer) snapshot() []Ack {
	w.mu.Lock()
	defer w.mu.Unlock()
	return append([]Ack(nil), w.acks...)
}

func (w *writer) halt() []Ack {
	close(w.stop)
	<-w.done
	return w.snapshot()
}

// Result is one failover under a write load.
type Result struct {
	From, To string
	// Took is from the kill to the first write the new primary acknowledged.
	Took time.Duration
	// Acked rows, and the acknowledged rows the new primary lacks.
	Acked, Lost int
	// LateOldAcks are rows the old primary acknowledged after the new one
	// acknowledged its first (two primaries accepting writes).
	LateOldAcks []Ack
}

// Failover kills the primary under a steady write load (rows from `from`
// on) and measures what the clients saw.
func (c *Cluster) Failover(from int) Result {
	c.t.Helper()
	old := c.Primaries()[0]
	if _, ok := c.Psql(c.RWPort, 10*time.Second, "CREATE TABLE IF NOT EXISTS t (v int PRIMARY KEY)"); !ok {
		c.t.Fatal("creating the table through the read-write endpoint failed")
	}
	w := c.startWriter(from)
	c.WaitFor("writes acknowledged", time.Minute, func() (bool, string) { n := len(w.snapshot()); return n >= 20, strconv.Itoa(n) })
	killed := time.Now()
	c.Kill(old)
	r := Result{From: old}
	byPort := map[int]string{}
	for m, p := range c.Ports {
		byPort[p] = m
	}
	c.WaitFor("a write acknowledged by a new primary", time.Minute, func() (bool, string) {
		for _, a := range w.snapshot() {
			if a.Port != c.Ports[old] && a.At.After(killed) {
				r.To, r.Took = byPort[a.Port], a.At.Sub(killed)
				return true, ""
			}
		}
		return false, fmt.Sprintf("primaries %v, roles %v", c.Primaries(), c.Roles())
	})
	c.WaitFor("more writes on the new primary", time.Minute, func() (bool, string) {
		n := 0
		for _, a := range w.snapshot() {
			if a.Port == c.Ports[r.To] {
				n++
			}
		}
		return n >= 20, strconv.Itoa(n)
	})
	acks := w.halt()
	have := map[int]bool{}
	out, ok := c.Psql(c.Ports[r.To], 10*time.Second, "SELECT v FROM t")
	if !ok {
		c.t.Fatalf("reading the rows on the new primary %s failed", r.To)
	}
	for _, l := range strings.Fields(out) {
		v, _ := strconv.Atoi(l)
		have[v] = true
	}
	var firstNew time.Time
	for _, a := range acks {
		if !have[a.V] {
			r.Lost++
		}
		if a.Port == c.Ports[r.To] && (firstNew.IsZero() || a.At.Before(firstNew)) {
			firstNew = a.At
		}
	}
	for _, a := range acks {
		if a.Port == c.Ports[old] && a.At.After(firstNew) {
			r.LateOldAcks = append(r.LateOldAcks, a)
		}
	}
	r.Acked = len(acks)
	return r
}

// Rejoin starts the old primary again and waits until it streams from the
// new one with every row.
func (c *Cluster) Rejoin(old, primary string) {
	c.t.Helper()
	c.Start(old)
	var standbys []string
	for _, m := range c.Members {
		if m != primary {
			standbys = append(standbys, m)
		}
	}
	c.WaitSettled(primary, standbys...)
	want, _ := c.Psql(c.Ports[primary], 10*time.Second, "SELECT count(*) FROM t")
	c.WaitFor("the old primary caught up", time.Minute, func() (bool, string) {
		got, ok := c.Psql(c.Ports[old], 5*time.Second, "SELECT count(*) FROM t")
		return ok && got == want, fmt.Sprintf("%s rows of %s", got, want)
	})
}

// WriteKubeconfig writes, beside the member's data directory, a kubeconfig
// that reaches the API server through the member's cuttable way, readable
// by the servers' user, and returns its path.
func (s MemberSpec) WriteKubeconfig(t T) string {
	t.Helper()
	kc, err := clientcmd.LoadFromFile(s.Kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	for _, cl := range kc.Clusters {
		cl.Server = s.APIServer
	}
	path := filepath.Join(filepath.Dir(s.DataDir), "kubeconfig")
	if err := clientcmd.WriteToFile(*kc, path); err != nil {
		t.Fatal(err)
	}
	_ = os.Chown(path, int(s.UID), int(s.GID))
	return path
}
