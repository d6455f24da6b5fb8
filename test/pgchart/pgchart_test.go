// Package pgchart runs what charts/postgresql renders with real PostgreSQL
// server binaries (Debian's packages; .ci/run installs them): the local
// cluster's pods are simulated, so this is where the chart's configuration,
// authentication and replication are proven.
//
// Each pod of the StatefulSet becomes a directory per volume and processes
// run as an unprivileged user, with these stand-ins for what a node gives a
// pod, and nothing else changed:
//   - a pod's volume mount paths are its directories;
//   - pod 0's DNS name is 127.0.0.1, and each pod's own port (the chart's
//     port, which every pod listens on at its own IP) is a free loopback
//     port: pod 0 keeps the chart's, pod 1 gets another one (set with -c,
//     and in its probes' commands);
//   - the socket directory compiled into Debian's server (/var/run/postgresql,
//     which the chart mounts) is given with -c unix_socket_directories;
//   - the image is this machine: image.binDir names the directory of
//     Debian's server binaries, and the container's command (the chart's
//     own bootstrap: initdb on an empty volume, then postgres) runs as is;
//   - a client in another pod connects from a non-loopback address: the
//     test connects to this machine's own non-loopback address, so the
//     connection comes from it (not from 127.0.0.1, the pod's own, which a
//     port-forward also comes from and which needs the password too).
package pgchart

import (
	"bytes"
	"encoding/base64"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/chartpilot/chartpilot/internal/helm"
	"github.com/chartpilot/chartpilot/internal/testing/testpg"
	"github.com/chartpilot/chartpilot/internal/testing/testwait"
)

// rendered is what the test reads from the chart's manifest.
type rendered struct {
	fullname string
	config   map[string]string // ConfigMap data: file name -> content
	username string
	password string
	// replication is the replication role's password.
	replication string
	sts         *appsv1.StatefulSet
	testPod     *corev1.Pod
	// tls is the TLS Secret's files (tls.crt, tls.key, ca.crt).
	tls map[string]string
}

func render(t *testing.T, vals map[string]any) rendered {
	t.Helper()
	ch, err := helm.LoadChart(filepath.Join("..", "..", "charts", "postgresql"))
	if err != nil {
		t.Fatal(err)
	}
	manifest, err := helm.Template(ch, "db", "default", vals, "")
	if err != nil {
		t.Fatalf("rendering charts/postgresql: %v", err)
	}
	objs, err := helm.ParseManifest(manifest)
	if err != nil {
		t.Fatal(err)
	}
	var out rendered
	for _, o := range objs {
		switch o.GetKind() {
		case "ConfigMap":
			var cm corev1.ConfigMap
			must(t, runtime.DefaultUnstructuredConverter.FromUnstructured(o.Object, &cm))
			out.config = cm.Data
		case "Secret":
			if strings.HasSuffix(o.GetName(), "-tls") {
				out.tls = map[string]string{}
				for k, v := range o.Object["data"].(map[string]any) {
					b, _ := base64.StdEncoding.DecodeString(fmt.Sprint(v))
					out.tls[k] = string(b)
				}
				continue
			}
			var s corev1.Secret
			must(t, runtime.DefaultUnstructuredConverter.FromUnstructured(o.Object, &s))
			out.username, out.password, out.replication = string(s.Data["username"]), string(s.Data["password"]), string(s.Data["replication-password"])
			if out.username == "" {
				// Rendered as data (base64) by the template; the converter keeps it encoded.
				decoded := func(k string) string {
					b, _ := base64.StdEncoding.DecodeString(fmt.Sprint(o.Object["data"].(map[string]any)[k]))
					return string(b)
				}
				out.username, out.password, out.replication = decoded("username"), decoded("password"), decoded("replication-password")
			}
		case "StatefulSet":
			out.sts = &appsv1.StatefulSet{}
			must(t, runtime.DefaultUnstructuredConverter.FromUnstructured(o.Object, out.sts))
			out.fullname = o.GetName()
		case "Pod":
			out.testPod = &corev1.Pod{}
			must(t, runtime.DefaultUnstructuredConverter.FromUnstructured(o.Object, out.testPod))
		}
	}
	if out.config == nil || out.password == "" || out.sts == nil || out.testPod == nil || out.tls["tls.key"] == "" {
		t.Fatalf("the manifest lacks a ConfigMap, a Secret with a password, the TLS Secret, the StatefulSet or the test Pod")
	}
	return out
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// pod is one pod of the StatefulSet, run locally.
type pod struct {
	t       *testing.T
	r       *testpg.Runner
	ordinal int
	port    int
	dir     string
	mounts  map[string]string // mount path -> local directory
	subst   []string          // old, new pairs applied to commands
	env     map[string]string
	server  *exec.Cmd
	logPath string
}

func newPod(t *testing.T, r *testpg.Runner, rd rendered, root string, ordinal, port int) *pod {
	p := &pod{t: t, r: r, ordinal: ordinal, port: port, dir: filepath.Join(root, fmt.Sprintf("%s-%d", rd.fullname, ordinal)), mounts: map[string]string{}}
	r.Mkdir(t, p.dir)
	c := rd.sts.Spec.Template.Spec.Containers[0]
	var paths []string
	for _, m := range c.VolumeMounts {
		local := filepath.Join(p.dir, m.Name)
		r.Mkdir(t, local)
		p.mounts[m.MountPath] = local
		paths = append(paths, m.MountPath)
	}
	// Longest first, so that a path under another mount maps to its own.
	sort.Slice(paths, func(i, j int) bool { return len(paths[i]) > len(paths[j]) })
	for _, mp := range paths {
		p.subst = append(p.subst, mp, p.mounts[mp])
	}
	p.subst = append(p.subst, fmt.Sprintf("%s-0.%s-headless", rd.fullname, rd.fullname), "127.0.0.1")
	// The ConfigMap's and the TLS Secret's volumes' files (the key
	// readable by the server's user only, as the Secret's volume gives it).
	for _, v := range rd.sts.Spec.Template.Spec.Volumes {
		files, mode := rd.config, os.FileMode(0o644)
		switch {
		case v.Secret != nil && v.Secret.SecretName == rd.fullname+"-tls":
			files, mode = rd.tls, 0o600
		case v.ConfigMap == nil:
			continue
		}
		for _, m := range c.VolumeMounts {
			if m.Name != v.Name {
				continue
			}
			for name, content := range files {
				f := filepath.Join(p.mounts[m.MountPath], name)
				must(t, os.WriteFile(f, []byte(p.apply(content)), mode))
				must(t, os.Chown(f, r.UID, r.GID))
			}
		}
	}
	p.env = map[string]string{"HOSTNAME": fmt.Sprintf("%s-%d", rd.fullname, ordinal), "HOME": p.dir}
	for _, e := range c.Env {
		v := e.Value
		if ref := e.ValueFrom; ref != nil && ref.SecretKeyRef != nil {
			switch ref.SecretKeyRef.Key {
			case "username":
				v = rd.username
			case "password":
				v = rd.password
			case "replication-password":
				v = rd.replication
			}
		}
		p.env[e.Name] = p.apply(v)
	}
	return p
}

// containerEnv is c's environment as the kubelet gives it (Secret
// references resolved from the rendered Secret), made to run here.
func (p *pod) containerEnv(rd rendered, c corev1.Container) map[string]string {
	env := map[string]string{}
	for _, e := range c.Env {
		v := e.Value
		if ref := e.ValueFrom; ref != nil && ref.SecretKeyRef != nil {
			v = map[string]string{"username": rd.username, "password": rd.password, "replication-password": rd.replication}[ref.SecretKeyRef.Key]
		}
		env[e.Name] = p.apply(v)
	}
	return env
}

// runInit runs the init containers of the pod in order (their sh -c
// scripts; the agent's installer is the test's to do).
func (p *pod) runInit(rd rendered) {
	p.t.Helper()
	for _, c := range rd.sts.Spec.Template.Spec.InitContainers {
		if len(c.Command) < 3 || c.Command[0] != "sh" {
			continue
		}
		if out, err := p.sh(c.Command[2], p.containerEnv(rd, c)); err != nil {
			p.t.Fatalf("pod %d: init container %s: %v\n%s", p.ordinal, c.Name, err, out)
		}
	}
}

// apply makes a command of the chart run here (see the package comment).
func (p *pod) apply(s string) string {
	return strings.NewReplacer(p.subst...).Replace(s)
}

// sh runs a shell command of the chart (a probe, a script) in the pod.
func (p *pod) sh(script string, extraEnv map[string]string) (string, error) {
	env := map[string]string{}
	for k, v := range p.env {
		env[k] = v
	}
	for k, v := range extraEnv {
		env[k] = v
	}
	cmd := p.r.Command(env, "sh", "-c", p.apply(script))
	cmd.Dir = p.dir
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// start runs the container as the kubelet would: its command (sh -c, the
// chart's bootstrap) with its args, then the stand-ins' socket directory
// and port.
func (p *pod) start(rd rendered) {
	t := p.t
	c := rd.sts.Spec.Template.Spec.Containers[0]
	if len(c.Command) != 4 || c.Command[0] != "sh" || c.Command[1] != "-c" {
		t.Fatalf("the postgresql container's command is not sh -c SCRIPT NAME: %q", c.Command)
	}
	args := []string{"-c", p.apply(c.Command[2]), c.Command[3]}
	for _, a := range c.Args {
		args = append(args, p.apply(a))
	}
	args = append(args, "-c", "unix_socket_directories="+p.mounts["/var/run/postgresql"], "-c", fmt.Sprintf("port=%d", p.port))
	p.logPath = filepath.Join(p.dir, "server.log")
	logFile, err := os.Create(p.logPath)
	must(t, err)
	p.server = p.r.Command(p.env, "sh", args...)
	p.server.Stdout, p.server.Stderr = logFile, logFile
	if err := p.server.Start(); err != nil {
		t.Fatalf("pod %d: starting postgres: %v", p.ordinal, err)
	}
	t.Cleanup(func() {
		testpg.StopServer(p.server)
		logFile.Close()
		if t.Failed() {
			log, _ := os.ReadFile(p.logPath)
			t.Logf("pod %d server log:\n%s", p.ordinal, log)
		}
	})
}

// probe runs the container's probe command; the pod's own port stands in
// for the chart's.
func (p *pod) probe(pr *corev1.Probe, chartPort int) error {
	cmd := strings.Join(pr.Exec.Command[2:], " ")
	if pr.Exec.Command[0] != "sh" || pr.Exec.Command[1] != "-c" {
		return fmt.Errorf("probe is not a shell command: %q", pr.Exec.Command)
	}
	cmd = strings.ReplaceAll(cmd, fmt.Sprintf("-p %d", chartPort), fmt.Sprintf("-p %d", p.port))
	out, err := p.sh(cmd, nil)
	if err != nil {
		return fmt.Errorf("%s: %v: %s", cmd, err, out)
	}
	return nil
}

// waitProbe waits until the startup probe passes (its own budget:
// periodSeconds × failureThreshold).
func (p *pod) waitProbe(pr *corev1.Probe, chartPort int) {
	budget := time.Duration(pr.PeriodSeconds*pr.FailureThreshold) * time.Second
	deadline := time.Now().Add(budget)
	var err error
	for time.Now().Before(deadline) {
		if err = p.probe(pr, chartPort); err == nil {
			return
		}
		if p.server.ProcessState != nil {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	log, _ := os.ReadFile(p.logPath)
	p.t.Fatalf("pod %d: startup probe did not pass within %s: %v\n%s", p.ordinal, budget, err, log)
}

// psql runs a query as a client would, from host:port, with password.
func psql(r *testpg.Runner, host string, port int, userName, password, query string) (string, error) {
	cmd := r.Command(map[string]string{"PGPASSWORD": password, "PGCONNECT_TIMEOUT": "10"}, "psql", "-h", host, "-p", strconv.Itoa(port), "-U", userName, "-d", "postgres", "-XAtc", query)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	if err != nil {
		return "", fmt.Errorf("%v: %s", err, strings.TrimSpace(errb.String()))
	}
	return strings.TrimSpace(out.String()), nil
}

// outsideAddress is an address of this machine that is not loopback: a
// connection to it comes from it, as a client in another pod would.
func outsideAddress(t *testing.T) string {
	addrs, err := net.InterfaceAddrs()
	must(t, err)
	for _, a := range addrs {
		if ipn, ok := a.(*net.IPNet); ok && ipn.IP.To4() != nil && !ipn.IP.IsLoopback() {
			return ipn.IP.String()
		}
	}
	t.Fatal("this machine has no non-loopback IPv4 address: the test cannot connect as a client from another pod would")
	return ""
}

// k8sEnv expands $(NAME) references of a container command, as the kubelet does.
func k8sEnv(s string, env map[string]string) string {
	return regexp.MustCompile(`\$\(([A-Za-z_][A-Za-z0-9_]*)\)`).ReplaceAllStringFunc(s, func(m string) string {
		if v, ok := env[m[2:len(m)-1]]; ok {
			return v
		}
		return m
	})
}

// TestChartRunsRealPostgreSQL renders charts/postgresql as a primary and one
// streaming replica with tuned parameters and runs it: the replica is
// cloned by the chart's init script over the replication line of its
// pg_hba.conf with the generated password, a row written on the primary is
// read on the replica, the parameters are live, every probe passes, the
// helm test command connects, and a wrong password is refused.
func TestChartRunsRealPostgreSQL(t *testing.T) {
	r := testpg.NewRunner(t, testpg.Bin(t))
	ports := []int{testpg.FreePort(t), testpg.FreePort(t)}
	for ports[1] == ports[0] {
		ports[1] = testpg.FreePort(t)
	}
	chartPort := ports[0]
	rd := render(t, map[string]any{
		"image":      map[string]any{"binDir": testpg.Bin(t)},
		"replicas":   2,
		"service":    map[string]any{"port": chartPort},
		"parameters": map[string]any{"shared_buffers": "48MB", "max_connections": "40", "work_mem": "8MB"},
	})
	root := r.TempDir(t)
	init := rd.sts.Spec.Template.Spec.InitContainers[0]
	main := rd.sts.Spec.Template.Spec.Containers[0]

	// The init container's own settings (TLS verification of pod 0).
	initEnv := map[string]string{}
	for _, e := range init.Env {
		if e.ValueFrom == nil {
			initEnv[e.Name] = e.Value
		}
	}
	if initEnv["PGSSLMODE"] != "verify-full" {
		t.Errorf("the init container clones with PGSSLMODE %q, want verify-full", initEnv["PGSSLMODE"])
	}
	for _, e := range main.Env {
		if e.ValueFrom != nil {
			t.Errorf("the postgresql container's environment has %s from a Secret: its exec probes carry it beside the server", e.Name)
		}
	}
	primary := newPod(t, r, rd, root, 0, ports[0])
	primary.runInit(rd)
	primary.start(rd)
	primary.waitProbe(main.StartupProbe, chartPort)

	replica := newPod(t, r, rd, root, 1, ports[1])
	replica.runInit(rd)
	if _, err := os.Stat(filepath.Join(replica.env["PGDATA"], "standby.signal")); err != nil {
		t.Fatalf("pod 1: the init script did not make a standby: %v", err)
	}
	replica.start(rd)
	replica.waitProbe(main.StartupProbe, chartPort)

	for _, p := range []*pod{primary, replica} {
		for name, pr := range map[string]*corev1.Probe{"startup": main.StartupProbe, "readiness": main.ReadinessProbe, "liveness": main.LivenessProbe} {
			if err := p.probe(pr, chartPort); err != nil {
				t.Errorf("pod %d: %s probe: %v", p.ordinal, name, err)
			}
		}
	}

	outside := outsideAddress(t)
	q := func(p *pod, query string) string {
		t.Helper()
		out, err := psql(r, outside, p.port, rd.username, rd.password, query)
		if err != nil {
			t.Fatalf("pod %d: %s: %v", p.ordinal, query, err)
		}
		return out
	}
	if got := q(replica, "select pg_is_in_recovery()"); got != "t" {
		t.Fatalf("pod 1 is not a standby: pg_is_in_recovery() = %s", got)
	}
	// Every TCP connection is TLS: the replica's stream, and clients (one
	// without TLS is refused).
	if !testwait.Until(time.Minute, 200*time.Millisecond, func() bool {
		return q(primary, "select string_agg(s.ssl::text, ',') from pg_stat_replication r join pg_stat_ssl s using (pid)") == "true"
	}) {
		t.Errorf("the replica does not stream over TLS: %q", q(primary, "select string_agg(s.ssl::text, ',') from pg_stat_replication r join pg_stat_ssl s using (pid)"))
	}
	if out, err := r.Command(map[string]string{"PGPASSWORD": rd.password, "PGSSLMODE": "disable", "PGCONNECT_TIMEOUT": "10"}, "psql", "-h", outside, "-p", strconv.Itoa(primary.port), "-U", rd.username, "-d", "postgres", "-XAtc", "select 1").CombinedOutput(); err == nil || !strings.Contains(string(out), "no encryption") {
		t.Errorf("a client without TLS was not refused: %v %s", err, out)
	}
	// The replica streams as the replication role, not the superuser.
	if got := q(primary, "select string_agg(usename::text, ',') from pg_stat_replication"); got != "replicator" {
		t.Errorf("the replica streams as %q, want replicator", got)
	}
	// A role that may read the server's files (pg_read_binary_file)
	// reads the server's memory, its environment's copy included: the
	// superuser's password is not in it.
	for _, p := range []*pod{primary, replica} {
		mem, err := testpg.ServerMemory(func(sql string) (string, error) { return psql(r, outside, p.port, rd.username, rd.password, sql) })
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Contains(mem, []byte("PGDATA=")) {
			t.Fatalf("pod %d: PGDATA= not in the %d bytes read of the server's memory: the search finds nothing", p.ordinal, len(mem))
		}
		if bytes.Contains(mem, []byte(rd.password)) {
			t.Errorf("pod %d: the superuser's password is in the server's memory", p.ordinal)
		}
	}
	q(primary, "create table probe (id int primary key, note text); insert into probe values (1, 'written on the primary')")
	var note string
	var qerr error
	if !testwait.Until(time.Minute, 200*time.Millisecond, func() bool {
		note, qerr = psql(r, outside, replica.port, rd.username, rd.password, "select note from probe where id = 1")
		return qerr == nil && note == "written on the primary"
	}) {
		t.Fatalf("the row written on the primary is not on the replica after a minute: %q %v", note, qerr)
	}
	for _, p := range []*pod{primary, replica} {
		for name, want := range map[string]string{"shared_buffers": "48MB", "max_connections": "40", "work_mem": "8MB"} {
			if got := q(p, "show "+name); got != want {
				t.Errorf("pod %d: SHOW %s = %s, want %s (from parameters)", p.ordinal, name, got, want)
			}
		}
	}

	// helm test: the test Pod's command, against the primary's Service.
	tc := rd.testPod.Spec.Containers[0]
	env := map[string]string{}
	for _, e := range tc.Env {
		switch e.ValueFrom.SecretKeyRef.Key {
		case "username":
			env[e.Name] = rd.username
		case "password":
			env[e.Name] = rd.password
		}
	}
	args := make([]string, len(tc.Command))
	for i, a := range tc.Command {
		a = k8sEnv(a, env)
		if a == rd.fullname { // the primary's Service
			a = outside
		}
		args[i] = a
	}
	cmd := r.Command(env, args[0], args[1:]...)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Errorf("helm test command %q: %v\n%s", args, err, out)
	}
	env["PGPASSWORD"] = rd.password + "-wrong"
	cmd = r.Command(env, args[0], args[1:]...)
	out, err := cmd.CombinedOutput()
	if err == nil || !strings.Contains(string(out), "password authentication failed") {
		t.Errorf("a wrong password was not refused: %v\n%s", err, out)
	}
	// Loopback (the pod's own address, and where a port-forward arrives)
	// is no way in without the password.
	if out, err := r.Command(map[string]string{"PGCONNECT_TIMEOUT": "10"}, "psql", "-w", "-h", "127.0.0.1", "-p", strconv.Itoa(chartPort), "-U", rd.username, "-d", "postgres", "-XAtc", "select 1").CombinedOutput(); err == nil {
		t.Errorf("the superuser logged in over 127.0.0.1 without a password: %s", out)
	}
}
