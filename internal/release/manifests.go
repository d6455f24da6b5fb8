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

// parsedManifest is a manifest's objects.
type parsedManifest struct {
	objs []*unstructured.Unstructured
}

// storedForms returns each object as the API server keeps it (asStored),
// in the order of objs. They are made on each call, not remembered: kept
// beside every remembered manifest they cost more memory (2 MiB of peak
// heap at 500 releases) than making them costs time.
func (m *parsedManifest) storedForms() []map[string]any {
	out := make([]map[string]any, len(m.objs))
	for i, o := range m.objs {
		out[i] = asStored(o)
	}
	return out
}

// loadManifest is helm.ParseManifest, remembered. The objects are shared
// between callers, which only read them.
func loadManifest(manifest string) (*parsedManifest, error) {
	if v, ok := parsedManifests.Get(manifest); ok {
		return v.(*parsedManifest), nil
	}
	objs, err := helm.ParseManifest(manifest)
	if err != nil {
		return nil, err
	}
	m := &parsedManifest{objs: objs}
	parsedManifests.Add(manifest, m)
	return m, nil
}

// parseManifest returns the objects of manifest (see loadManifest).
func parseManifest(manifest string) ([]*unstructured.Unstructured, error) {
	m, err := loadManifest(manifest)
	if err != nil {
		return nil, err
	}
	return m.objs, nil
}
