package helm

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"math"
	"strings"

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
		// YAML straight from the object (the emitter sigs.k8s.io/yaml uses
		// after a round trip through JSON, at a fraction of the
		// allocations), once forYAML has made its values safe to write.
		if _, err := forYAML(obj.Object, 0); err != nil {
			return nil, fmt.Errorf("rendered %s %s: %w", obj.GetKind(), obj.GetName(), err)
		}
		b, err := goyaml.Marshal(obj.Object)
		if err != nil {
			return nil, err
		}
		out.WriteString("---\n")
		out.Write(b)
	}
	return out, nil
}

// maxRenderedDepth bounds how deeply a rendered object may nest. YAML
// indents each level, so a deep object writes out quadratically larger:
// 60 KB nested 10,000 deep (which JSON decoding allows) is 100 MB of YAML.
// The deepest objects of real charts (CRDs' schemas) nest well under 100.
const maxRenderedDepth = 256

// forYAML readies v (a decoded object's value) for the YAML emitter, in
// place, and returns it:
//   - whole numbers, which decoding made float64, become int64, so they are
//     written as digits (1000680000, not 1.00068e+09) as JSON writes them;
//   - a "<<" key is refused: YAML reads it back as a merge key, so Helm
//     would apply other fields than chartpilot decorated and checked;
//   - nesting deeper than maxRenderedDepth is refused.
func forYAML(v any, depth int) (any, error) {
	if depth > maxRenderedDepth {
		return nil, &renderedFieldError{why: fmt.Sprintf("nests deeper than %d levels: flatten it", maxRenderedDepth)}
	}
	switch t := v.(type) {
	case float64:
		if t == math.Trunc(t) && math.Abs(t) < 1<<63 {
			return int64(t), nil
		}
	case map[string]any:
		for k, e := range t {
			if k == "<<" {
				return nil, &renderedFieldError{steps: []string{".<<"}, why: "YAML reads this key as a merge of other fields: rename it"}
			}
			out, err := forYAML(e, depth+1)
			if err != nil {
				return nil, err.(*renderedFieldError).under("." + k)
			}
			t[k] = out
		}
	case []any:
		for i, e := range t {
			out, err := forYAML(e, depth+1)
			if err != nil {
				return nil, err.(*renderedFieldError).under(fmt.Sprintf("[%d]", i))
			}
			t[i] = out
		}
	}
	return v, nil
}

// renderedFieldError is a field of a rendered object chartpilot refuses
// to write, and where it is.
type renderedFieldError struct {
	// steps are the keys and indexes to it, the innermost first (each
	// level adds its own as the walk unwinds: at most maxRenderedDepth).
	steps []string
	why   string
}

// under adds the key or index of the level above.
func (e *renderedFieldError) under(step string) *renderedFieldError {
	e.steps = append(e.steps, step)
	return e
}

func (e *renderedFieldError) Error() string {
	var path strings.Builder
	for i := len(e.steps) - 1; i >= 0 && path.Len() < 200; i-- {
		path.WriteString(e.steps[i])
	}
	if path.Len() > 200 {
		return fmt.Sprintf("field %.200s...: %s", path.String(), e.why)
	}
	return fmt.Sprintf("field %s: %s", path.String(), e.why)
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
