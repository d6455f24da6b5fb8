package release

import (
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/utils/lru"

	"github.com/chartpilot/chartpilot/internal/helm"
)

// parsedManifests holds the latest manifests parsed, by their text. One
// pass reads its release's manifest for the scope check, the watches of
// its kinds, drift and the health gate, and the health gate polls it
// again: parsing it each time (YAML to JSON to maps) was a third of all
// the operator allocated during an install or upgrade wave. The bound
// keeps what it holds to the manifests of the passes running at once and
// just before.
var parsedManifests = lru.New(64)

// parseManifest is helm.ParseManifest, remembered. The objects are shared
// between callers, which only read them.
func parseManifest(manifest string) ([]*unstructured.Unstructured, error) {
	if v, ok := parsedManifests.Get(manifest); ok {
		return v.([]*unstructured.Unstructured), nil
	}
	objs, err := helm.ParseManifest(manifest)
	if err != nil {
		return nil, err
	}
	parsedManifests.Add(manifest, objs)
	return objs, nil
}
