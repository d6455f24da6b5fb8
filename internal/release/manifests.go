package release

import (
	"sync"

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

// parsedManifest is a manifest's objects and, computed on first use, each
// object as the API server keeps it (see asStored).
type parsedManifest struct {
	objs       []*unstructured.Unstructured
	storedOnce sync.Once
	stored     []map[string]any
}

// storedForms returns each object as the API server keeps it, in the order
// of objs.
func (m *parsedManifest) storedForms() []map[string]any {
	m.storedOnce.Do(func() {
		m.stored = make([]map[string]any, len(m.objs))
		for i, o := range m.objs {
			m.stored[i] = asStored(o)
		}
	})
	return m.stored
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
