package helm

import (
	"bytes"
	"reflect"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

// trickyManifest holds values whose YAML form is easy to get wrong: strings
// that read as numbers, booleans, nulls or dates, multi-line and long
// strings, keys in mixed case and with digits, empty maps and lists.
const trickyManifest = `apiVersion: v1
kind: ConfigMap
metadata:
  name: tricky
  annotations:
    a10: "ten"
    a9: "nine"
    Zeta: "upper"
    zeta: "lower"
data:
  yes: "yes"
  on: "on"
  "null": "null"
  tilde: "~"
  number: "0123"
  octal: "0o17"
  hex: "0x1F"
  float: "1e3"
  date: "2024-01-02"
  colon: "a: b"
  hash: "a #b"
  star: "*ref"
  empty: ""
  spaces: "  padded  "
  multi: |
    line one
    line two
  long: "` + "aaaaaaaaaaaaaaaaaaaa bbbbbbbbbbbbbbbbbbbbbbbb cccccccccccccccccccccccc dddddddddddddddddddddd eeeeeeeeeeeeeeee ffffffffffff" + `"
  unicode: "héllo — ✓"
---
apiVersion: apps/v1
kind: Deployment
metadata:
  name: web
spec:
  replicas: 3
  progressDeadlineSeconds: 600
  template:
    metadata:
      annotations: {}
    spec:
      containers:
        - name: web
          image: nginx:1.27
          args: []
          env:
            - {name: RATIO, value: "0.5"}
          resources:
            limits: {cpu: 1500m, memory: 1Gi}
      tolerations: null
      terminationGracePeriodSeconds: 30
      priority: -7
      securityContext: {runAsUser: 1000680000}
      x-big: 9007199254740993
      x-float: 2.5
      x-bool: true
`

// TestPostRenderedObjectsAreTheDecoratedOnes: what Helm reads back from
// the post-rendered manifest is exactly each object as decorated.
func TestPostRenderedObjectsAreTheDecoratedOnes(t *testing.T) {
	decorate := func(o *unstructured.Unstructured) error {
		l := o.GetLabels()
		if l == nil {
			l = map[string]string{}
		}
		l["chartpilot.dev/release"] = "tricky"
		o.SetLabels(l)
		return nil
	}
	want, err := ParseManifest(trickyManifest)
	if err != nil {
		t.Fatal(err)
	}
	for _, o := range want {
		if err := decorate(o); err != nil {
			t.Fatal(err)
		}
	}
	out, err := (&postRenderer{decorate: decorate}).Run(bytes.NewBufferString(trickyManifest))
	if err != nil {
		t.Fatal(err)
	}
	got, err := ParseManifest(out.String())
	if err != nil {
		t.Fatalf("%v in:\n%s", err, out)
	}
	if len(got) != len(want) {
		t.Fatalf("%d objects, want %d:\n%s", len(got), len(want), out)
	}
	for i := range want {
		if !reflect.DeepEqual(got[i].Object, want[i].Object) {
			t.Errorf("object %d read back as\n%#v\nwant\n%#v\nfrom:\n%s", i, got[i].Object, want[i].Object, out)
		}
	}
	// Whole numbers are written as digits, as JSON writes them.
	if !strings.Contains(out.String(), "runAsUser: 1000680000\n") || !strings.Contains(out.String(), "progressDeadlineSeconds: 600\n") {
		t.Errorf("whole numbers not written as digits:\n%s", out)
	}
	// Each object is its own document, apiVersion on a line of its own
	// (the stored manifest is read and rewritten line by line).
	if n := strings.Count(out.String(), "---\n"); n != 2 || !strings.Contains(out.String(), "\napiVersion: apps/v1\n") {
		t.Errorf("documents or apiVersion lines not as expected:\n%s", out)
	}
}

// TestPostRendererRefusesWhatYAMLReadsOtherwise: a "<<" key (a merge key
// to YAML, so Helm would apply other fields than were decorated) and
// nesting deep enough to write out hundreds of megabytes are refused,
// naming the object and the field.
func TestPostRendererRefusesWhatYAMLReadsOtherwise(t *testing.T) {
	deep := func(n int) string {
		return `{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"deep"},"x":` + strings.Repeat(`{"a":`, n) + `1` + strings.Repeat(`}`, n) + `}`
	}
	p := &postRenderer{decorate: func(*unstructured.Unstructured) error { return nil }}
	for name, c := range map[string]struct {
		manifest string
		want     []string
	}{
		"merge key":           {`{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"x","<<":{"namespace":"kube-system"}}}`, []string{"ConfigMap x", "field .metadata.<<", "merge"}},
		"merge key in a list": {`{"apiVersion":"v1","kind":"Pod","metadata":{"name":"p"},"spec":{"containers":[{"name":"a"},{"<<":{"image":"x"}}]}}`, []string{"Pod p", "field .spec.containers[1].<<"}},
		"too deep":            {deep(300), []string{"ConfigMap deep", "field .x.a.a.a", "deeper than 256 levels"}},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := p.Run(bytes.NewBufferString(c.manifest))
			if err == nil {
				t.Fatal("refused nothing")
			}
			for _, w := range c.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not say %q", err, w)
				}
			}
			if len(err.Error()) > 400 {
				t.Errorf("error of %d characters", len(err.Error()))
			}
		})
	}
	if _, err := p.Run(bytes.NewBufferString(deep(200))); err != nil {
		t.Errorf("200 levels refused: %v", err)
	}
}

func BenchmarkPostRender(b *testing.B) {
	p := &postRenderer{decorate: func(o *unstructured.Unstructured) error {
		o.SetAnnotations(map[string]string{"chartpilot.dev/owner": "Webapp/ns/name"})
		return nil
	}}
	b.ReportAllocs()
	for i := 0; i < b.N; i++ {
		if _, err := p.Run(bytes.NewBufferString(trickyManifest)); err != nil {
			b.Fatal(err)
		}
	}
}
