package v1alpha1

import (
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// TenantSpec says which namespaces belong to a tenant, what values their
// releases get, and what limits their resources must keep.
type TenantSpec struct {
	// Namespaces are namespace names of the tenant.
	// +optional
	Namespaces []string `json:"namespaces,omitempty"`
	// NamespaceSelector adds the namespaces whose labels match.
	// +optional
	NamespaceSelector *metav1.LabelSelector `json:"namespaceSelector,omitempty"`
	// Values are chart values per kind, layered above the resource's own
	// values and below watches.yaml overrideValues.
	// +optional
	Values []TenantValues `json:"values,omitempty"`
	// Limits every resource in the tenant's namespaces must keep.
	// +optional
	Limits TenantLimits `json:"limits,omitempty"`
	// ServiceAccountName: every Helm action for resources in the tenant's
	// namespaces runs as this ServiceAccount of the resource's namespace, so a
	// chart can create only what the tenant's RBAC allows.
	// +optional
	ServiceAccountName string `json:"serviceAccountName,omitempty"`
}

// TenantValues are values for one kind.
type TenantValues struct {
	// Kind is "Postgres" or "group/Kind", e.g. "chartpilot.dev/Postgres".
	// +kubebuilder:validation:MinLength=1
	Kind string `json:"kind"`
	// Values are chart values.
	// +kubebuilder:pruning:PreserveUnknownFields
	// +kubebuilder:validation:Schemaless
	// +kubebuilder:validation:Type=object
	Values apiextensionsv1.JSON `json:"values"`
}

// TenantLimits bound the resources of a tenant.
type TenantLimits struct {
	// MaxReplicas per resource.
	// +optional
	// +kubebuilder:validation:Minimum=1
	MaxReplicas *int64 `json:"maxReplicas,omitempty"`
	// AllowedStorageClasses; empty allows any.
	// +optional
	AllowedStorageClasses []string `json:"allowedStorageClasses,omitempty"`
	// DefaultStorageClass is set on resources that name none.
	// +optional
	DefaultStorageClass string `json:"defaultStorageClass,omitempty"`
	// MaxStorage per resource (per pod volume times replicas).
	// +optional
	MaxStorage *resource.Quantity `json:"maxStorage,omitempty"`
	// MaxTotalStorage across all the tenant's resources.
	// +optional
	MaxTotalStorage *resource.Quantity `json:"maxTotalStorage,omitempty"`
	// AllowedVersions is a semver constraint on the software version a
	// resource asks for (Postgres spec.version) or, for kinds without one,
	// on the chart version.
	// +optional
	AllowedVersions string `json:"allowedVersions,omitempty"`
	// MaxCPU and MaxMemory per pod (container limits, else requests).
	// +optional
	MaxCPU *resource.Quantity `json:"maxCPU,omitempty"`
	// +optional
	MaxMemory *resource.Quantity `json:"maxMemory,omitempty"`
	// AllowedPriorityClasses are the priorityClassName values a resource
	// may ask for; empty allows any.
	// +optional
	AllowedPriorityClasses []string `json:"allowedPriorityClasses,omitempty"`
	// AllowedTolerationKeys are the taint keys a resource's tolerations may
	// name; "*" admits a toleration without a key, which tolerates every
	// taint. Empty allows any.
	// +optional
	AllowedTolerationKeys []string `json:"allowedTolerationKeys,omitempty"`
	// DenyNodePlacement refuses a resource's own nodeSelector and affinity:
	// where the tenant's pods run is the admin's to say (the Tenant's values).
	// +optional
	DenyNodePlacement bool `json:"denyNodePlacement,omitempty"`
}

// TenantStatus reports what the tenant covers.
type TenantStatus struct {
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`
	// Conditions: Ready is False when the tenant overlaps another.
	// +optional
	// +listType=map
	// +listMapKey=type
	Conditions []metav1.Condition `json:"conditions,omitempty"`
	// Namespaces matched.
	// +optional
	Namespaces []string `json:"namespaces,omitempty"`
	// Resources counts the managed resources in those namespaces.
	// +optional
	Resources int `json:"resources,omitempty"`
	// StorageUsed sums storage asked by those resources.
	// +optional
	StorageUsed string `json:"storageUsed,omitempty"`
	// Violations lists resources that break a limit (first 20).
	// +optional
	Violations []string `json:"violations,omitempty"`
}

// Tenant groups namespaces under shared values and limits.
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:scope=Cluster,categories=chartpilot
// +kubebuilder:printcolumn:name="Ready",type=string,JSONPath=`.status.conditions[?(@.type=="Ready")].status`
// +kubebuilder:printcolumn:name="Namespaces",type=string,JSONPath=`.status.namespaces`
// +kubebuilder:printcolumn:name="Resources",type=integer,JSONPath=`.status.resources`
// +kubebuilder:printcolumn:name="Storage",type=string,JSONPath=`.status.storageUsed`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type Tenant struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec   TenantSpec   `json:"spec,omitempty"`
	Status TenantStatus `json:"status,omitempty"`
}

// TenantList is a list of Tenant.
// +kubebuilder:object:root=true
type TenantList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []Tenant `json:"items"`
}

func init() {
	knownTypes = append(knownTypes, &Tenant{}, &TenantList{})
}
