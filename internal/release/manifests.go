package release

import (
	"context"
	"strconv"
	"strings"
	"sync"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/dynamic"
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
	// server holds, by object index, the object as the API server's dry
	// run of it returned it (serverForm), made only for objects whose live
	// form lacks a field the chart sets.
	mu     sync.Mutex
	server map[int]serverResult
}

// serverResult is the answer of one dry run: the object, or the error
// (kept too, so that a refused dry run is not sent again).
type serverResult struct {
	obj map[string]any
	err error
}

// serverForm is objs[i] as the API server would keep it: a server-side
// apply of it, dry run (nothing is written), as the release's identity
// (ri). It drops what the server drops, such as a field behind a feature
// gate the server has off. One request per object and manifest, at most
// (a refusal is remembered as well).
func (m *parsedManifest) serverForm(ctx context.Context, i int, ri dynamic.ResourceInterface) (map[string]any, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if f, ok := m.server[i]; ok {
		return f.obj, f.err
	}
	obj := m.objs[i].DeepCopy()
	obj.SetResourceVersion("")
	var res serverResult
	if out, err := ri.Apply(ctx, obj.GetName(), obj, metav1.ApplyOptions{FieldManager: "chartpilot-dry-run", Force: true, DryRun: []string{metav1.DryRunAll}}); err != nil {
		res.err = err
	} else {
		res.obj = out.Object
	}
	if m.server == nil {
		m.server = map[int]serverResult{}
	}
	m.server[i] = res
	return res.obj, res.err
}

// absentAt reports whether obj has no value at path (a path of
// objectDiffers: "spec.template.spec.containers[0].image").
func absentAt(obj map[string]any, path string) bool {
	var cur any = obj
	for _, seg := range strings.Split(path, ".") {
		name, rest, _ := strings.Cut(seg, "[")
		if name != "" {
			mp, ok := cur.(map[string]any)
			if !ok {
				return true
			}
			if cur, ok = mp[name]; !ok || cur == nil {
				return true
			}
		}
		for rest != "" {
			idx, after, _ := strings.Cut(rest, "]")
			n, err := strconv.Atoi(idx)
			l, ok := cur.([]any)
			if err != nil || !ok || n < 0 || n >= len(l) {
				return true
			}
			cur = l[n]
			rest = strings.TrimPrefix(after, "[")
		}
	}
	return false
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
