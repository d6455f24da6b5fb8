// Package v1alpha1 holds chartpilot's API types (group chartpilot.dev): the
// status every managed kind shares, and the typed kinds.
// +kubebuilder:object:generate=true
// +groupName=chartpilot.dev
package v1alpha1

import (
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/controller-runtime/pkg/scheme"
)

// GroupVersion is chartpilot.dev/v1alpha1.
var GroupVersion = schema.GroupVersion{Group: "chartpilot.dev", Version: "v1alpha1"}

// SchemeBuilder registers the typed kinds of this package.
var SchemeBuilder = &scheme.Builder{GroupVersion: GroupVersion}

// AddToScheme adds the typed kinds to a scheme.
var AddToScheme = SchemeBuilder.AddToScheme
