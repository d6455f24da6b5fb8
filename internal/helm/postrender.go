package helm

import (
	"bytes"
	"errors"
	"fmt"
	"io"

	goyaml "go.yaml.in/yaml/v2"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
)

// Decorator changes a rendered object before Helm applies it: chartpilot's
// labels, annotations and owner references. It must be deterministic.
type Decorator func(obj *unstructured.Unstructured) error

// postRenderer applies a Decorator to every object of a rendered manifest.
type postRenderer struct {
	decorate Decorator
	// first, when set, is told the manifest's objects (see firstInstall).
	first     *firstInstall
	namespace string
}

// Run implements Helm's postrender.PostRenderer.
func (p *postRenderer) Run(in *bytes.Buffer) (*bytes.Buffer, error) {
	if p.decorate == nil {
		return in, nil
	}
	objs, err := ParseManifest(in.String())
	if err != nil {
		return nil, err
	}
	if p.first != nil {
		p.first.rendered(p.namespace, objs)
	}
	out := new(bytes.Buffer)
	for _, obj := range objs {
		if err := p.decorate(obj); err != nil {
			return nil, fmt.Errorf("decorating %s %s: %w", obj.GetKind(), obj.GetName(), err)
		}
		// YAML straight from the object: what sigs.k8s.io/yaml would write
		// by way of JSON, parsed again (the same emitter, the same values),
		// at a fraction of the allocations.
		b, err := goyaml.Marshal(obj.Object)
		if err != nil {
			return nil, err
		}
		out.WriteString("---\n")
		out.Write(b)
	}
	return out, nil
}

// ParseManifest splits a multi-document manifest into objects, skipping
// empty documents. Items of a List are returned one by one.
func ParseManifest(manifest string) ([]*unstructured.Unstructured, error) {
	dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewBufferString(manifest), 4096)
	var out []*unstructured.Unstructured
	for {
		var m map[string]any
		if err := dec.Decode(&m); err != nil {
			if errors.Is(err, io.EOF) {
				return out, nil
			}
			return nil, fmt.Errorf("parsing rendered manifest: %w", err)
		}
		if len(m) == 0 {
			continue
		}
		u := &unstructured.Unstructured{Object: m}
		if u.IsList() {
			err := u.EachListItem(func(o runtime.Object) error {
				out = append(out, o.(*unstructured.Unstructured))
				return nil
			})
			if err != nil {
				return nil, err
			}
			continue
		}
		out = append(out, u)
	}
}
