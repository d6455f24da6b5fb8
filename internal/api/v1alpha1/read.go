package v1alpha1

import (
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
)

// ReadReleaseStatus decodes the status every managed kind shares from a
// resource read as unstructured (the release reconciler, the CLI, the
// backup and storage controllers all read it so). A status of another
// shape reads as empty: whoever wrote it, nothing is taken from it.
func ReadReleaseStatus(obj *unstructured.Unstructured) *ReleaseStatus {
	st := &ReleaseStatus{}
	raw, ok := obj.Object["status"].(map[string]any)
	if !ok || raw == nil {
		return st
	}
	if runtime.DefaultUnstructuredConverter.FromUnstructured(raw, st) != nil {
		return &ReleaseStatus{}
	}
	return st
}
