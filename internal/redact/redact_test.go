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

func TestText(t *testing.T) {
	const secret = "hunter2-S3CRET"
	for _, tc := range []struct{ in, keep string }{
		{"values don't meet the specifications of the schema(s) in the following chart(s):\nredis:\n- at '/persistence/size': '" + secret + "' does not match pattern '^[0-9]+$'", "at '/persistence/size': <redacted> does not match pattern"},
		{`Deployment.apps "web" is invalid: spec.template.spec.nodeSelector: Invalid value: "` + secret + ` x": a valid label must be an empty string`, "spec.template.spec.nodeSelector: Invalid value: <redacted>: a valid label"},
		{`spec.ports[0].port: Invalid value: 70000: must be between 1 and 65535`, "Invalid value: 70000: must be between"},
		{`spec.replicas: Invalid value: map[string]interface {}{"k":"` + secret + `"}: bad`, "spec.replicas: Invalid value: <redacted>: bad"},
		{`spec.type: Unsupported value: "` + secret + `": supported values: "ClusterIP", "NodePort"`, `Unsupported value: <redacted>: supported values: "ClusterIP"`},
		{`with \"quotes\" Invalid value: "a \"` + secret + `\" b": bad`, "Invalid value: <redacted>: bad"},
		{"Get https://user:" + secret + "@charts.example/index.yaml: EOF", "https://charts.example/index.yaml"},
	} {
		got := Text(tc.in)
		if strings.Contains(got, secret) || !strings.Contains(got, tc.keep) {
			t.Errorf("Text(%q) = %q, want it to keep %q and drop the value", tc.in, got, tc.keep)
		}
	}
	if Error(nil) != nil {
		t.Error("Error(nil) must be nil")
	}
}
