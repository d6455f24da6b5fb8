package prometheus

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"

	"github.com/chartpilot/chartpilot/internal/helm"
)

// chartRules renders charts/postgresql as release db in namespace shop
// with the PrometheusRule on and returns its rule groups as a rule file.
func chartRules(t *testing.T, root string) []byte {
	t.Helper()
	ch, err := helm.LoadChart(filepath.Join(root, "charts", "postgresql"))
	if err != nil {
		t.Fatal(err)
	}
	manifest, err := helm.Template(ch, "db", "shop", map[string]any{"metrics": map[string]any{
		"enabled": true, "serviceMonitor": map[string]any{"enabled": true}, "prometheusRule": map[string]any{"enabled": true}},
		"walArchive": map[string]any{"enabled": true, "storeArgs": []any{"--store=s3", "--s3-bucket=backups"}}}, "")
	if err != nil {
		t.Fatal(err)
	}
	objs, err := helm.ParseManifest(manifest)
	if err != nil {
		t.Fatal(err)
	}
	var kinds []string
	var groups []byte
	for _, o := range objs {
		kinds = append(kinds, o.GetKind())
		if o.GetKind() != "PrometheusRule" {
			continue
		}
		groups, err = yaml.Marshal(map[string]any{"groups": o.Object["spec"].(map[string]any)["groups"]})
		if err != nil {
			t.Fatal(err)
		}
	}
	if groups == nil || !slices.Contains(kinds, "ServiceMonitor") {
		t.Fatalf("the chart with metrics.serviceMonitor and metrics.prometheusRule on rendered %v: no ServiceMonitor or PrometheusRule", kinds)
	}
	return groups
}

// TestPostgresChartRules: the alerts the Postgres chart ships (its
// PrometheusRule, rendered) pass `promtool check rules` and the unit
// tests of postgres_rules_test.yaml, each firing in one test and quiet in
// another; every chartpilot_* metric they read is one the operator
// defines, and every other one is in exporter_metrics.txt.
func TestPostgresChartRules(t *testing.T) {
	root, promtool := tools(t)
	groups := chartRules(t, root)
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "rules.yaml"), groups, 0o644); err != nil {
		t.Fatal(err)
	}
	tests, err := os.ReadFile("postgres_rules_test.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "rules_test.yaml"), tests, 0o644); err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{{"check", "rules", "rules.yaml"}, {"test", "rules", "rules_test.yaml"}} {
		cmd := exec.Command(promtool, args...)
		cmd.Dir = dir
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Errorf("promtool %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
	var rf struct {
		Groups []struct {
			Rules []struct {
				Alert string `json:"alert"`
				Expr  string `json:"expr"`
			} `json:"rules"`
		} `json:"groups"`
	}
	if err := yaml.Unmarshal(groups, &rf); err != nil {
		t.Fatal(err)
	}
	fires, quiet := alertTests(t, tests)
	defined := definedMetrics(t, root)
	exporter := exporterMetrics(t)
	metricName := regexp.MustCompile(`chartpilot_[a-z_]+`)
	n := 0
	for _, g := range rf.Groups {
		for _, r := range g.Rules {
			n++
			if !fires[r.Alert] || !quiet[r.Alert] {
				t.Errorf("alert %s: a test where it fires: %v, one where it does not: %v", r.Alert, fires[r.Alert], quiet[r.Alert])
			}
			for _, m := range metricName.FindAllString(r.Expr, -1) {
				if !slices.Contains(defined, m) {
					t.Errorf("alert %s reads %s, which the operator does not define", r.Alert, m)
				}
			}
			for _, m := range otherMetric.FindAllString(r.Expr, -1) {
				if !slices.Contains(exporter, m) {
					t.Errorf("alert %s reads %s, which neither the operator nor the programs of exporter_metrics.txt define", r.Alert, m)
				}
			}
		}
	}
	if n < 10 {
		t.Errorf("%d alerts rendered, want the 10 of the chart", n)
	}
}
