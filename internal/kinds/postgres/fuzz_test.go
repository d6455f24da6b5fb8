package postgres

import (
	"encoding/json"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

// FuzzValuesAndFacts: any spec translates or errors; never panics, and the
// facts of a translated spec are read from its values.
func FuzzValuesAndFacts(f *testing.F) {
	f.Add(`{"version":"17","replicas":3,"storage":{"size":"10Gi"},"resources":{"limits":{"cpu":"2","memory":"1Gi"}},"parameters":{"max_connections":"50"}}`)
	f.Add(`{"version":"16","storage":{"size":"1Gi"},"values":{"resources":{"limits":{"cpu":"8"}}}}`)
	f.Add(`{"replicas":"x"}`)
	f.Fuzz(func(t *testing.T, spec string) {
		var m map[string]any
		if json.Unmarshal([]byte(spec), &m) != nil {
			return
		}
		obj := &unstructured.Unstructured{Object: map[string]any{"apiVersion": "chartpilot.dev/v1alpha1", "kind": "Postgres", "metadata": map[string]any{"name": "db", "namespace": "ns"}, "spec": m}}
		vals, err := Values(obj)
		if err != nil {
			return
		}
		if f := Facts(obj, vals); f.Replicas < 0 || f.StorageBytes < 0 {
			t.Fatalf("negative facts %+v from %s", f, spec)
		}
	})
}
