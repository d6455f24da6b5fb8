package helm

import "testing"

func TestObjectPath(t *testing.T) {
	for path, want := range map[string]string{
		"/api/v1/namespaces/ns/configmaps/web":               "/v1/configmaps ns/web",
		"/apis/apps/v1/namespaces/ns/deployments/web":        "apps/v1/deployments ns/web",
		"/api/v1/namespaces/web":                             "/v1/namespaces /web",
		"/apis/rbac.authorization.k8s.io/v1/clusterroles/cr": "rbac.authorization.k8s.io/v1/clusterroles /cr",
		"/apis/apps/v1/namespaces/ns/deployments/web/scale":  "",
		"/api/v1/namespaces/ns/configmaps":                   "",
		"/apis/apps/v1/namespaces/ns/deployments":            "",
		"/version": "",
	} {
		gvr, ns, name, ok := objectPath(path)
		got := ""
		if ok {
			got = gvr.Group + "/" + gvr.Version + "/" + gvr.Resource + " " + ns + "/" + name
		}
		if got != want {
			t.Errorf("%s: %q, want %q", path, got, want)
		}
	}
}

func TestCollectionPath(t *testing.T) {
	for path, want := range map[string]string{
		"/api/v1/namespaces/ns/configmaps":                "/v1/configmaps ns",
		"/apis/apps/v1/namespaces/ns/deployments":         "apps/v1/deployments ns",
		"/apis/rbac.authorization.k8s.io/v1/clusterroles": "rbac.authorization.k8s.io/v1/clusterroles ",
		"/api/v1/namespaces/ns/configmaps/web":            "",
		"/apis/apps/v1/namespaces/ns":                     "",
		"/version":                                        "",
	} {
		gvr, ns, ok := collectionPath(path)
		got := ""
		if ok {
			got = gvr.Group + "/" + gvr.Version + "/" + gvr.Resource + " " + ns
		}
		if got != want {
			t.Errorf("%s: %q, want %q", path, got, want)
		}
	}
}
