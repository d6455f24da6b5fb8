package release

import (
	"context"
	"encoding/json"
	"fmt"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	utiljson "k8s.io/apimachinery/pkg/util/json"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// compactField holds, in the caches of the watched kinds and of the
// releases' objects, everything of an object but its apiVersion, kind and
// metadata, as one JSON string.
//
// A decoded object is a tree of maps: a Deployment of 1.8 KB of JSON
// takes 8.9 KiB of heap that way, and every map is more for the collector
// to walk. The caches keep the metadata decoded (event handlers, label
// selectors and owner lookups read it) and the rest as JSON; compactReader
// decodes it again on every read.
const compactField = "chartpilot.dev/compacted"

// compactObject is the cache's transform: it drops managed fields and
// turns the body of an unstructured object into compactField. Anything else
// (a tombstone, a typed object) passes through.
//
// It must be idempotent: an informer's initial list streamed from the API
// server is transformed into a temporary store and again when it replaces
// the informer's. An object holding nothing but metadata and a string in
// compactField is taken as compacted already. Only a kind that keeps
// unknown fields at its root can come that way from the API server, and
// then only the body of that same object is read from the string (expand
// never takes metadata from it); an object with that field beside others
// is compacted with the field and reads back as it was.
func compactObject(in any) (any, error) {
	u, ok := in.(*unstructured.Unstructured)
	if !ok {
		return cache.TransformStripManagedFields()(in)
	}
	if compacted(u) {
		return u, nil
	}
	u.SetManagedFields(nil)
	body := make(map[string]any, len(u.Object))
	for k, v := range u.Object {
		switch k {
		case "apiVersion", "kind", "metadata":
		default:
			body[k] = v
		}
	}
	if len(body) == 0 {
		return u, nil
	}
	b, err := json.Marshal(body)
	if err != nil {
		// Not expected of a decoded object; keep it whole rather than lose it.
		return u, nil
	}
	out := make(map[string]any, 4)
	for _, k := range []string{"apiVersion", "kind", "metadata"} {
		if v, ok := u.Object[k]; ok {
			out[k] = v
		}
	}
	out[compactField] = string(b)
	u.Object = out
	return u, nil
}

// compacted reports whether u has compactObject's shape: metadata and the
// body in compactField, nothing else.
func compacted(u *unstructured.Unstructured) bool {
	if _, ok := u.Object[compactField].(string); !ok {
		return false
	}
	for k := range u.Object {
		switch k {
		case "apiVersion", "kind", "metadata", compactField:
		default:
			return false
		}
	}
	return true
}

// expand decodes u's compactField back into its fields, in place. u must be
// a copy, not the cache's own object.
func expand(u *unstructured.Unstructured) error {
	if !compacted(u) {
		return nil
	}
	s := u.Object[compactField].(string)
	delete(u.Object, compactField)
	var body map[string]any
	if err := utiljson.Unmarshal([]byte(s), &body); err != nil {
		return fmt.Errorf("decoding cached %s %s: %w", u.GetKind(), u.GetName(), err)
	}
	for k, v := range body {
		switch k {
		case "apiVersion", "kind", "metadata":
			// Never in a body compactObject wrote.
		default:
			u.Object[k] = v
		}
	}
	return nil
}

// expanded returns the whole object of a compacted one from an event,
// leaving the cache's object untouched (its metadata is shared, not copied:
// read it only).
func expanded(u *unstructured.Unstructured) (*unstructured.Unstructured, error) {
	if !compacted(u) {
		return u, nil
	}
	out := &unstructured.Unstructured{Object: make(map[string]any, len(u.Object)+4)}
	for k, v := range u.Object {
		out.Object[k] = v
	}
	return out, expand(out)
}

// compactReader answers reads of a cache whose objects were compacted with
// whole objects. Informers, and so event handlers, see compacted objects:
// their metadata is whole, their body is in compactField (see expanded).
type compactReader struct {
	client.Reader
}

func (c compactReader) Get(ctx context.Context, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
	if err := c.Reader.Get(ctx, key, obj, opts...); err != nil {
		return err
	}
	if u, ok := obj.(*unstructured.Unstructured); ok {
		return expand(u)
	}
	return nil
}

func (c compactReader) List(ctx context.Context, list client.ObjectList, opts ...client.ListOption) error {
	if err := c.Reader.List(ctx, list, opts...); err != nil {
		return err
	}
	if ul, ok := list.(*unstructured.UnstructuredList); ok {
		for i := range ul.Items {
			if err := expand(&ul.Items[i]); err != nil {
				return err
			}
		}
	}
	return nil
}

// compactCache is compactReader of a whole cache (informers included).
type compactCache struct {
	cache.Cache
}

func (c compactCache) Get(ctx context.Context, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
	return compactReader{Reader: c.Cache}.Get(ctx, key, obj, opts...)
}

func (c compactCache) List(ctx context.Context, list client.ObjectList, opts ...client.ListOption) error {
	return compactReader{Reader: c.Cache}.List(ctx, list, opts...)
}
