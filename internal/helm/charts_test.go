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
		{"redis", nil},
		{"redis", map[string]any{"persistence": map[string]any{"enabled": true}}},
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
