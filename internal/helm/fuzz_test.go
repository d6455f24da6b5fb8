package helm

import "testing"

// FuzzParseManifest: any rendered text parses or errors; it never panics,
// and every object it returns has a kind.
func FuzzParseManifest(f *testing.F) {
	f.Add("apiVersion: v1\nkind: ConfigMap\nmetadata: {name: a}\n---\napiVersion: v1\nkind: List\nitems:\n- {apiVersion: v1, kind: Secret, metadata: {name: b}}\n")
	f.Add("---\n---\n")
	f.Add("kind: [\n")
	f.Fuzz(func(t *testing.T, manifest string) {
		objs, err := ParseManifest(manifest)
		if err != nil {
			return
		}
		for _, o := range objs {
			if o == nil {
				t.Fatal("a nil object")
			}
		}
	})
}
