package nodes

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	authv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/wait"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	"sigs.k8s.io/yaml"

	"github.com/chartpilot/chartpilot/internal/rbac"
	"github.com/chartpilot/chartpilot/internal/testing/testcluster"
	"github.com/chartpilot/chartpilot/internal/testing/testpg"
)

var (
	backupStoreGVR    = schema.GroupVersionResource{Group: "chartpilot.dev", Version: "v1alpha1", Resource: "backupstores"}
	backupGVR         = schema.GroupVersionResource{Group: "chartpilot.dev", Version: "v1alpha1", Resource: "backups"}
	serviceMonitorGVR = schema.GroupVersionResource{Group: "monitoring.coreos.com", Version: "v1", Resource: "servicemonitors"}
	prometheusRuleGVR = schema.GroupVersionResource{Group: "monitoring.coreos.com", Version: "v1", Resource: "prometheusrules"}
)

// promServer is a Prometheus server (bin/prometheus, from the module
// promtool comes from) on loopback.
type promServer struct {
	url string
}

// startPrometheus runs Prometheus with config (prometheus.yml) and rule
// files (name -> content, beside it) until the test ends.
func startPrometheus(t *testing.T, config []byte, rules map[string][]byte) *promServer {
	t.Helper()
	root, err := testcluster.ModuleRoot()
	if err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(root, "bin", "prometheus")
	if _, err := os.Stat(bin); err != nil {
		t.Fatalf("%s: run make tools", bin)
	}
	dir := t.TempDir()
	for name, b := range rules {
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(dir, "prometheus.yml"), config, 0o644); err != nil {
		t.Fatal(err)
	}
	addr := fmt.Sprintf("127.0.0.1:%d", testpg.FreePort(t))
	logf, err := os.Create(filepath.Join(dir, "prometheus.log"))
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "--config.file="+filepath.Join(dir, "prometheus.yml"), "--storage.tsdb.path="+filepath.Join(dir, "data"),
		"--web.listen-address="+addr, "--log.level=warn")
	cmd.Dir, cmd.Stdout, cmd.Stderr = dir, logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		logf.Close()
		if t.Failed() {
			b, _ := os.ReadFile(logf.Name())
			t.Logf("prometheus log:\n%s", b)
		}
	})
	p := &promServer{url: "http://" + addr}
	err = wait.PollUntilContextTimeout(context.Background(), 500*time.Millisecond, time.Minute, true, func(context.Context) (bool, error) {
		resp, err := http.Get(p.url + "/-/ready")
		if err != nil {
			return false, nil
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK, nil
	})
	if err != nil {
		t.Fatal("Prometheus did not become ready within a minute")
	}
	return p
}

// api GETs /api/v1/PATH and decodes its data into out.
func (p *promServer) api(t *testing.T, path string, query url.Values, out any) {
	t.Helper()
	c := &http.Client{Timeout: 10 * time.Second}
	resp, err := c.Get(p.url + "/api/v1/" + path + "?" + query.Encode())
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var body struct {
		Status string          `json:"status"`
		Error  string          `json:"error"`
		Data   json.RawMessage `json:"data"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&body); err != nil {
		t.Fatalf("Prometheus /api/v1/%s: %v", path, err)
	}
	if body.Status != "success" {
		t.Fatalf("Prometheus /api/v1/%s?%s: %s", path, query.Encode(), body.Error)
	}
	if err := json.Unmarshal(body.Data, out); err != nil {
		t.Fatal(err)
	}
}

// series is one element of an instant vector.
type series struct {
	Metric map[string]string `json:"metric"`
	Value  [2]any            `json:"value"`
}

// query evaluates expr now.
func (p *promServer) query(t *testing.T, expr string) []series {
	t.Helper()
	var out struct {
		Result []series `json:"result"`
	}
	p.api(t, "query", url.Values{"query": {expr}}, &out)
	return out.Result
}

// alertState is the state of alert name ("firing", "pending" or "" when
// inactive) and the labels of its instances.
func (p *promServer) alertState(t *testing.T, name string) (string, []map[string]string) {
	t.Helper()
	var out struct {
		Alerts []struct {
			Labels map[string]string `json:"labels"`
			State  string            `json:"state"`
		} `json:"alerts"`
	}
	p.api(t, "alerts", nil, &out)
	state := ""
	var labels []map[string]string
	for _, a := range out.Alerts {
		if a.Labels["alertname"] != name {
			continue
		}
		labels = append(labels, a.Labels)
		if state != "firing" {
			state = a.State
		}
	}
	return state, labels
}

// waitQuery waits until expr returns at least one series and returns them.
func (p *promServer) waitQuery(t *testing.T, expr string, timeout time.Duration) []series {
	t.Helper()
	var got []series
	err := wait.PollUntilContextTimeout(context.Background(), 2*time.Second, timeout, true, func(context.Context) (bool, error) {
		got = p.query(t, expr)
		return len(got) > 0, nil
	})
	if err != nil {
		var targets any
		p.api(t, "targets", nil, &targets)
		t.Fatalf("no series for %s within %s; targets: %v", expr, timeout, targets)
	}
	return got
}

// promAccess is how the test's Prometheus reaches the cluster: the API
// server's address and CA, and a token of its own ServiceAccount, which
// also authorizes its scrapes of the operator's /metrics.
type promAccess struct {
	apiServer, caFile, tokenFile string
}

var labelChars = regexp.MustCompile(`[^a-zA-Z0-9_]`)

// scrapeConfigs turns ServiceMonitors into scrape configurations the way
// the Prometheus Operator does (role endpointslice): the Service's labels
// and the port's name select targets; namespace, service, pod, container
// and endpoint labels; the job from jobLabel or the Service's name; then
// the ServiceMonitor's own relabelings; honorLabels, interval, scheme and
// TLS as it asks. A bearerTokenFile (the pod's token, in a Prometheus pod)
// is the test Prometheus's own token.
func scrapeConfigs(t *testing.T, sms []unstructured.Unstructured, access promAccess) []any {
	t.Helper()
	var out []any
	for _, sm := range sms {
		spec, _ := sm.Object["spec"].(map[string]any)
		namespaces := []any{sm.GetNamespace()}
		if names, ok, _ := unstructured.NestedSlice(spec, "namespaceSelector", "matchNames"); ok {
			namespaces = names
		}
		match, _, _ := unstructured.NestedStringMap(spec, "selector", "matchLabels")
		endpoints, _, _ := unstructured.NestedSlice(spec, "endpoints")
		jobLabel, _, _ := unstructured.NestedString(spec, "jobLabel")
		for i, e := range endpoints {
			ep := e.(map[string]any)
			port, _ := ep["port"].(string)
			var relabel []any
			for k, v := range match {
				k = labelChars.ReplaceAllString(k, "_")
				relabel = append(relabel, map[string]any{"action": "keep", "source_labels": []any{"__meta_kubernetes_service_label_" + k, "__meta_kubernetes_service_labelpresent_" + k}, "regex": "(" + regexp.QuoteMeta(v) + ");true"})
			}
			relabel = append(relabel,
				map[string]any{"action": "keep", "source_labels": []any{"__meta_kubernetes_endpointslice_port_name"}, "regex": regexp.QuoteMeta(port)},
				map[string]any{"source_labels": []any{"__meta_kubernetes_namespace"}, "target_label": "namespace"},
				map[string]any{"source_labels": []any{"__meta_kubernetes_service_name"}, "target_label": "service"},
				map[string]any{"source_labels": []any{"__meta_kubernetes_pod_name"}, "target_label": "pod"},
				map[string]any{"source_labels": []any{"__meta_kubernetes_pod_container_name"}, "target_label": "container"},
				map[string]any{"action": "drop", "source_labels": []any{"__meta_kubernetes_pod_phase"}, "regex": "(Failed|Succeeded)"},
				map[string]any{"source_labels": []any{"__meta_kubernetes_service_name"}, "target_label": "job"},
			)
			if jobLabel != "" {
				relabel = append(relabel, map[string]any{"source_labels": []any{"__meta_kubernetes_service_label_" + labelChars.ReplaceAllString(jobLabel, "_")}, "target_label": "job", "regex": "(.+)"})
			}
			relabel = append(relabel, map[string]any{"target_label": "endpoint", "replacement": port})
			rls, _, _ := unstructured.NestedSlice(ep, "relabelings")
			for _, r := range rls {
				relabel = append(relabel, promRelabel(r.(map[string]any)))
			}
			job := map[string]any{
				"job_name":        fmt.Sprintf("serviceMonitor/%s/%s/%d", sm.GetNamespace(), sm.GetName(), i),
				"honor_labels":    ep["honorLabels"] == true,
				"relabel_configs": relabel,
				"kubernetes_sd_configs": []any{map[string]any{
					"role": "endpointslice", "api_server": access.apiServer,
					"namespaces":    map[string]any{"names": namespaces},
					"tls_config":    map[string]any{"ca_file": access.caFile},
					"authorization": map[string]any{"credentials_file": access.tokenFile},
				}},
			}
			if v, ok := ep["interval"].(string); ok {
				job["scrape_interval"] = v
			}
			if v, ok := ep["scheme"].(string); ok {
				job["scheme"] = v
			}
			if _, ok := ep["bearerTokenFile"]; ok {
				job["authorization"] = map[string]any{"credentials_file": access.tokenFile}
			}
			if tc, ok := ep["tlsConfig"].(map[string]any); ok && tc["insecureSkipVerify"] == true {
				job["tls_config"] = map[string]any{"insecure_skip_verify": true}
			}
			out = append(out, job)
		}
	}
	return out
}

// promRelabel is a ServiceMonitor relabeling in Prometheus's own spelling.
func promRelabel(r map[string]any) map[string]any {
	names := map[string]string{"sourceLabels": "source_labels", "targetLabel": "target_label", "replacement": "replacement",
		"regex": "regex", "action": "action", "separator": "separator", "modulus": "modulus"}
	out := map[string]any{}
	for k, v := range r {
		if n, ok := names[k]; ok {
			out[n] = v
		}
	}
	return out
}

// ruleFile is the groups of a PrometheusRule as a rule file, each for:
// shortened to forDuration (the expressions as they are), so that a test
// sees an alert fire in seconds.
func ruleFile(t *testing.T, pr map[string]any, forDuration string) []byte {
	t.Helper()
	groups, _, _ := unstructured.NestedSlice(pr, "spec", "groups")
	for _, g := range groups {
		rules, _ := g.(map[string]any)["rules"].([]any)
		for _, r := range rules {
			if rule := r.(map[string]any); rule["for"] != nil {
				rule["for"] = forDuration
			}
		}
	}
	b, err := yaml.Marshal(map[string]any{"groups": groups})
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestMonitoringScrapedForReal: a Prometheus (bin/prometheus) scrapes what
// the shipped ServiceMonitors select, relabelled as the Prometheus
// Operator does: the operator's pod (charts/chartpilot, HTTPS with the
// Prometheus's own token) as job="chartpilot", and a Postgres's exporter
// sidecar; it evaluates the shipped rules (config/prometheus and the
// Postgres's PrometheusRule, their for: durations shortened to 20 s, the
// expressions as shipped) on those series. A real backup (a Job on the
// real node, to a volume store) makes chartpilot_backup_last_success_*
// keep its namespace label: PostgresBackupTooOld is quiet while the
// backup is younger than backupMaxAgeSeconds and fires once it is older;
// ChartpilotDown is quiet while the operator runs and fires once it is
// scaled to zero.
func TestMonitoringScrapedForReal(t *testing.T) {
	ctx := context.Background()
	cs, dyn := clients(t)
	crdOpts := envtest.CRDInstallOptions{Paths: []string{
		filepath.Join("..", "e2e", "testdata", "monitoring.coreos.com_servicemonitors.yaml"),
		filepath.Join("..", "e2e", "testdata", "monitoring.coreos.com_prometheusrules.yaml")}}
	if _, err := envtest.InstallCRDs(cluster.Config, crdOpts); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = envtest.UninstallCRDs(cluster.Config, crdOpts) })
	pgRepo, exporter := postgresImages(t)
	ops := cluster.Namespace(t)
	installOperator(t, ops, 1, map[string]any{
		"metrics":       map[string]any{"serviceMonitor": map[string]any{"enabled": true, "interval": "5s"}},
		"postgresImage": pgRepo,
	})

	// A tenant's Postgres 15 with monitoring, and a volume store.
	tenant := cluster.Namespace(t)
	if _, err := rbac.CreateDeployer(ctx, cs, tenant, rbac.DefaultDeployer, rbac.DefaultDeployer); err != nil {
		t.Fatal(err)
	}
	claim := &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Namespace: tenant, Name: "backups"}, Spec: corev1.PersistentVolumeClaimSpec{
		AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
		Resources:   corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Gi")}}}}
	if _, err := cs.CoreV1().PersistentVolumeClaims(tenant).Create(ctx, claim, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	create := func(gvr schema.GroupVersionResource, kind, name string, spec map[string]any) {
		t.Helper()
		createThroughWebhook(t, dyn, gvr, tenant, kind, name, spec)
	}
	create(backupStoreGVR, "BackupStore", "local", map[string]any{"volume": map[string]any{"claimName": "backups"}})
	const maxAge = 90 // backupMaxAgeSeconds
	create(postgresGVR, "Postgres", "db", map[string]any{
		"version": "15", "storage": map[string]any{"size": "1Gi"},
		"monitoring":   map[string]any{"enabled": true},
		"nodeSelector": map[string]any{testcluster.RealNodeLabel: "true"},
		"tolerations":  []any{map[string]any{"key": testcluster.RealNodeTaint, "operator": "Exists", "effect": "NoSchedule"}},
		"values": map[string]any{
			"image": map[string]any{"repository": pgRepo},
			"metrics": map[string]any{
				"image":          map[string]any{"repository": exporter, "tag": "bookworm"},
				"serviceMonitor": map[string]any{"interval": "5s"},
				"prometheusRule": map[string]any{"backupMaxAgeSeconds": maxAge},
			},
		},
	})
	waitReady(t, dyn, postgresGVR, tenant, "db", "True", 6*time.Minute)
	create(backupGVR, "Backup", "first", map[string]any{"target": map[string]any{"kind": "Postgres", "name": "db"}, "store": map[string]any{"name": "local"}})
	waitBackupCompleted(t, tenant, "first")
	backedUp := time.Now()

	prom := prometheusOf(t, ops, tenant)

	// The series, with the labels the rules and dashboards select on.
	up := prom.waitQuery(t, `up{job="chartpilot", namespace="`+ops+`"} == 1`, 2*time.Minute)
	if !strings.HasPrefix(up[0].Metric["pod"], "chartpilot-") {
		t.Errorf("the operator's target: %v, want its pod", up[0].Metric)
	}
	pgUp := prom.waitQuery(t, `pg_up{namespace="`+tenant+`", pod="db-0", release="db"} == 1`, 2*time.Minute)
	t.Logf("exporter series: %v", pgUp[0].Metric)
	last := prom.waitQuery(t, `chartpilot_backup_last_success_timestamp_seconds{namespace="`+tenant+`", name="db", kind="Postgres"}`, 2*time.Minute)
	if _, ok := last[0].Metric["exported_namespace"]; ok {
		t.Errorf("the backup series has exported_namespace: %v", last[0].Metric)
	}

	// Rules are evaluated from Prometheus's start, before the first
	// scrape: ChartpilotDown's absent() holds until then. Once evaluated
	// on the series, it is quiet.
	err := wait.PollUntilContextTimeout(ctx, 2*time.Second, time.Minute, true, func(context.Context) (bool, error) {
		state, _ := prom.alertState(t, "ChartpilotDown")
		return state == "", nil
	})
	if err != nil {
		state, labels := prom.alertState(t, "ChartpilotDown")
		t.Fatalf("ChartpilotDown is %s while the operator runs and is scraped: %v", state, labels)
	}

	// PostgresBackupTooOld: quiet while the backup is young, then firing.
	quietUntil := backedUp.Add(maxAge * time.Second)
	for time.Now().Before(quietUntil.Add(-30 * time.Second)) {
		if state, _ := prom.alertState(t, "PostgresBackupTooOld"); state != "" {
			t.Fatalf("PostgresBackupTooOld is %s %s after a successful backup (threshold %d s)", state, time.Since(backedUp).Round(time.Second), maxAge)
		}
		if state, _ := prom.alertState(t, "ChartpilotDown"); state != "" {
			t.Fatalf("ChartpilotDown is %s while the operator runs", state)
		}
		time.Sleep(5 * time.Second)
	}
	waitAlert(t, prom, "PostgresBackupTooOld", map[string]string{"namespace": tenant, "name": "db"}, 3*time.Minute)
	t.Logf("PostgresBackupTooOld fired %s after the backup", time.Since(backedUp).Round(time.Second))

	// ChartpilotDown: the operator scaled to zero.
	scale, err := cs.AppsV1().Deployments(ops).GetScale(ctx, "chartpilot", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	scale.Spec.Replicas = 0
	if _, err := cs.AppsV1().Deployments(ops).UpdateScale(ctx, "chartpilot", scale, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	stopped := time.Now()
	waitAlert(t, prom, "ChartpilotDown", nil, 3*time.Minute)
	t.Logf("ChartpilotDown fired %s after the operator was scaled to zero", time.Since(stopped).Round(time.Second))
}

// prometheusOf starts Prometheus with the ServiceMonitors of namespaces
// ops (the operator's) and tenant (the Postgres's) as scrape jobs, the
// operator's shipped rules and the Postgres's PrometheusRule, each for:
// shortened to 20 s. It runs as ServiceAccount prometheus of tenant,
// allowed to discover and to read the operator's /metrics.
func prometheusOf(t *testing.T, ops, tenant string) *promServer {
	t.Helper()
	ctx := context.Background()
	_, dyn := clients(t)
	access := prometheusAccess(t, tenant)
	var sms []unstructured.Unstructured
	for _, ns := range []string{ops, tenant} {
		l, err := dyn.Resource(serviceMonitorGVR).Namespace(ns).List(ctx, metav1.ListOptions{})
		if err != nil {
			t.Fatal(err)
		}
		sms = append(sms, l.Items...)
	}
	if len(sms) != 2 {
		t.Fatalf("%d ServiceMonitors in %s and %s, want the operator's and the Postgres's", len(sms), ops, tenant)
	}
	rules := map[string][]byte{}
	operatorRules, err := os.ReadFile(filepath.Join("..", "..", "config", "prometheus", "prometheusrule.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var pr map[string]any
	if err := yaml.Unmarshal(operatorRules, &pr); err != nil {
		t.Fatal(err)
	}
	rules["chartpilot.rules.yaml"] = ruleFile(t, pr, "20s")
	prs, err := dyn.Resource(prometheusRuleGVR).Namespace(tenant).List(ctx, metav1.ListOptions{})
	if err != nil || len(prs.Items) != 1 {
		t.Fatalf("the Postgres's PrometheusRule: %v (%d)", err, len(prs.Items))
	}
	rules["postgres.rules.yaml"] = ruleFile(t, prs.Items[0].Object, "20s")
	config, err := yaml.Marshal(map[string]any{
		"global":         map[string]any{"scrape_interval": "5s", "evaluation_interval": "5s"},
		"rule_files":     []any{"chartpilot.rules.yaml", "postgres.rules.yaml"},
		"scrape_configs": scrapeConfigs(t, sms, access),
	})
	if err != nil {
		t.Fatal(err)
	}
	return startPrometheus(t, config, rules)
}

// waitBackupCompleted waits for Backup ns/name to complete; it fails the
// test when the Backup fails.
func waitBackupCompleted(t *testing.T, ns, name string) {
	t.Helper()
	_, dyn := clients(t)
	var phase, message, job string
	err := wait.PollUntilContextTimeout(context.Background(), 2*time.Second, 5*time.Minute, true, func(ctx context.Context) (bool, error) {
		b, err := dyn.Resource(backupGVR).Namespace(ns).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, nil
		}
		job, _, _ = unstructured.NestedString(b.Object, "status", "job")
		phase, _, _ = unstructured.NestedString(b.Object, "status", "phase")
		message, _, _ = unstructured.NestedString(b.Object, "status", "message")
		return phase == "Completed" || phase == "Failed", nil
	})
	if err != nil || phase != "Completed" {
		logJobPods(t, ns, "job-name="+job)
		t.Fatalf("Backup %s: phase %q: %s", name, phase, message)
	}
}

// logJobPods logs what the containers of the pods selected in ns wrote.
func logJobPods(t *testing.T, ns, selector string) {
	t.Helper()
	cs, _ := clients(t)
	pods, err := cs.CoreV1().Pods(ns).List(context.Background(), metav1.ListOptions{LabelSelector: selector})
	if err != nil {
		t.Logf("pods %s: %v", selector, err)
		return
	}
	for _, p := range pods.Items {
		for container, log := range cluster.PodLogs(ns, p.Name) {
			t.Logf("pod %s, container %s:\n%s", p.Name, container, log)
		}
	}
}

// waitAlert waits until alert name fires with labels among its own.
func waitAlert(t *testing.T, prom *promServer, name string, labels map[string]string, timeout time.Duration) {
	t.Helper()
	var state string
	var got []map[string]string
	err := wait.PollUntilContextTimeout(context.Background(), 2*time.Second, timeout, true, func(context.Context) (bool, error) {
		state, got = prom.alertState(t, name)
		if state != "firing" {
			return false, nil
		}
		for _, l := range got {
			match := true
			for k, v := range labels {
				match = match && l[k] == v
			}
			if match {
				return true, nil
			}
		}
		return false, nil
	})
	if err != nil {
		t.Fatalf("%s did not fire with %v within %s: state %q, %v", name, labels, timeout, state, got)
	}
}

// prometheusAccess makes ServiceAccount prometheus in ns, bound to a
// ClusterRole that discovers targets and to the chart's metrics reader,
// and writes its token and the API server's CA for the test Prometheus.
func prometheusAccess(t *testing.T, ns string) promAccess {
	t.Helper()
	ctx := context.Background()
	cs, _ := clients(t)
	sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "prometheus"}}
	if _, err := cs.CoreV1().ServiceAccounts(ns).Create(ctx, sa, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	role := &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: "test-prometheus-" + ns}, Rules: []rbacv1.PolicyRule{
		{APIGroups: []string{""}, Resources: []string{"services", "endpoints", "pods"}, Verbs: []string{"get", "list", "watch"}},
		{APIGroups: []string{"discovery.k8s.io"}, Resources: []string{"endpointslices"}, Verbs: []string{"get", "list", "watch"}},
	}}
	if _, err := cs.RbacV1().ClusterRoles().Create(ctx, role, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	subject := []rbacv1.Subject{{Kind: "ServiceAccount", Namespace: ns, Name: "prometheus"}}
	for _, r := range []string{role.Name, "chartpilot-metrics-reader"} {
		b := &rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "test-prometheus-" + ns + "-" + r}, Subjects: subject,
			RoleRef: rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "ClusterRole", Name: r}}
		if _, err := cs.RbacV1().ClusterRoleBindings().Create(ctx, b, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = cs.RbacV1().ClusterRoleBindings().Delete(ctx, b.Name, metav1.DeleteOptions{}) })
	}
	t.Cleanup(func() { _ = cs.RbacV1().ClusterRoles().Delete(ctx, role.Name, metav1.DeleteOptions{}) })
	hour := int64(3600)
	tok, err := cs.CoreV1().ServiceAccounts(ns).CreateToken(ctx, "prometheus", &authv1.TokenRequest{Spec: authv1.TokenRequestSpec{ExpirationSeconds: &hour}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	access := promAccess{apiServer: cluster.Config.Host, caFile: filepath.Join(dir, "ca.crt"), tokenFile: filepath.Join(dir, "token")}
	if err := os.WriteFile(access.caFile, cluster.Config.CAData, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(access.tokenFile, []byte(tok.Status.Token), 0o600); err != nil {
		t.Fatal(err)
	}
	return access
}
