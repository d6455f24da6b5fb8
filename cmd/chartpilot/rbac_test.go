package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestGeneratedManifestsAreCurrent: the manager's and deployer's roles in config/rbac and in
// charts/chartpilot, and the chart's CRDs, are what `make manifests` makes
// from the current watches.yaml, charts and CRDs.
func TestGeneratedManifestsAreCurrent(t *testing.T) {
	root := filepath.Join("..", "..")
	t.Chdir(root)
	for file, args := range map[string][]string{
		"config/rbac/role.yaml":                       {"--watches", "watches.yaml", "--crds", "config/crd", "--deployer", "chartpilot-deployer"},
		"charts/chartpilot/files/manager-rules.yaml":  {"--watches", "watches.yaml", "--crds", "config/crd", "--deployer", "chartpilot-deployer", "--rules-only", "--webhook-configuration", ""},
		"charts/chartpilot/files/deployer-rules.yaml": {"--watches", "watches.yaml", "--crds", "config/crd", "--deployer-rules-only"},
	} {
		var out bytes.Buffer
		if err := rbacCommand(args, &out); err != nil {
			t.Fatal(err)
		}
		have, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(have, out.Bytes()) {
			t.Errorf("%s is not what chartpilot rbac %v prints: run make manifests", file, args)
		}
	}
	crds, err := filepath.Glob("config/crd/*/*.yaml")
	if err != nil {
		t.Fatal(err)
	}
	chartCRDs, _ := filepath.Glob("charts/chartpilot/crds/*.yaml")
	if len(crds) != len(chartCRDs) {
		t.Errorf("config/crd has %d CRDs, charts/chartpilot/crds %d: run make manifests", len(crds), len(chartCRDs))
	}
	for _, c := range crds {
		want, _ := os.ReadFile(c)
		have, err := os.ReadFile(filepath.Join("charts/chartpilot/crds", filepath.Base(c)))
		if err != nil || !bytes.Equal(have, want) {
			t.Errorf("charts/chartpilot/crds/%s differs from %s: run make manifests", filepath.Base(c), c)
		}
	}
	cel, err := os.ReadFile("charts/chartpilot/files/webhook-match.cel")
	if err != nil {
		t.Fatal(err)
	}
	webhook, err := os.ReadFile("config/webhook/manifests.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var indented strings.Builder
	for _, l := range strings.Split(strings.TrimSpace(string(cel)), "\n") {
		indented.WriteString("          " + l + "\n")
	}
	if !strings.Contains(string(webhook), indented.String()) {
		t.Errorf("charts/chartpilot/files/webhook-match.cel is not the matchCondition of config/webhook/manifests.yaml")
	}
}
