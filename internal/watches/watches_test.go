package watches

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func env(vars map[string]string) func(string) (string, bool) {
	return func(k string) (string, bool) { v, ok := vars[k]; return v, ok }
}

func TestParseValid(t *testing.T) {
	data := []byte(`
- group: chartpilot.dev
  version: v1alpha1
  kind: Redis
  chart: testdata/chart
  overrideValues:
    image:
      tag: $TAG
      repo: "${REPO}/redis"
      pullSecret:
        valueFrom:
          secretKeyRef: {namespace: ops, name: registry, key: token}
    price: "$$5"
    list: ["$TAG", 3]
  hooks: [tenancy, monitoring]
  reconcilePeriod: 2h
  maxConcurrentReconciles: 8
  watchDependentResources: false
  maxHistory: 3
  timeout: 90s
  healthTimeout: 2m
  maxConcurrentUpgrades: 7
  selector:
    matchLabels:
      shard: a
- group: example.com
  version: v1
  kind: Cache
  chart: testdata/chart
`)
	ws, err := Parse(data, ".", env(map[string]string{"TAG": "7.2", "REPO": "mirror.local"}))
	if err != nil {
		t.Fatal(err)
	}
	if len(ws) != 2 {
		t.Fatalf("want 2 watches, got %d", len(ws))
	}
	w := ws[0]
	if w.GVK.Kind != "Redis" || w.GVK.Group != "chartpilot.dev" || w.GVK.Version != "v1alpha1" {
		t.Errorf("GVK = %v", w.GVK)
	}
	img := w.OverrideValues["image"].(map[string]any)
	if img["tag"] != "7.2" || img["repo"] != "mirror.local/redis" {
		t.Errorf("env not expanded: %v", img)
	}
	if w.OverrideValues["price"] != "$5" {
		t.Errorf("$$ not a literal dollar: %v", w.OverrideValues["price"])
	}
	if _, ok := img["pullSecret"]; ok || len(w.SecretValues) != 1 {
		t.Errorf("secret value not taken out of the override values: %v, %v", img, w.SecretValues)
	} else if sv := w.SecretValues[0]; sv.Field() != "overrideValues.image.pullSecret" || sv.Namespace != "ops" || sv.Name != "registry" || sv.Key != "token" {
		t.Errorf("secret value %+v (%s)", sv, sv.Field())
	}
	if l := w.OverrideValues["list"].([]any); l[0] != "7.2" {
		t.Errorf("list not expanded: %v", l)
	}
	if w.ReconcilePeriod != 2*time.Hour || w.MaxConcurrentReconciles != 8 || w.WatchDependentResources || w.MaxHistory != 3 || w.Timeout != 90*time.Second {
		t.Errorf("settings not parsed: %+v", w)
	}
	if w.HealthTimeout != 2*time.Minute || w.MaxConcurrentUpgrades != 7 {
		t.Errorf("health settings not parsed: %s %d", w.HealthTimeout, w.MaxConcurrentUpgrades)
	}
	if w.Selector == nil || w.Selector.String() != "shard=a" {
		t.Errorf("selector = %v", w.Selector)
	}
	if !filepath.IsAbs(w.Chart) {
		t.Errorf("chart path not absolute: %s", w.Chart)
	}
	d := ws[1]
	if d.ReconcilePeriod != DefaultReconcilePeriod || d.MaxConcurrentReconciles != DefaultMaxConcurrentReconciles ||
		!d.WatchDependentResources || d.MaxHistory != DefaultMaxHistory || d.Selector != nil || d.Timeout != DefaultTimeout ||
		d.HealthTimeout != DefaultHealthTimeout || d.MaxConcurrentUpgrades != DefaultMaxConcurrentUpgrades {
		t.Errorf("defaults not applied: %+v", d)
	}
}

func TestParseErrorsNameEntryAndField(t *testing.T) {
	base := "- group: chartpilot.dev\n  version: v1\n  kind: Redis\n  chart: testdata/chart\n"
	for name, tc := range map[string]struct {
		yaml string
		want []string
	}{
		"unknown field":           {base + "  chrat: x\n", []string{"chrat", "fix the YAML"}},
		"not a list":              {"group: a.b\n", []string{"not a list"}},
		"duplicate gvk":           {base + base, []string{"entry 1", "duplicate of entry 0"}},
		"same kind, two versions": {base + strings.Replace(base, "version: v1", "version: v2", 1), []string{"entry 1", "duplicate of entry 0", "one version"}},
		"plain HTTP off loopback": {"- group: chartpilot.dev\n  version: v1\n  kind: Redis\n  chart: {repo: \"oci://registry.example.com/c\", name: redis, plainHTTP: true}\n", []string{"field chart.plainHTTP", "registry.example.com is not a loopback host", "allowInsecure"}},
		"bad service account":     {base + "  serviceAccountName: Not_A_Name\n", []string{"field serviceAccountName"}},
		"bad cluster kind":        {base + "  allowClusterScoped: [\"cluster role\"]\n", []string{"field allowClusterScoped[0]"}},
		"missing chart":           {"- group: chartpilot.dev\n  version: v1\n  kind: Redis\n  chart: nope\n", []string{"entry 0 (chartpilot.dev/v1 Redis)", "field chart", "nope does not exist"}},
		"chart without yaml":      {"- group: chartpilot.dev\n  version: v1\n  kind: Redis\n  chart: testdata\n", []string{"field chart", "no Chart.yaml"}},
		"no chart":                {"- group: chartpilot.dev\n  version: v1\n  kind: Redis\n", []string{"field chart: required"}},
		"bad selector":            {base + "  selector:\n    matchExpressions:\n    - {key: a, operator: Near, values: [b]}\n", []string{"field selector", "Near"}},
		"bad kind":                {"- group: chartpilot.dev\n  version: v1\n  kind: redis\n  chart: testdata/chart\n", []string{"field kind"}},
		"bad version":             {"- group: chartpilot.dev\n  version: one\n  kind: Redis\n  chart: testdata/chart\n", []string{"field version"}},
		"no group":                {"- version: v1\n  kind: Redis\n  chart: testdata/chart\n", []string{"field group: required"}},
		"unset env":               {base + "  overrideValues:\n    a:\n      b: $NOPE\n", []string{"field overrideValues.a.b", "NOPE is not set"}},
		"secret ref no namespace": {base + "  overrideValues:\n    a:\n      valueFrom: {secretKeyRef: {name: s, key: k}}\n", []string{"field overrideValues.a.valueFrom.secretKeyRef.namespace"}},
		"secret ref bad key":      {base + "  overrideValues:\n    a:\n      valueFrom: {secretKeyRef: {namespace: ns, name: s, key: \"a b\"}}\n", []string{"field overrideValues.a.valueFrom.secretKeyRef.key"}},
		"secret ref extra field":  {base + "  overrideValues:\n    a:\n      valueFrom: {secretKeyRef: {namespace: ns, name: s, key: k, optional: true}}\n", []string{"field overrideValues.a.valueFrom.secretKeyRef.optional"}},
		"secret ref sibling":      {base + "  overrideValues:\n    a:\n      b: 1\n      valueFrom: {secretKeyRef: {namespace: ns, name: s, key: k}}\n", []string{"field overrideValues.a", "only key"}},
		"secret ref in list":      {base + "  overrideValues:\n    a: [{valueFrom: {secretKeyRef: {namespace: ns, name: s, key: k}}}]\n", []string{"field overrideValues.a", "inside a list"}},
		"secret ref configmap":    {base + "  overrideValues:\n    a:\n      valueFrom: {configMapKeyRef: {namespace: ns, name: s, key: k}}\n", []string{"field overrideValues.a.valueFrom", "secretKeyRef"}},
		"bad period":              {base + "  reconcilePeriod: 5s\n", []string{"field reconcilePeriod"}},
		"bad concurrency":         {base + "  maxConcurrentReconciles: 0\n", []string{"field maxConcurrentReconciles"}},
		"bad history":             {base + "  maxHistory: 1\n", []string{"field maxHistory"}},
		"bad hook":                {base + "  hooks: [Tenancy]\n", []string{"field hooks[0]"}},
		"duplicate hook":          {base + "  hooks: [a, a]\n", []string{"field hooks[1]", "twice"}},
		"monitoring without hook": {base + "  monitoring: {values: {metrics: {enabled: true}}}\n", []string{"field monitoring", "add monitoring to hooks"}},
		"monitoring no values":    {base + "  hooks: [monitoring]\n  monitoring: {prometheusOperatorValues: {a: 1}}\n", []string{"field monitoring.values"}},
		"bad timeout":             {base + "  timeout: soon\n", []string{"field timeout"}},
		"short anomaly window":    {base + "  anomalies: {window: 5s}\n", []string{"field anomalies.window", "at least 30s"}},
		"few anomaly windows":     {base + "  anomalies: {window: 10m, history: 20m}\n", []string{"field anomalies.history", "2 windows", "5 to 1000"}},
		"wrong type":              {base + "  maxHistory: many\n", []string{"fix the YAML"}},
		"url as path":             {"- group: chartpilot.dev\n  version: v1\n  kind: Redis\n  chart: https://charts.example.com/redis\n", []string{"field chart", "is a URL", "{repo:"}},
		"remote no repo":          {"- group: chartpilot.dev\n  version: v1\n  kind: Redis\n  chart: {name: redis}\n", []string{"field chart.repo: required"}},
		"remote bad scheme":       {"- group: chartpilot.dev\n  version: v1\n  kind: Redis\n  chart: {repo: ftp://x.y, name: redis}\n", []string{"field chart.repo", "oci://"}},
		"remote creds in url":     {"- group: chartpilot.dev\n  version: v1\n  kind: Redis\n  chart: {repo: \"https://u:hunter2@x.y\", name: redis}\n", []string{"field chart.repo", "chart.secretRef"}},
		"remote bad name":         {"- group: chartpilot.dev\n  version: v1\n  kind: Redis\n  chart: {repo: \"https://x.y\", name: Redis}\n", []string{"field chart.name"}},
		"remote bad version":      {"- group: chartpilot.dev\n  version: v1\n  kind: Redis\n  chart: {repo: \"https://x.y\", name: redis, version: \"one\"}\n", []string{"field chart.version", "~1.4"}},
		"remote unknown key":      {"- group: chartpilot.dev\n  version: v1\n  kind: Redis\n  chart: {repo: \"https://x.y\", name: redis, tag: \"1\"}\n", []string{"chart", "tag"}},
		"remote half secret":      {"- group: chartpilot.dev\n  version: v1\n  kind: Redis\n  chart: {repo: \"https://x.y\", name: redis, secretRef: {name: creds}}\n", []string{"field chart.secretRef", "namespace"}},
		"remote short interval":   {"- group: chartpilot.dev\n  version: v1\n  kind: Redis\n  chart: {repo: \"https://x.y\", name: redis, interval: 1s}\n", []string{"field chart.interval"}},
		"plainHTTP on https":      {"- group: chartpilot.dev\n  version: v1\n  kind: Redis\n  chart: {repo: \"https://x.y\", name: redis, plainHTTP: true}\n", []string{"field chart.plainHTTP"}},
		"bad soak":                {base + "  canarySoak: long\n", []string{"field canarySoak"}},
		"restore without hook":    {base + restoreBlock("claim: \"data-{name}-0\""), []string{"field backup.restore", "add backup to hooks"}},
		"restore claim no name":   {base + "  hooks: [backup]\n" + restoreBlock("claim: data-0"), []string{"field backup.restore.claim", "{name}"}},
		"restore relative mount":  {base + "  hooks: [backup]\n" + strings.Replace(restoreBlock("claim: \"data-{name}-0\""), "mountPath: /data", "mountPath: data", 1), []string{"field backup.restore.mountPath"}},
		"restore bad size":        {base + "  hooks: [backup]\n" + strings.Replace(restoreBlock("claim: \"data-{name}-0\""), "size: 1Gi", "size: big", 1), []string{"field backup.restore.size"}},
		"bad placement path":      {base + "  backup:\n    image: redis\n    command: [redis-cli]\n    tolerationsValue: placement..tolerations\n", []string{"field backup.tolerationsValue", "values path"}},
		"restore no command":      {base + "  hooks: [backup]\n" + strings.Replace(restoreBlock("claim: \"data-{name}-0\""), "command: [sh]", "command: []", 1), []string{"field backup.restore.command"}},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := Parse([]byte(tc.yaml), ".", env(nil))
			if err == nil {
				t.Fatal("want an error")
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not mention %q", err, w)
				}
			}
			if strings.Contains(err.Error(), "\n") {
				t.Errorf("error spans lines: %q", err)
			}
		})
	}
}

func TestParseRemoteChart(t *testing.T) {
	ws, err := Parse([]byte(`
- group: chartpilot.dev
  version: v1
  kind: Redis
  chart:
    repo: oci://registry.example.com/charts/
    name: redis
    version: ">=1.2, <2"
    plainHTTP: true
    allowInsecure: true
    interval: 1m
    secretRef: {namespace: chartpilot-system, name: registry-creds}
  canarySoak: 30s
- group: chartpilot.dev
  version: v1
  kind: Cache
  chart: {repo: "https://charts.example.com", name: cache}
`), ".", env(nil))
	if err != nil {
		t.Fatal(err)
	}
	r := ws[0].Remote
	if ws[0].Chart != "" || r == nil || r.Repo != "oci://registry.example.com/charts" || r.Name != "redis" || r.Version != ">=1.2, <2" ||
		!r.PlainHTTP || r.Interval != time.Minute || r.SecretRef.Name != "registry-creds" || !r.OCI() || ws[0].CanarySoak != 30*time.Second {
		t.Errorf("remote chart = %+v, soak %s", r, ws[0].CanarySoak)
	}
	if r := ws[1].Remote; r.OCI() || r.Interval != DefaultChartInterval || r.Version != "" || ws[1].CanarySoak != DefaultCanarySoak {
		t.Errorf("defaults = %+v", r)
	}
}

func TestParseEmpty(t *testing.T) {
	for _, in := range []string{"", "[]", "# only a comment\n[]\n"} {
		ws, err := Parse([]byte(in), ".", env(nil))
		if err != nil || len(ws) != 0 {
			t.Errorf("Parse(%q) = %v, %v; want no watches", in, ws, err)
		}
	}
}

func TestLoadResolvesChartAgainstFileDir(t *testing.T) {
	dir := t.TempDir()
	chart := filepath.Join(dir, "charts", "c")
	if err := os.MkdirAll(chart, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(chart, "Chart.yaml"), []byte("apiVersion: v2\nname: c\nversion: 1.0.0\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	f := filepath.Join(dir, "watches.yaml")
	if err := os.WriteFile(f, []byte("- {group: a.io, version: v1, kind: C, chart: charts/c}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	ws, err := Load(f)
	if err != nil {
		t.Fatal(err)
	}
	if ws[0].Chart != chart {
		t.Errorf("chart = %s, want %s", ws[0].Chart, chart)
	}
	if _, err := Load(filepath.Join(dir, "missing.yaml")); err == nil {
		t.Error("want an error for a missing file")
	}
}

// FuzzParse checks that no input makes Parse panic, and that whatever it
// accepts is internally consistent.
func FuzzParse(f *testing.F) {
	f.Add([]byte("- {group: a.io, version: v1, kind: C, chart: testdata/chart}\n"))
	f.Add([]byte("- group: chartpilot.dev\n  version: v1alpha1\n  kind: Redis\n  chart: testdata/chart\n  overrideValues: {a: [$X, {b: ${Y}}]}\n  selector: {matchLabels: {s: a}}\n"))
	f.Add([]byte("[]"))
	f.Add([]byte("- {group: a.io, version: v1, kind: C, chart: testdata/chart, maxHistory: 3, timeout: 1m, reconcilePeriod: 1h}"))
	f.Fuzz(func(t *testing.T, data []byte) {
		ws, err := Parse(data, ".", env(map[string]string{"X": "x", "Y": "y"}))
		if err != nil {
			if strings.Contains(err.Error(), "\n") {
				t.Fatalf("multi-line error: %q", err)
			}
			return
		}
		seen := map[string]bool{}
		for _, w := range ws {
			if w.Chart == "" || w.MaxHistory < 2 || w.MaxConcurrentReconciles < 1 || w.ReconcilePeriod < time.Minute || w.OverrideValues == nil {
				t.Fatalf("accepted an inconsistent watch: %+v", w)
			}
			if seen[w.GVK.String()] {
				t.Fatalf("accepted a duplicate GVK %v", w.GVK)
			}
			seen[w.GVK.String()] = true
		}
	})
}

// restoreBlock is a backup block with a restore whose claim line is claim.
func restoreBlock(claim string) string {
	return "  backup:\n    image: redis\n    command: [redis-cli]\n    restore:\n      command: [sh]\n      " + claim + "\n      mountPath: /data\n      size: 1Gi\n"
}

// anomalies: {} scores with the defaults; its spans can be set.
func TestParseAnomalies(t *testing.T) {
	base := "- group: chartpilot.dev\n  version: v1\n  kind: Redis\n  chart: testdata/chart\n"
	ws, err := Parse([]byte(base), ".", os.LookupEnv)
	if err != nil || ws[0].Anomalies != nil {
		t.Fatalf("without anomalies: %+v %v", ws, err)
	}
	ws, err = Parse([]byte(base+"  anomalies: {}\n"), ".", os.LookupEnv)
	if err != nil || ws[0].Anomalies == nil || *ws[0].Anomalies != (Anomalies{Window: DefaultAnomalyWindow, History: DefaultAnomalyHistory}) {
		t.Fatalf("anomalies: {}: %+v %v", ws[0].Anomalies, err)
	}
	ws, err = Parse([]byte(base+"  anomalies: {window: 1m, history: 30m}\n"), ".", os.LookupEnv)
	if err != nil || *ws[0].Anomalies != (Anomalies{Window: time.Minute, History: 30 * time.Minute}) {
		t.Fatalf("anomalies with spans: %+v %v", ws[0].Anomalies, err)
	}
}
