package kubeapis

import "k8s.io/apimachinery/pkg/runtime/schema"

// gone are the removed API versions whose Go types k8s.io/api no longer
// has, so that no lifecycle method can say when they went. Source: the
// Kubernetes deprecated API migration guide
// (kubernetes.io/docs/reference/using-api/deprecation-guide). A test
// checks that each is indeed gone from k8s.io/api: a row whose type is
// still there is read from the type instead. The guide gives the minor
// that stopped serving each; the one that deprecated it is left unset.
var gone = map[schema.GroupVersionKind]Lifecycle{}

func init() {
	for _, l := range []Lifecycle{
		{Group: "autoscaling", Version: "v2beta1", Kind: "HorizontalPodAutoscaler", Removed: 25,
			Replacement: schema.GroupVersionKind{Group: "autoscaling", Version: "v2", Kind: "HorizontalPodAutoscaler"}},
		{Group: "autoscaling", Version: "v2beta2", Kind: "HorizontalPodAutoscaler", Removed: 26,
			Replacement: schema.GroupVersionKind{Group: "autoscaling", Version: "v2", Kind: "HorizontalPodAutoscaler"}},
		{Group: "policy", Version: "v1beta1", Kind: "PodSecurityPolicy", Removed: 25},
		{Group: "extensions", Version: "v1beta1", Kind: "PodSecurityPolicy", Removed: 16},
	} {
		l.Source = "deprecation guide"
		gone[schema.GroupVersionKind{Group: l.Group, Version: l.Version, Kind: l.Kind}] = l
	}
}
