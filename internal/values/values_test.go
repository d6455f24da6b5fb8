package values

import (
	"reflect"
	"testing"
)

func TestMergeLayers(t *testing.T) {
	cr := map[string]any{"replicas": int64(1), "image": map[string]any{"repo": "redis", "tag": "7"}, "list": []any{"a"}, "drop": "x"}
	tenant := map[string]any{"image": map[string]any{"tag": "7.2"}, "list": []any{"b", "c"}, "drop": nil}
	overrides := map[string]any{"replicas": int64(3)}
	got := Merge(Layer{"cr", cr}, Layer{"tenant", tenant}, Layer{"overrides", overrides})
	want := map[string]any{"replicas": int64(3), "image": map[string]any{"repo": "redis", "tag": "7.2"}, "list": []any{"b", "c"}}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("Merge = %v, want %v", got, want)
	}
	if cr["image"].(map[string]any)["tag"] != "7" || cr["drop"] != "x" {
		t.Fatalf("Merge modified its input: %v", cr)
	}
	got["image"].(map[string]any)["tag"] = "changed"
	if tenant["image"].(map[string]any)["tag"] != "7.2" {
		t.Fatal("Merge output shares maps with its input")
	}
}

func TestDigest(t *testing.T) {
	a := map[string]any{"x": 1, "y": map[string]any{"z": "q", "w": []any{1, 2}}}
	b := map[string]any{"y": map[string]any{"w": []any{1, 2}, "z": "q"}, "x": 1.0}
	da, err := Digest("c1", a, map[string]string{"k": "v"})
	if err != nil {
		t.Fatal(err)
	}
	db, _ := Digest("c1", b, map[string]string{"k": "v"})
	if da != db {
		t.Errorf("same inputs in another order hash differently: %s %s", da, db)
	}
	if len(da) != DigestLength {
		t.Errorf("digest length %d", len(da))
	}
	for name, other := range map[string]func() (string, error){
		"chart":      func() (string, error) { return Digest("c2", a, map[string]string{"k": "v"}) },
		"values":     func() (string, error) { return Digest("c1", map[string]any{"x": 2}, map[string]string{"k": "v"}) },
		"annotation": func() (string, error) { return Digest("c1", a, map[string]string{"k": "w"}) },
		"no annot":   func() (string, error) { return Digest("c1", a, nil) },
	} {
		d, _ := other()
		if d == da {
			t.Errorf("changing the %s does not change the digest", name)
		}
	}
}

func TestComposeKeepsNullForTheMerge(t *testing.T) {
	layer := Compose(
		map[string]any{"a": map[string]any{"x": 1, "y": 2}, "drop": "set first"},
		map[string]any{"a": map[string]any{"y": nil}, "drop": nil},
	)
	want := map[string]any{"a": map[string]any{"x": 1, "y": nil}, "drop": nil}
	if !reflect.DeepEqual(layer, want) {
		t.Fatalf("Compose = %v, want %v", layer, want)
	}
	got := Merge(Layer{Name: "cr", Values: map[string]any{"a": map[string]any{"y": 3, "z": 4}, "drop": "cr"}}, Layer{Name: "tenant", Values: layer})
	if want := map[string]any{"a": map[string]any{"x": 1, "z": 4}}; !reflect.DeepEqual(got, want) {
		t.Fatalf("Merge = %v, want %v", got, want)
	}
}
