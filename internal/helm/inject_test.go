package helm

import (
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

// injections are strings that try to add pod fields or whole documents
// through a value that a template prints.
var injections = []string{
	"x\nhostPID: true",
	"x\n---\napiVersion: v1\nkind: Pod\nmetadata:\n  name: injected\nspec:\n  hostNetwork: true",
	"x\"\n      hostPID: true\n      x: \"",
	"x'\n  hostIPC: true\n  y: '",
	"x }}\nprivileged: true",
}

// stringPaths lists the values paths of a chart's schema that hold strings
// (typed, enums and references to string definitions), and of maps of strings.
func stringPaths(t *testing.T, schemaFile string) (scalars, maps [][]string) {
	t.Helper()
	raw, err := os.ReadFile(schemaFile)
	if err != nil {
		t.Fatal(err)
	}
	var schema map[string]any
	if err := json.Unmarshal(raw, &schema); err != nil {
		t.Fatal(err)
	}
	defs, _ := schema["definitions"].(map[string]any)
	var walk func(node map[string]any, path []string)
	walk = func(node map[string]any, path []string) {
		if ref, ok := node["$ref"].(string); ok {
			if def, ok := defs[strings.TrimPrefix(ref, "#/definitions/")].(map[string]any); ok {
				node = def
			}
		}
		if props, ok := node["properties"].(map[string]any); ok {
			for k, v := range props {
				if sub, ok := v.(map[string]any); ok {
					walk(sub, append(slices.Clone(path), k))
				}
			}
			return
		}
		if _, ok := node["additionalProperties"].(map[string]any); ok && node["type"] == "object" {
			maps = append(maps, path)
			return
		}
		if node["type"] == "string" || node["enum"] != nil || node["oneOf"] != nil || node["$ref"] != nil {
			scalars = append(scalars, path)
		}
	}
	walk(schema, nil)
	return scalars, maps
}

func setPath(vals map[string]any, path []string, v any) {
	for _, k := range path[:len(path)-1] {
		next, ok := vals[k].(map[string]any)
		if !ok {
			next = map[string]any{}
			vals[k] = next
		}
		vals = next
	}
	vals[path[len(path)-1]] = v
}

// shape is what an attacker would change: the objects and the pod fields
// that break out of the namespace's isolation.
func shape(t *testing.T, manifest string) string {
	t.Helper()
	objs, err := ParseManifest(manifest)
	if err != nil {
		t.Fatalf("a rendered manifest does not parse: %v", err)
	}
	var out []string
	for _, o := range objs {
		out = append(out, o.GetKind()+"/"+o.GetName())
		spec, _, _ := unstructured.NestedMap(o.Object, "spec", "template", "spec")
		if spec == nil {
			spec, _, _ = unstructured.NestedMap(o.Object, "spec")
		}
		for _, f := range []string{"hostPID", "hostNetwork", "hostIPC"} {
			if v, ok := spec[f]; ok {
				out = append(out, o.GetName()+"."+f+"="+strings.TrimSpace(strings.ToLower(jsonString(v))))
			}
		}
		if strings.Contains(jsonString(o.Object), `"privileged":true`) {
			out = append(out, o.GetName()+".privileged")
		}
	}
	sort.Strings(out)
	return strings.Join(out, " ")
}

func jsonString(v any) string { b, _ := json.Marshal(v); return string(b) }

// TestChartsResistInjection renders the shipped charts with an injection in
// every string value their schemas name: each render is refused, or makes
// exactly the objects and pod isolation fields of a benign render.
func TestChartsResistInjection(t *testing.T) {
	for _, name := range []string{"postgresql", "redis"} {
		dir := filepath.Join(chartsDir, name)
		ch, err := LoadChart(dir)
		if err != nil {
			t.Fatal(err)
		}
		benign, err := Template(ch, "db", "ns1", nil, "v1.37.2")
		if err != nil {
			t.Fatalf("%s: benign render: %v", name, err)
		}
		want := shape(t, benign)
		scalars, maps := stringPaths(t, filepath.Join(dir, "values.schema.json"))
		if len(scalars) < 5 {
			t.Fatalf("%s: only %d string values found in the schema", name, len(scalars))
		}
		refused, rendered := 0, 0
		for _, payload := range injections {
			var tries []map[string]any
			for _, p := range scalars {
				v := map[string]any{}
				setPath(v, p, payload)
				tries = append(tries, v)
			}
			for _, p := range maps {
				v, k := map[string]any{}, map[string]any{}
				setPath(v, p, map[string]any{"key": payload})
				setPath(k, p, map[string]any{payload: "value"})
				tries = append(tries, v, k)
			}
			for _, vals := range tries {
				manifest, err := Template(ch, "db", "ns1", vals, "v1.37.2")
				if err != nil {
					refused++
					continue
				}
				rendered++
				if got := shape(t, manifest); got != want {
					t.Errorf("%s: values %v changed the release:\n got %s\nwant %s", name, vals, got, want)
				}
			}
		}
		t.Logf("%s: %d injected renders refused, %d rendered harmlessly", name, refused, rendered)
	}
}
