package main

import (
	"bytes"
	"strings"
	"testing"

	"github.com/chartpilot/chartpilot/internal/kubeapis"
)

func TestBreakingAPIs(t *testing.T) {
	obj := map[string]any{"status": map[string]any{"deprecatedAPIs": []any{
		map[string]any{"apiVersion": "storage.k8s.io/v1beta1", "kind": "VolumeAttributesClass", "objects": int64(2), "removedIn": "1.37", "replacement": "storage.k8s.io/v1", "served": true},
		map[string]any{"apiVersion": "resource.k8s.io/v1beta1", "kind": "DeviceClass", "objects": int64(1), "removedIn": "1.38", "replacement": "resource.k8s.io/v1", "served": false},
	}}}
	for target, want := range map[kubeapis.Minor][]string{
		36: {"DeviceClass"}, // not served now: breaks on any minor
		37: {"VolumeAttributesClass", "DeviceClass"},
	} {
		rows := breakingAPIs("Publicdb", "ns", "r1", obj, target)
		var got []string
		for _, r := range rows {
			got = append(got, r.APIKind)
		}
		if strings.Join(got, ",") != strings.Join(want, ",") {
			t.Errorf("target 1.%d: rows %v, want %v", target, got, want)
		}
	}
	if rows := breakingAPIs("Publicdb", "ns", "r2", map[string]any{"status": map[string]any{"deprecatedAPIs": "not a list"}}, 37); len(rows) != 1 || !strings.Contains(rows[0].APIKind, "unreadable") {
		t.Errorf("an unreadable status.deprecatedAPIs must count as breaking, saying so: %+v", rows)
	}
	var b bytes.Buffer
	rep := preflightReport{KubernetesVersion: "1.37", Releases: 3, Breaking: 1, Rows: breakingAPIs("Publicdb", "ns", "r1", obj, 37)}
	if err := printPreflight(&b, rep, ""); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"storage.k8s.io/v1beta1", "VolumeAttributesClass", "1.37", "storage.k8s.io/v1", "not served now", "1 of 3 releases would break on Kubernetes 1.37"} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("table lacks %q:\n%s", want, b.String())
		}
	}
}
