package helm

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

func TestParseManifest(t *testing.T) {
	objs, err := ParseManifest("---\n# Source: a.yaml\napiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: a\n---\n\n---\napiVersion: v1\nkind: List\nitems:\n- {apiVersion: v1, kind: Secret, metadata: {name: b}}\n- {apiVersion: v1, kind: Service, metadata: {name: c}}\n")
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, o := range objs {
		names = append(names, o.GetKind()+"/"+o.GetName())
	}
	if got := strings.Join(names, ","); got != "ConfigMap/a,Secret/b,Service/c" {
		t.Fatalf("objects = %s", got)
	}
	if _, err := ParseManifest("apiVersion: v1\nkind: [oops"); err == nil {
		t.Fatal("want an error for a broken manifest")
	}
}

func TestPostRendererDecoratesEveryObject(t *testing.T) {
	p := &postRenderer{decorate: func(o *unstructured.Unstructured) error {
		l := o.GetLabels()
		if l == nil {
			l = map[string]string{}
		}
		l["seen"] = "yes"
		o.SetLabels(l)
		return nil
	}}
	out, err := p.Run(bytes.NewBufferString("apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: a\n---\napiVersion: v1\nkind: Service\nmetadata:\n  name: b\n  labels: {x: z}\n"))
	if err != nil {
		t.Fatal(err)
	}
	objs, err := ParseManifest(out.String())
	if err != nil {
		t.Fatal(err)
	}
	if len(objs) != 2 {
		t.Fatalf("%d objects after post-rendering", len(objs))
	}
	for _, o := range objs {
		if o.GetLabels()["seen"] != "yes" {
			t.Errorf("%s/%s not decorated: %v", o.GetKind(), o.GetName(), o.GetLabels())
		}
	}
	if objs[1].GetLabels()["x"] != "z" {
		t.Errorf("existing label lost")
	}
}

func TestChartDigestFollowsContent(t *testing.T) {
	dir := t.TempDir()
	write := func(rel, content string) {
		p := filepath.Join(dir, rel)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("Chart.yaml", "apiVersion: v2\nname: c\nversion: 1.0.0\n")
	write("templates/cm.yaml", "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: x}\n")
	a, err := LoadChart(dir)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := LoadChart(dir)
	if a.Digest != b.Digest || a.Name != "c" || a.Version != "1.0.0" {
		t.Fatalf("unstable digest or metadata: %+v %+v", a, b)
	}
	write("templates/cm.yaml", "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: y}\n")
	c, _ := LoadChart(dir)
	if c.Digest == a.Digest {
		t.Fatal("a template change did not change the digest")
	}
	if _, err := LoadChart(filepath.Join(dir, "missing")); err == nil {
		t.Fatal("want an error for a missing chart")
	}
}

func TestDeepCopyValues(t *testing.T) {
	in := map[string]any{"a": map[string]any{"b": []any{map[string]any{"c": 1}}}}
	out := copyValues(in)
	out["a"].(map[string]any)["b"].([]any)[0].(map[string]any)["c"] = 2
	if in["a"].(map[string]any)["b"].([]any)[0].(map[string]any)["c"] != 1 {
		t.Fatal("copyValues shares nested values")
	}
}
