package release

import "testing"

func TestParseManifestRemembers(t *testing.T) {
	m := "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: a\n---\napiVersion: v1\nkind: Service\nmetadata:\n  name: b\n"
	first, err := parseManifest(m)
	if err != nil || len(first) != 2 {
		t.Fatalf("parse: %d objects, %v", len(first), err)
	}
	again, err := parseManifest(m)
	if err != nil || len(again) != 2 || again[0] != first[0] {
		t.Fatalf("the same text was parsed again (%v)", err)
	}
	other, err := parseManifest(m + "---\napiVersion: v1\nkind: Secret\nmetadata:\n  name: c\n")
	if err != nil || len(other) != 3 || other[0] == first[0] {
		t.Fatalf("another text: %d objects, %v", len(other), err)
	}
	if _, err := parseManifest("kind: [unclosed"); err == nil {
		t.Fatal("a manifest that does not parse gave no error")
	}
	if _, err := parseManifest("kind: [unclosed"); err == nil {
		t.Fatal("a manifest that does not parse gave no error the second time")
	}
}

func TestAbsentAt(t *testing.T) {
	obj := map[string]any{"spec": map[string]any{
		"updateStrategy": map[string]any{"rollingUpdate": map[string]any{"partition": int64(0)}},
		"containers":     []any{map[string]any{"image": "x", "env": []any{map[string]any{"name": "A"}}}},
	}}
	for path, want := range map[string]bool{
		"spec.updateStrategy.rollingUpdate.partition":      false,
		"spec.updateStrategy.rollingUpdate.maxUnavailable": true,
		"spec.containers[0].image":                         false,
		"spec.containers[0].env[0].name":                   false,
		"spec.containers[1].image":                         true,
		"spec.containers[0].env[3]":                        true,
		"status.replicas":                                  true,
	} {
		if got := absentAt(obj, path); got != want {
			t.Errorf("absentAt(%s) = %v, want %v", path, got, want)
		}
	}
}
