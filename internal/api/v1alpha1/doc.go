// Package v1alpha1 holds chartpilot's API types (group chartpilot.dev): the
// status every managed kind shares, and the typed kinds.
// +kubebuilder:object:generate=true
// +groupName=chartpilot.dev
package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// GroupVersion is chartpilot.dev/v1alpha1.
var GroupVersion = schema.GroupVersion{Group: "chartpilot.dev", Version: "v1alpha1"}

// SchemeBuilder registers the typed kinds of this package.
var SchemeBuilder = runtime.NewSchemeBuilder(addKnownTypes)

// AddToScheme adds the typed kinds to a scheme.
var AddToScheme = SchemeBuilder.AddToScheme

// knownTypes are the typed kinds of this group version (none yet: every
// kind so far is passthrough).
var knownTypes []runtime.Object

func addKnownTypes(s *runtime.Scheme) error {
	s.AddKnownTypes(GroupVersion, knownTypes...)
	metav1.AddToGroupVersion(s, GroupVersion)
	return nil
}
