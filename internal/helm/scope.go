package helm

import (
	"fmt"
	"io"
	"slices"

	"helm.sh/helm/v3/pkg/kube"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// Scope is where the objects of a release may be: its own namespace, and
// the cluster-scoped kinds listed by name. Every manifest Helm turns into
// API objects (the chart's, its hooks, the stored manifest an upgrade,
// rollback or uninstall starts from) is checked against it before any API
// call, so neither a chart nor an edited release record can reach another
// namespace or the cluster.
type Scope struct {
	// Namespace is the release's namespace ("" checks nothing).
	Namespace string
	// ClusterKinds are the cluster-scoped kinds allowed, as "Kind" (core
	// group) or "Kind.group".
	ClusterKinds []string
}

// ScopeError is an object outside a release's Scope.
type ScopeError struct {
	Kind, Name, Namespace string
	// ClusterScoped: the kind is cluster-scoped (not listed in the scope).
	ClusterScoped bool
	// KindName is the kind as allowClusterScoped would list it.
	KindName string
	scope    Scope
}

func (e *ScopeError) Error() string {
	if e.ClusterScoped {
		return fmt.Sprintf("%s %s is cluster-scoped and the watch does not allow it: nothing was applied; list %q under allowClusterScoped in watches.yaml if this chart may create it", e.Kind, e.Name, e.KindName)
	}
	return fmt.Sprintf("%s %s is in namespace %s: a release may only hold objects of its own namespace %s; nothing was applied", e.Kind, e.Name, e.Namespace, e.scope.Namespace)
}

// kindName is gvk as allowClusterScoped lists it.
func kindName(gvk schema.GroupVersionKind) string {
	if gvk.Group == "" {
		return gvk.Kind
	}
	return gvk.Kind + "." + gvk.Group
}

// Check returns a *ScopeError when an object of kind gvk, named name, in
// namespace (as it will be created), is outside the scope.
func (s Scope) Check(gvk schema.GroupVersionKind, name, namespace string, namespaced bool) error {
	if s.Namespace == "" {
		return nil
	}
	if !namespaced {
		if slices.Contains(s.ClusterKinds, kindName(gvk)) {
			return nil
		}
		return &ScopeError{Kind: gvk.Kind, Name: name, ClusterScoped: true, KindName: kindName(gvk), scope: s}
	}
	if namespace != "" && namespace != s.Namespace {
		return &ScopeError{Kind: gvk.Kind, Name: name, Namespace: namespace, KindName: kindName(gvk), scope: s}
	}
	return nil
}

// guardedKube is Helm's Kubernetes client with every built manifest checked
// against a Scope.
type guardedKube struct {
	kube.Interface
	scope Scope
}

// IsReachable is left to the requests themselves: Helm's own check turns any
// error of its discovery call, a refused impersonation included, into
// "Kubernetes cluster unreachable", while the action's first request says
// what is wrong (forbidden, naming the user, or a connection error).
func (g guardedKube) IsReachable() error { return nil }

// Build builds the objects of a manifest and refuses them all if one is
// outside the scope.
func (g guardedKube) Build(r io.Reader, validate bool) (kube.ResourceList, error) {
	list, err := g.Interface.Build(r, validate)
	if err != nil {
		return nil, err
	}
	for _, info := range list {
		if info.Mapping == nil {
			continue
		}
		namespaced := info.Mapping.Scope.Name() == meta.RESTScopeNameNamespace
		if err := g.scope.Check(info.Mapping.GroupVersionKind, info.Name, info.Namespace, namespaced); err != nil {
			return nil, err
		}
	}
	return list, nil
}
