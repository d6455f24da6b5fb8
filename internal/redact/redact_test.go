package redact

import (
	"strings"
	"testing"
)

func TestURL(t *testing.T) {
	for in, want := range map[string]string{
		"https://user:s3cret@charts.example/x": "https://charts.example/x",
		"oci://token@registry.example/charts":  "oci://registry.example/charts",
		"https://charts.example/x?y=1":         "https://charts.example/x?y=1",
		"http://user:s3cret@[::1:80/":          "(unparseable URL)",
	} {
		got := URL(in)
		if got != want || strings.Contains(got, "s3cret") {
			t.Errorf("URL(%q) = %q, want %q", in, got, want)
		}
	}
}
