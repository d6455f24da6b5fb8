package instance_test

import (
	"encoding/base64"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/chartpilot/chartpilot/internal/agent/instance/instancetest"
	"github.com/chartpilot/chartpilot/internal/helm"
	"github.com/chartpilot/chartpilot/internal/testing/testcluster"
	"github.com/chartpilot/chartpilot/internal/testing/testpg"
)

// chartMember is what charts/postgresql renders for a member with
// failover on: the PostgreSQL container's command, its environment (the
// Secret's values resolved) and the ConfigMap's files.
type chartMember struct {
	command []string
	env     map[string]string
	config  map[string]string
	// tls is the TLS Secret's files.
	tls map[string]string
}

func renderFailover(t *testing.T) chartMember {
	t.Helper()
	root, err := testcluster.ModuleRoot()
	if err != nil {
		t.Fatal(err)
	}
	ch, err := helm.LoadChart(filepath.Join(root, "charts", "postgresql"))
	if err != nil {
		t.Fatal(err)
	}
	manifest, err := helm.Template(ch, instancetest.ClusterName, "default", map[string]any{
		"replicas": 3,
		"failover": map[string]any{"enabled": true, "synchronous": 1,
			"leaseDuration": fmt.Sprintf("%dms", instancetest.LeaseDuration.Milliseconds()), "renewDeadline": fmt.Sprintf("%dms", instancetest.RenewDeadline.Milliseconds())},
	}, "")
	if err != nil {
		t.Fatalf("rendering charts/postgresql: %v", err)
	}
	objs, err := helm.ParseManifest(manifest)
	if err != nil {
		t.Fatal(err)
	}
	out := chartMember{env: map[string]string{}, tls: map[string]string{}}
	secret := map[string]string{}
	var sts *appsv1.StatefulSet
	for _, o := range objs {
		switch o.GetKind() {
		case "ConfigMap":
			cm := &corev1.ConfigMap{}
			if err := runtime.DefaultUnstructuredConverter.FromUnstructured(o.Object, cm); err != nil {
				t.Fatal(err)
			}
			out.config = cm.Data
		case "Secret":
			data, _ := o.Object["data"].(map[string]any)
			for k, v := range data {
				b, _ := base64.StdEncoding.DecodeString(fmt.Sprint(v))
				if o.GetName() == instancetest.ClusterName+"-tls" {
					out.tls[k] = string(b)
				} else {
					secret[k] = string(b)
				}
			}
		case "StatefulSet":
			sts = &appsv1.StatefulSet{}
			if err := runtime.DefaultUnstructuredConverter.FromUnstructured(o.Object, sts); err != nil {
				t.Fatal(err)
			}
		}
	}
	if sts == nil || out.config == nil || secret["password"] == "" || secret["replication-password"] == "" || out.tls["tls.key"] == "" || out.tls["ca.crt"] == "" {
		t.Fatal("the manifest lacks the StatefulSet, the ConfigMap, the Secret's passwords or the TLS Secret")
	}
	c := sts.Spec.Template.Spec.Containers[0]
	out.command = append(c.Command, c.Args...)
	for _, e := range c.Env {
		switch {
		case e.ValueFrom == nil:
			out.env[e.Name] = e.Value
		case e.ValueFrom.SecretKeyRef != nil:
			out.env[e.Name] = secret[e.ValueFrom.SecretKeyRef.Key]
		}
	}
	return out
}

// TestChartFailoverCommandLines runs what charts/postgresql renders for
// failover (three pods, one synchronous standby) with real servers: each
// member is the container's own command line, the real chartpilot
// binary, with the chart's postgresql.conf and pg_hba.conf (replication
// as the replication role with the Secret's replication-password; the
// superuser's password set at initdb). Stand-ins
// for what a node gives a pod, and nothing else: the mount paths are
// directories, the binaries are Debian's PostgreSQL's, every pod's address
// is loopback with a port of its own, the downward API's POD_NAME and
// POD_NAMESPACE are set, and a kubeconfig replaces the in-cluster token.
// Then the primary is SIGKILLed under writes: a standby takes over within
// 15 s, no acknowledged row is lost, the old primary rejoins (rewound as
// the replication role), and every standby streams as that role.
func TestChartFailoverCommandLines(t *testing.T) {
	cluster.Skip(t)
	m := renderFailover(t)
	if len(m.command) < 2 || m.command[0] != "/chartpilot/bin/chartpilot" || m.command[1] != "instance" {
		t.Fatalf("the chart's container runs %v, want /chartpilot/bin/chartpilot instance", m.command)
	}
	r := testpg.NewRunner(t, testpg.Bin(t))
	dir := r.TempDir(t)
	chartpilot := filepath.Join(dir, "chartpilot")
	if out, err := exec.Command("go", "build", "-o", chartpilot, "../../../cmd/chartpilot").CombinedOutput(); err != nil {
		t.Fatalf("building chartpilot: %v\n%s", err, out)
	}
	if err := os.Chmod(chartpilot, 0o755); err != nil {
		t.Fatal(err)
	}
	// The TLS Secret's files, as its volume gives them: the key readable
	// by the server's user only.
	tlsDir := filepath.Join(dir, "tls")
	r.Mkdir(t, tlsDir)
	for name, content := range m.tls {
		f := filepath.Join(tlsDir, name)
		if err := os.WriteFile(f, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Chown(f, r.UID, r.GID); err != nil {
			t.Fatal(err)
		}
	}
	configDir := filepath.Join(dir, "config")
	r.Mkdir(t, configDir)
	for name, content := range m.config {
		content = strings.ReplaceAll(content, "/etc/postgresql-tls/", tlsDir+"/")
		if err := os.WriteFile(filepath.Join(configDir, name), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	c := instancetest.New(t, instancetest.Options{
		API: cluster, Namespace: cluster.Namespace(t), Synchronous: 1, Members: []string{"pg-0", "pg-1", "pg-2"},
		// The chart's pg_hba.conf trusts only the socket.
		Password: m.env["POSTGRES_PASSWORD"],
		Command: func(s instancetest.MemberSpec) *exec.Cmd {
			kubeconfig := s.WriteKubeconfig(t)
			args := chartArgs(t, m.command[2:], s, configDir)
			cmd := exec.Command(chartpilot, append(append([]string{"instance"}, args...), "--kubeconfig", kubeconfig)...)
			cmd.Env = []string{"PATH=/usr/bin:/bin", "LANG=C", "POD_NAME=" + s.Member, "POD_NAMESPACE=" + s.Namespace}
			for k, v := range m.env {
				cmd.Env = append(cmd.Env, k+"="+strings.ReplaceAll(v, "/var/lib/postgresql/data/pgdata", s.DataDir))
			}
			cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: s.UID, Gid: s.GID}, Pdeathsig: syscall.SIGKILL}
			return cmd
		},
	})
	old, standbys := c.WaitSettled("")
	c.WaitSettled(old, standbys...)
	res := c.Failover(1)
	t.Logf("failover %s → %s: %s to the first acknowledged write; %d rows acknowledged, %d lost", res.From, res.To, res.Took.Round(time.Millisecond), res.Acked, res.Lost)
	checkFailover(t, res)
	if res.Lost != 0 {
		t.Errorf("%d acknowledged rows lost with the chart's synchronous standby", res.Lost)
	}
	c.Rejoin(old, res.To)
	// Every standby, the rewound old primary too, streams as the
	// chart's replication role, which is no superuser, over TLS (the
	// members verify each other's certificates: verify-full).
	c.WaitFor("both standbys streaming as replicator over TLS", time.Minute, func() (bool, string) {
		out, _ := c.Psql(c.Ports[res.To], 5*time.Second, "SELECT string_agg(application_name || '=' || usename || '/' || s.ssl, ',' ORDER BY application_name) FROM pg_stat_replication JOIN pg_stat_ssl s USING (pid)")
		var want []string
		for _, mem := range c.Members {
			if mem != res.To {
				want = append(want, mem+"=replicator/true")
			}
		}
		return out == strings.Join(want, ","), out
	})
	if out, _ := c.Psql(c.Ports[res.To], 5*time.Second, "SELECT rolsuper, rolreplication FROM pg_roles WHERE rolname = 'replicator'"); out != "f|t" {
		t.Errorf("the replication role's rolsuper|rolreplication = %q, want f|t", out)
	}
	// The kubelet's probes: every member answers over HTTP that its
	// server accepts connections.
	for _, mem := range c.Members {
		c.WaitFor(mem+" ready over HTTP", time.Minute, func() (bool, string) {
			resp, err := http.Get("http://" + healthAddress(t, mem) + "/readyz")
			if err != nil {
				return false, err.Error()
			}
			resp.Body.Close()
			return resp.StatusCode == http.StatusOK, resp.Status
		})
	}
}

var healthAddresses sync.Map

// healthAddress is member's address for the kubelet's probes, the same
// at each start.
func healthAddress(t *testing.T, member string) string {
	a, _ := healthAddresses.LoadOrStore(member, "127.0.0.1:"+strconv.Itoa(testpg.FreePort(t)))
	return a.(string)
}

// chartArgs maps the chart's flags to this machine (the stand-ins above);
// every flag it maps must be there, so a change of the chart's command
// line fails here rather than going unrun.
func chartArgs(t *testing.T, args []string, s instancetest.MemberSpec, configDir string) []string {
	t.Helper()
	local := map[string]string{
		"--cluster":     s.Cluster,
		"--bin":         s.Bin,
		"--data-dir":    s.DataDir,
		"--socket-dir":  s.SocketDir,
		"--log-dir":     s.LogDir,
		"--config-file": filepath.Join(configDir, "postgresql.conf"),
		"--hba-file":    filepath.Join(configDir, "pg_hba.conf"),
		"--address":     "127.0.0.1:" + strconv.Itoa(s.Port),
		"--port":        strconv.Itoa(s.Port),
		"--tls-ca-file": filepath.Join(filepath.Dir(configDir), "tls", "ca.crt"),
		// The kubelet's probes reach each pod's own address; here each
		// member has a port of its own.
		"--health-address": healthAddress(t, s.Member),
	}
	seen := map[string]bool{}
	var out []string
	for _, a := range args {
		name, value, ok := strings.Cut(a, "=")
		if !ok {
			t.Fatalf("the chart passes %q, not --flag=value", a)
		}
		if v, mapped := local[name]; mapped {
			value = v
			seen[name] = true
		}
		out = append(out, name+"="+value)
	}
	for name := range local {
		if !seen[name] {
			t.Fatalf("the chart's command line %v has no %s", args, name)
		}
	}
	return out
}
