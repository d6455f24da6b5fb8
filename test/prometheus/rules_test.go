// Package prometheus tests the alert rules of config/prometheus with
// promtool (bin/promtool, built by make tools from the Prometheus module).
package prometheus

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"

	"github.com/chartpilot/chartpilot/internal/testing/testcluster"
)

type ruleFile struct {
	Spec struct {
		Groups []struct {
			Name  string `json:"name"`
			Rules []struct {
				Alert string `json:"alert"`
				Expr  string `json:"expr"`
			} `json:"rules"`
		} `json:"groups"`
	} `json:"spec"`
}

// TestOperatorRules: the PrometheusRule's groups pass `promtool check
// rules` and the unit tests of rules_test.yaml (`promtool test rules`);
// every alert has a test where it fires and one where it does not; every
// chartpilot_* metric a rule reads is one the operator defines.
func TestOperatorRules(t *testing.T) {
	root, promtool := tools(t)
	raw, err := os.ReadFile(filepath.Join(root, "config", "prometheus", "prometheusrule.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var rf ruleFile
	if err := yaml.Unmarshal(raw, &rf); err != nil {
		t.Fatal(err)
	}
	var full map[string]any
	if err := yaml.Unmarshal(raw, &full); err != nil {
		t.Fatal(err)
	}
	groups, err := yaml.Marshal(map[string]any{"groups": full["spec"].(map[string]any)["groups"]})
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(os.WriteFile(filepath.Join(dir, "rules.yaml"), groups, 0o644))
	tests, err := os.ReadFile("rules_test.yaml")
	must(err)
	must(os.WriteFile(filepath.Join(dir, "rules_test.yaml"), tests, 0o644))
	for _, args := range [][]string{{"check", "rules", "rules.yaml"}, {"test", "rules", "rules_test.yaml"}} {
		cmd := exec.Command(promtool, args...)
		cmd.Dir = dir
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Errorf("promtool %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}

	// Each alert fires in one test and stays quiet in another.
	fires, quiet := alertTests(t, tests)
	defined := definedMetrics(t, root)
	metricName := regexp.MustCompile(`chartpilot_[a-z_]+`)
	for _, g := range rf.Spec.Groups {
		for _, r := range g.Rules {
			if !fires[r.Alert] || !quiet[r.Alert] {
				t.Errorf("alert %s: a test where it fires: %v, one where it does not: %v", r.Alert, fires[r.Alert], quiet[r.Alert])
			}
			for _, m := range metricName.FindAllString(r.Expr, -1) {
				base := strings.TrimSuffix(strings.TrimSuffix(strings.TrimSuffix(m, "_count"), "_sum"), "_bucket")
				if !slices.Contains(defined, base) && !slices.Contains(defined, m) {
					t.Errorf("alert %s reads %s, which the operator does not define", r.Alert, m)
				}
			}
		}
	}
}

// otherMetric matches the names of metrics of postgres_exporter, the
// kubelet and Prometheus in a query.
var otherMetric = regexp.MustCompile(`\b(pg_[a-z_]+|kubelet_[a-z_]+|up)\b`)

// exporterMetrics are the metric names of exporter_metrics.txt.
func exporterMetrics(t *testing.T) []string {
	t.Helper()
	raw, err := os.ReadFile("exporter_metrics.txt")
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, line := range strings.Split(string(raw), "\n") {
		if f := strings.Fields(line); len(f) > 0 && !strings.HasPrefix(f[0], "#") {
			out = append(out, f[0])
		}
	}
	return out
}

// alertTests reads a promtool test file: the alerts that fire in one of
// its tests, and those expected quiet in one.
func alertTests(t *testing.T, tests []byte) (fires, quiet map[string]bool) {
	t.Helper()
	var ut struct {
		Tests []struct {
			AlertRuleTest []struct {
				Alertname string           `json:"alertname"`
				ExpAlerts []map[string]any `json:"exp_alerts"`
			} `json:"alert_rule_test"`
		} `json:"tests"`
	}
	if err := yaml.Unmarshal(tests, &ut); err != nil {
		t.Fatal(err)
	}
	fires, quiet = map[string]bool{}, map[string]bool{}
	for _, tc := range ut.Tests {
		for _, a := range tc.AlertRuleTest {
			if len(a.ExpAlerts) > 0 {
				fires[a.Alertname] = true
			} else {
				quiet[a.Alertname] = true
			}
		}
	}
	return fires, quiet
}

// tools returns the module root and bin/promtool (built by make tools).
func tools(t *testing.T) (string, string) {
	t.Helper()
	root, err := testcluster.ModuleRoot()
	if err != nil {
		t.Fatal(err)
	}
	promtool := filepath.Join(root, "bin", "promtool")
	if _, err := os.Stat(promtool); err != nil {
		t.Fatalf("%s: run make tools (it builds promtool)", promtool)
	}
	return root, promtool
}

// definedMetrics are the chartpilot_* metric names declared in the
// operator's Go source.
func definedMetrics(t *testing.T, root string) []string {
	t.Helper()
	re := regexp.MustCompile(`Name:\s*"(chartpilot_[a-z_]+)"`)
	var out []string
	var err error
	for _, dir := range []string{"internal", "hooks"} {
		if err != nil {
			break
		}
		err = filepath.WalkDir(filepath.Join(root, dir), func(path string, d os.DirEntry, err error) error {
			if err != nil || d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
				return err
			}
			b, err := os.ReadFile(path)
			if err != nil {
				return err
			}
			for _, m := range re.FindAllStringSubmatch(string(b), -1) {
				out = append(out, m[1])
			}
			return nil
		})
	}
	if err != nil {
		t.Fatal(err)
	}
	if len(out) < 10 {
		t.Fatalf("found only %d metric definitions: the search is broken", len(out))
	}
	return out
}

// TestDashboards: every query of the Grafana dashboards in config/grafana
// parses (promtool checks each as a recording rule, with the dashboard's
// $kind variable as Grafana's "All" would set it) and reads only metrics
// the operator defines; kustomize makes the ConfigMap Grafana's sidecar
// loads.
func TestDashboards(t *testing.T) {
	root, promtool := tools(t)
	files, err := filepath.Glob(filepath.Join(root, "config", "grafana", "*.json"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no dashboards in config/grafana: %v", err)
	}
	defined := definedMetrics(t, root)
	exporter := exporterMetrics(t)
	metricName := regexp.MustCompile(`chartpilot_[a-z_]+`)
	type rule struct {
		Record string `json:"record"`
		Expr   string `json:"expr"`
	}
	var rules []rule
	for _, f := range files {
		raw, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		var d struct {
			Panels []struct {
				ID      int    `json:"id"`
				Title   string `json:"title"`
				Targets []struct {
					RefID string `json:"refId"`
					Expr  string `json:"expr"`
				} `json:"targets"`
			} `json:"panels"`
		}
		if err := yaml.Unmarshal(raw, &d); err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		for _, p := range d.Panels {
			if len(p.Targets) == 0 {
				t.Errorf("%s: panel %q has no query", filepath.Base(f), p.Title)
			}
			for _, q := range p.Targets {
				// The variables as Grafana sets them ("All" for kind).
				expr := strings.NewReplacer("$kind", ".*", "$namespace", "shop", "$name", "db").Replace(q.Expr)
				rules = append(rules, rule{Record: fmt.Sprintf("dashboard:%s_panel_%d_%s", strings.TrimSuffix(filepath.Base(f), ".json"), p.ID, strings.ToLower(q.RefID)), Expr: expr})
				names := metricName.FindAllString(expr, -1)
				for _, m := range names {
					base := strings.TrimSuffix(strings.TrimSuffix(strings.TrimSuffix(m, "_count"), "_sum"), "_bucket")
					if !slices.Contains(defined, base) && !slices.Contains(defined, m) {
						t.Errorf("panel %q reads %s, which the operator does not define", p.Title, m)
					}
				}
				others := otherMetric.FindAllString(expr, -1)
				for _, m := range others {
					if !slices.Contains(exporter, m) {
						t.Errorf("panel %q reads %s, which neither the operator nor the programs of exporter_metrics.txt define", p.Title, m)
					}
				}
				if len(names)+len(others) == 0 {
					t.Errorf("panel %q: query %q reads no metric", p.Title, q.Expr)
				}
			}
		}
	}
	body, err := yaml.Marshal(map[string]any{"groups": []any{map[string]any{"name": "dashboards", "rules": rules}}})
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "dashboards.yaml")
	if err := os.WriteFile(path, body, 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command(promtool, "check", "rules", path).CombinedOutput(); err != nil {
		t.Errorf("the dashboards' queries do not parse: %v\n%s", err, out)
	}
	out, err := exec.Command(filepath.Join(root, "bin", "kubectl"), "kustomize", filepath.Join(root, "config", "grafana")).CombinedOutput()
	if err != nil || !strings.Contains(string(out), `grafana_dashboard: "1"`) || !strings.Contains(string(out), "chartpilot-fleet.json") || !strings.Contains(string(out), "chartpilot-postgres.json") {
		t.Errorf("kubectl kustomize config/grafana: %v\n%s", err, out)
	}
}
