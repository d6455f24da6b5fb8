package release

import (
	"encoding/json"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	kjson "sigs.k8s.io/json"
)

// asStored returns obj as the API server keeps it after a write of it, as
// far as that can be known without asking: an object of a built-in kind is
// decoded into its Go type and encoded again, as the server does. What the
// server drops on the way in is dropped here too: nulls, empty lists and
// maps and zero-valued fields it omits (hostNetwork: false,
// supplementalGroups: []), fields of no such name (keys are matched case
// by case, as the server does); quantities come out in their canonical form
// (1024Mi as 1Gi). A chart's rendering and the live object then compare
// equal when the server would store them the same, so the health gate and
// drift detection do not see a difference that no write can remove.
//
// Kinds the scheme does not know (custom resources) are returned as they
// are: the server keeps their fields as written, besides pruning.
func asStored(obj *unstructured.Unstructured) map[string]any {
	typed, err := clientgoscheme.Scheme.New(obj.GroupVersionKind())
	if err != nil {
		return obj.Object
	}
	raw, err := json.Marshal(obj.Object)
	if err != nil {
		return obj.Object
	}
	// A field of the wrong type is refused by the server at the write;
	// the object as written is all there is to compare.
	if err := kjson.UnmarshalCaseSensitivePreserveInts(raw, typed); err != nil {
		return obj.Object
	}
	if raw, err = json.Marshal(typed); err != nil {
		return obj.Object
	}
	var out map[string]any
	if err := kjson.UnmarshalCaseSensitivePreserveInts(raw, &out); err != nil {
		return obj.Object
	}
	return out
}
