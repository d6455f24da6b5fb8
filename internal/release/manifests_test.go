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
