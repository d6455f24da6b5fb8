package helm

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
)

// A first install of a release checks, before it creates anything, that no
// object of its manifest exists yet (or, if one does, that it belongs to
// this release): one GET per object, which finds nothing nearly always. A
// first install here skips those reads: each object of the rendered
// manifest that the object cache does not hold is taken to be absent, and
// its create is what finds out. When a create answers AlreadyExists, the
// attempt is undone (the objects it created are deleted, its record too)
// and the install runs again with Helm's own reads, which refuse an object
// that is someone else's before anything is stored, as they always did.
// Lookups of the chart's templates run before the manifest is known and
// are never answered this way.

// firstInstall is the state of one install attempt that skips existence
// checks.
type firstInstall struct {
	mu sync.Mutex
	// manifest holds the rendered objects (kind, namespace, name), known
	// once the post-renderer has seen them.
	manifest map[objectKey]bool
	// created are the objects this attempt created (path and UID).
	created []createdObject
	// conflict: a create found its object already there.
	conflict bool
}

type objectKey struct {
	gvk             schema.GroupVersionKind
	namespace, name string
}

type createdObject struct {
	gvr             schema.GroupVersionResource
	namespace, name string
	uid             string
}

// rendered records the objects of the manifest (release namespace for
// those that name none; a cluster-scoped one is matched by name alone).
func (f *firstInstall) rendered(namespace string, objs []*unstructured.Unstructured) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.manifest = map[objectKey]bool{}
	for _, o := range objs {
		ns := o.GetNamespace()
		if ns == "" {
			ns = namespace
		}
		f.manifest[objectKey{o.GroupVersionKind(), ns, o.GetName()}] = true
	}
}

// assumeAbsent reports whether a GET of this object is an existence check
// of the manifest's objects (the manifest is known).
func (f *firstInstall) assumeAbsent(gvk schema.GroupVersionKind, namespace, name string) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.manifest[objectKey{gvk, namespace, name}] || (namespace == "" && f.clusterScopedLocked(gvk, name))
}

func (f *firstInstall) clusterScopedLocked(gvk schema.GroupVersionKind, name string) bool {
	for k := range f.manifest {
		if k.gvk == gvk && k.name == name {
			return true
		}
	}
	return false
}

// hadConflict reports whether a create of the attempt found its object there.
func (f *firstInstall) hadConflict() bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.conflict
}

// sawCreate notes the answer to a create.
func (f *firstInstall) sawCreate(gvr schema.GroupVersionResource, namespace string, resp *http.Response) {
	switch resp.StatusCode {
	case http.StatusConflict:
		f.mu.Lock()
		f.conflict = true
		f.mu.Unlock()
	case http.StatusCreated, http.StatusOK:
		body, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		resp.Body = io.NopCloser(strings.NewReader(string(body)))
		if err != nil {
			return
		}
		var m struct {
			Metadata struct {
				Name, UID string
			} `json:"metadata"`
		}
		if json.Unmarshal(body, &m) != nil || m.Metadata.Name == "" {
			return
		}
		f.mu.Lock()
		f.created = append(f.created, createdObject{gvr, namespace, m.Metadata.Name, m.Metadata.UID})
		f.mu.Unlock()
	}
}

// undo deletes the objects the attempt created (each only while it is
// the one created: UID precondition).
func (f *firstInstall) undo(ctx context.Context, dyn dynamic.Interface) error {
	f.mu.Lock()
	created := append([]createdObject(nil), f.created...)
	f.mu.Unlock()
	for _, o := range created {
		opts := metav1.DeleteOptions{}
		if o.uid != "" {
			uid := types.UID(o.uid)
			opts.Preconditions = &metav1.Preconditions{UID: &uid}
		}
		var err error
		if o.namespace == "" {
			err = dyn.Resource(o.gvr).Delete(ctx, o.name, opts)
		} else {
			err = dyn.Resource(o.gvr).Namespace(o.namespace).Delete(ctx, o.name, opts)
		}
		// Gone, or replaced by another object of that name: not ours to delete.
		if err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
			return err
		}
	}
	return nil
}

// notFound is the API server's answer for an absent object.
func notFound(req *http.Request, gvr schema.GroupVersionResource, name string) *http.Response {
	st := metav1.Status{
		TypeMeta: metav1.TypeMeta{Kind: "Status", APIVersion: "v1"},
		Status:   metav1.StatusFailure,
		Message:  gvr.Resource + " \"" + name + "\" not found",
		Reason:   metav1.StatusReasonNotFound,
		Details:  &metav1.StatusDetails{Name: name, Group: gvr.Group, Kind: gvr.Resource},
		Code:     http.StatusNotFound,
	}
	body, _ := json.Marshal(st)
	return &http.Response{
		Status: "404 Not Found", StatusCode: http.StatusNotFound, Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1,
		Header:        http.Header{"Content-Type": []string{"application/json"}, "Content-Length": []string{strconv.Itoa(len(body))}},
		Body:          io.NopCloser(strings.NewReader(string(body))),
		ContentLength: int64(len(body)),
		Request:       req,
	}
}
