package helm

import (
	"path/filepath"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

// chartsDir is the repository's charts/ directory.
var chartsDir = filepath.Join("..", "..", "charts")

func renderKinds(t *testing.T, chart string, vals map[string]any) map[string]*unstructured.Unstructured {
	t.Helper()
	ch, err := LoadChart(filepath.Join(chartsDir, chart))
	if err != nil {
		t.Fatal(err)
	}
	manifest, err := Template(ch, "db", "ns1", vals, "v1.37.2")
	if err != nil {
		t.Fatalf("helm template %s: %v", chart, err)
	}
	objs, err := ParseManifest(manifest)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]*unstructured.Unstructured{}
	for _, o := range objs {
		out[o.GetKind()+"/"+o.GetName()] = o
	}
	return out
}

func TestChartsLintClean(t *testing.T) {
	for _, tc := range []struct {
		chart string
		vals  map[string]any
	}{
		{"postgresql", nil},
		{"postgresql", map[string]any{"replicas": 3, "metrics": map[string]any{"enabled": true}, "networkPolicy": map[string]any{"enabled": true}, "parameters": map[string]any{"work_mem": "8MB"}}},
		{"postgresql", map[string]any{"replicas": 3, "failover": map[string]any{"enabled": true, "synchronous": 1, "maxLagBytes": 16777216}}},
		{"redis", nil},
		{"redis", map[string]any{"persistence": map[string]any{"enabled": true}}},
		{"chartpilot", nil},
		{"chartpilot", map[string]any{
			"webhook": map[string]any{"certs": "cert-manager"}, "metrics": map[string]any{"serviceMonitor": map[string]any{"enabled": true}},
			"watches":               []any{map[string]any{"group": "example.com", "version": "v1", "kind": "App", "chart": map[string]any{"repo": "oci://registry.example.com/charts", "name": "app"}}},
			"rbac":                  map[string]any{"impersonate": []any{"deployer"}, "extraRules": []any{map[string]any{"apiGroups": []any{"apps"}, "resources": []any{"daemonsets"}, "verbs": []any{"get"}}}},
			"extraArgs":             []any{"--kube-api-qps=50"},
			"defaultServiceAccount": "deployer",
		}},
	} {
		if msgs := Lint(filepath.Join(chartsDir, tc.chart), tc.vals); len(msgs) > 0 {
			t.Errorf("helm lint %s %v:\n%s", tc.chart, tc.vals, strings.Join(msgs, "\n"))
		}
	}
}

func TestPostgresChartRenders(t *testing.T) {
	objs := renderKinds(t, "postgresql", map[string]any{"replicas": 3, "metrics": map[string]any{"enabled": true}})
	for _, want := range []string{"StatefulSet/db", "Service/db", "Service/db-ro", "Service/db-headless", "Secret/db-auth", "ConfigMap/db-config", "PodDisruptionBudget/db", "Pod/db-test"} {
		if objs[want] == nil {
			t.Errorf("%s not rendered", want)
		}
	}
	sts := objs["StatefulSet/db"]
	if r, _, _ := unstructured.NestedFieldNoCopy(sts.Object, "spec", "replicas"); r != 3.0 && r != int64(3) {
		t.Errorf("replicas = %v", r)
	}
	if p, _, _ := unstructured.NestedString(sts.Object, "spec", "persistentVolumeClaimRetentionPolicy", "whenDeleted"); p != "Retain" {
		t.Errorf("PVCs are not retained on delete: %q", p)
	}
	if objs["Secret/db-auth"].GetAnnotations()["helm.sh/resource-policy"] != "keep" {
		t.Errorf("password Secret is not kept on uninstall")
	}
	containers, _, _ := unstructured.NestedSlice(sts.Object, "spec", "template", "spec", "containers")
	if len(containers) != 2 {
		t.Errorf("want postgresql and metrics containers, got %d", len(containers))
	}
	// Schema: bad values are refused with a message naming the field.
	ch, _ := LoadChart(filepath.Join(chartsDir, "postgresql"))
	_, err := Template(ch, "db", "ns1", map[string]any{"replicas": 12}, "v1.37.2")
	if err == nil || !strings.Contains(err.Error(), "replicas") {
		t.Errorf("replicas 12: want a schema error naming replicas, got %v", err)
	}
	_, err = Template(ch, "db", "ns1", map[string]any{"storage": map[string]any{"size": "lots"}}, "v1.37.2")
	if err == nil || !strings.Contains(err.Error(), "size") {
		t.Errorf("storage.size lots: want a schema error naming size, got %v", err)
	}
	// Deleting data is an explicit opt-in.
	objs = renderKinds(t, "postgresql", map[string]any{"persistence": map[string]any{"deleteOnUninstall": true}})
	if p, _, _ := unstructured.NestedString(objs["StatefulSet/db"].Object, "spec", "persistentVolumeClaimRetentionPolicy", "whenDeleted"); p != "Delete" {
		t.Errorf("deleteOnUninstall: whenDeleted = %q", p)
	}
}

func TestPostgresConfigChangeRollsPods(t *testing.T) {
	checksum := func(vals map[string]any) string {
		objs := renderKinds(t, "postgresql", vals)
		s, _, _ := unstructured.NestedString(objs["StatefulSet/db"].Object, "spec", "template", "metadata", "annotations", "checksum/config")
		return s
	}
	a := checksum(map[string]any{"parameters": map[string]any{"work_mem": "4MB"}})
	b := checksum(map[string]any{"parameters": map[string]any{"work_mem": "8MB"}})
	if a == "" || a == b {
		t.Errorf("config checksum does not follow parameters: %q %q", a, b)
	}
}

// TestOperatorChartRenders: charts/chartpilot renders the operator the way
// config/ does: its own role from `chartpilot rbac`, leader election, the
// webhook pointed at its Service, restricted security, the image's
// watches.yaml unless watches are given.
func TestOperatorChartRenders(t *testing.T) {
	ch, err := LoadChart(filepath.Join(chartsDir, "chartpilot"))
	if err != nil {
		t.Fatal(err)
	}
	manifest, err := Template(ch, "chartpilot", "ops", nil, "v1.37.2")
	if err != nil {
		t.Fatal(err)
	}
	objs, err := ParseManifest(manifest)
	if err != nil {
		t.Fatal(err)
	}
	kinds := map[string]*unstructured.Unstructured{}
	for _, o := range objs {
		kinds[o.GetKind()+"/"+o.GetName()] = o
	}
	for _, k := range []string{"ServiceAccount/chartpilot", "ClusterRole/chartpilot-manager", "ClusterRoleBinding/chartpilot-manager", "Role/chartpilot-leader-election",
		"Deployment/chartpilot", "Service/chartpilot-webhook", "Service/chartpilot-metrics", "ValidatingWebhookConfiguration/chartpilot-validating", "PodDisruptionBudget/chartpilot"} {
		if kinds[k] == nil {
			t.Errorf("%s not rendered", k)
		}
	}
	rules, _, _ := unstructured.NestedSlice(kinds["ClusterRole/chartpilot-manager"].Object, "rules")
	if len(rules) < 10 {
		t.Errorf("the manager's ClusterRole has %d rules", len(rules))
	}
	dep := kinds["Deployment/chartpilot"]
	containers, _, _ := unstructured.NestedSlice(dep.Object, "spec", "template", "spec", "containers")
	c := containers[0].(map[string]any)
	args, _, _ := unstructured.NestedStringSlice(c, "args")
	joined := strings.Join(args, " ")
	for _, want := range []string{"--leader-elect", "--watches=/etc/chartpilot/watches.yaml", "--webhook-service=ops/chartpilot-webhook", "--webhook-configuration=chartpilot-validating", "--leader-election-namespace=ops"} {
		if !strings.Contains(joined, want) {
			t.Errorf("manager args %q lack %s", joined, want)
		}
	}
	if ro, _, _ := unstructured.NestedBool(c, "securityContext", "readOnlyRootFilesystem"); !ro {
		t.Errorf("the manager's root filesystem is writable")
	}
	if img, _, _ := unstructured.NestedString(c, "image"); img != "ghcr.io/chartpilot/chartpilot:"+ch.chart.Metadata.AppVersion {
		t.Errorf("image %q", img)
	}
	hooks, _, _ := unstructured.NestedSlice(kinds["ValidatingWebhookConfiguration/chartpilot-validating"].Object, "webhooks")
	if svc, _, _ := unstructured.NestedString(hooks[0].(map[string]any), "clientConfig", "service", "name"); svc != "chartpilot-webhook" {
		t.Errorf("the webhook calls Service %q", svc)
	}
}
