package helm

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"strconv"
	"strings"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// ObjectCache looks up an object in an informer cache; ok is false when
// the cache does not hold it (which does not mean it does not exist).
type ObjectCache func(req *http.Request, gvk schema.GroupVersionKind, namespace, name string) (obj *unstructured.Unstructured, ok bool)

// UseObjectCache answers Helm's reads of single objects (the current state
// it merges an upgrade's changes into) from cache when it holds them;
// anything else, and an object the cache lacks, goes to the API server.
func (c *Client) UseObjectCache(oc ObjectCache) { c.objectCache = oc }

// cachedGets is a transport that serves GETs of single objects from the
// object cache.
type cachedGets struct {
	next   http.RoundTripper
	client *Client
	// first is set for a first install that skips existence checks.
	first *firstInstall
}

func (t *cachedGets) RoundTrip(req *http.Request) (*http.Response, error) {
	if t.first != nil && req.Method == http.MethodPost {
		return t.create(req)
	}
	oc := t.client.root().objectCache
	if oc == nil || req.Method != http.MethodGet || req.URL.RawQuery != "" {
		return t.next.RoundTrip(req)
	}
	gvr, namespace, name, ok := objectPath(req.URL.Path)
	if !ok {
		return t.next.RoundTrip(req)
	}
	gvk, err := t.client.mapper.KindFor(gvr)
	if err != nil {
		return t.next.RoundTrip(req)
	}
	obj, ok := oc(req, gvk, namespace, name)
	if !ok {
		if t.first != nil && t.first.assumeAbsent(gvk, namespace, name) {
			return notFound(req, gvr, name), nil
		}
		return t.next.RoundTrip(req)
	}
	body, err := json.Marshal(obj.Object)
	if err != nil {
		return t.next.RoundTrip(req)
	}
	return &http.Response{
		Status: "200 OK", StatusCode: http.StatusOK, Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1,
		Header:        http.Header{"Content-Type": []string{"application/json"}, "Content-Length": []string{strconv.Itoa(len(body))}},
		Body:          io.NopCloser(bytes.NewReader(body)),
		ContentLength: int64(len(body)),
		Request:       req,
	}, nil
}

// create sends a create of a first install and notes its answer.
func (t *cachedGets) create(req *http.Request) (*http.Response, error) {
	resp, err := t.next.RoundTrip(req)
	if err != nil {
		return resp, err
	}
	if gvr, namespace, ok := collectionPath(req.URL.Path); ok {
		t.first.sawCreate(gvr, namespace, resp)
	}
	return resp, nil
}

// objectPath reads the path of one object: /api/v1[/namespaces/NS]/RES/NAME
// or /apis/GROUP/VERSION[/namespaces/NS]/RES/NAME (no subresource).
func objectPath(path string) (gvr schema.GroupVersionResource, namespace, name string, ok bool) {
	gvr, rest, ok := apiPath(path)
	switch {
	case !ok:
	case len(rest) == 4 && rest[0] == "namespaces":
		namespace, gvr.Resource, name = rest[1], rest[2], rest[3]
	case len(rest) == 2:
		gvr.Resource, name = rest[0], rest[1]
	}
	return gvr, namespace, name, name != "" && gvr.Resource != ""
}

// collectionPath reads the path of a collection, which a create is sent to:
// /api/v1[/namespaces/NS]/RES or /apis/GROUP/VERSION[/namespaces/NS]/RES.
func collectionPath(path string) (gvr schema.GroupVersionResource, namespace string, ok bool) {
	gvr, rest, ok := apiPath(path)
	switch {
	case !ok:
	case len(rest) == 3 && rest[0] == "namespaces":
		namespace, gvr.Resource = rest[1], rest[2]
	case len(rest) == 1:
		gvr.Resource = rest[0]
	}
	return gvr, namespace, gvr.Resource != ""
}

// apiPath splits an API path into its group and version and the rest.
func apiPath(path string) (gvr schema.GroupVersionResource, rest []string, ok bool) {
	parts := strings.Split(strings.Trim(path, "/"), "/")
	switch {
	case len(parts) >= 2 && parts[0] == "api":
		gvr.Version, rest = parts[1], parts[2:]
	case len(parts) >= 3 && parts[0] == "apis":
		gvr.Group, gvr.Version, rest = parts[1], parts[2], parts[3:]
	default:
		return gvr, nil, false
	}
	return gvr, rest, true
}
