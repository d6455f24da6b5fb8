package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// BackupStoreSpec is where backups go: exactly one of s3, gcs, azure or volume.
// +kubebuilder:validation:XValidation:rule="(has(self.s3) ? 1 : 0) + (has(self.gcs) ? 1 : 0) + (has(self.azure) ? 1 : 0) + (has(self.volume) ? 1 : 0) == 1",message="set exactly one of s3, gcs, azure or volume"
// +kubebuilder:validation:XValidation:rule="!has(self.gcs) || !has(self.gcs.credentialsSecretRef) || !has(self.gcs.credentialsSecretRef.__namespace__)",message="a BackupStore reads Secrets of its own namespace only: remove the namespace of gcs.credentialsSecretRef"
// +kubebuilder:validation:XValidation:rule="!has(self.s3) || (!has(self.s3.credentialsSecretRef.__namespace__) && (!has(self.s3.caSecretRef) || !has(self.s3.caSecretRef.__namespace__)))",message="a BackupStore reads Secrets of its own namespace only: remove the namespace of s3.credentialsSecretRef and s3.caSecretRef"
// +kubebuilder:validation:XValidation:rule="!has(self.azure) || !has(self.azure.credentialsSecretRef.__namespace__)",message="a BackupStore reads Secrets of its own namespace only: remove the namespace of azure.credentialsSecretRef"
type BackupStoreSpec struct {
	// S3 is a bucket of S3 or of an S3-compatible server.
	// +optional
	S3 *S3Store `json:"s3,omitempty"`
	// GCS is a bucket of Google Cloud Storage.
	// +optional
	GCS *GCSStore `json:"gcs,omitempty"`
	// Azure is a container of Azure Blob Storage.
	// +optional
	Azure *AzureStore `json:"azure,omitempty"`
	// Volume is a PersistentVolumeClaim of the backups' namespace, mounted
	// by the backup Jobs.
	// +optional
	Volume *VolumeStore `json:"volume,omitempty"`
}

// S3Store is an S3 bucket.
type S3Store struct {
	// Endpoint is the server's URL; empty for AWS. For a namespaced
	// BackupStore it must start with one of the operator's
	// --backup-store-endpoints.
	// +optional
	// +kubebuilder:validation:Pattern=`^https?://[^\s]+$`
	Endpoint string `json:"endpoint,omitempty"`
	// Bucket name.
	// +kubebuilder:validation:MinLength=3
	// +kubebuilder:validation:MaxLength=63
	Bucket string `json:"bucket"`
	// Prefix is prepended to every key.
	// +optional
	// +kubebuilder:validation:Pattern=`^[^.][^\s]*$`
	Prefix string `json:"prefix,omitempty"`
	// Region; default us-east-1.
	// +optional
	Region string `json:"region,omitempty"`
	// ForcePathStyle addresses the bucket in the path (most S3-compatible servers).
	// +optional
	ForcePathStyle bool `json:"forcePathStyle,omitempty"`
	// CredentialsSecretRef names a Secret with keys accessKeyID and
	// secretAccessKey: in the store's namespace for a BackupStore; a
	// ClusterBackupStore names the namespace.
	CredentialsSecretRef SecretRef `json:"credentialsSecretRef"`
	// CASecretRef names a key of a Secret holding the PEM of the CAs the
	// endpoint's certificate is checked against.
	// +optional
	CASecretRef *SecretKeyRef `json:"caSecretRef,omitempty"`
}

// SecretRef names a Secret.
type SecretRef struct {
	// +kubebuilder:validation:MinLength=1
	Name string `json:"name"`
	// Namespace: only for a ClusterBackupStore, which must set it.
	// +optional
	Namespace string `json:"namespace,omitempty"`
}

// SecretKeyRef names a key of a Secret.
type SecretKeyRef struct {
	// +kubebuilder:validation:MinLength=1
	Name string `json:"name"`
	// +kubebuilder:validation:MinLength=1
	Key string `json:"key"`
	// Namespace: only for a ClusterBackupStore, which must set it.
	// +optional
	Namespace string `json:"namespace,omitempty"`
}

// AzureStore is a container of Azure Blob Storage.
type AzureStore struct {
	// Endpoint is the blob service's URL; empty:
	// https://<accountName>.blob.core.windows.net. For a namespaced
	// BackupStore it must start with one of the operator's
	// --backup-store-endpoints.
	// +optional
	// +kubebuilder:validation:Pattern=`^https?://[^\s]+$`
	Endpoint string `json:"endpoint,omitempty"`
	// +kubebuilder:validation:Pattern=`^[a-z0-9]{3,24}$`
	AccountName string `json:"accountName"`
	// +kubebuilder:validation:Pattern=`^[a-z0-9]([a-z0-9-]{1,61}[a-z0-9])$`
	Container string `json:"container"`
	// Prefix is prepended to every key.
	// +optional
	// +kubebuilder:validation:Pattern=`^[^.][^\s]*$`
	Prefix string `json:"prefix,omitempty"`
	// CredentialsSecretRef names a Secret with key accountKey (the
	// storage account's shared key): in the store's namespace for a
	// BackupStore; a ClusterBackupStore names the namespace.
	CredentialsSecretRef SecretRef `json:"credentialsSecretRef"`
}

// GCSStore is a bucket of Google Cloud Storage.
// +kubebuilder:validation:XValidation:rule="has(self.credentialsSecretRef) || has(self.endpoint)",message="set credentialsSecretRef (a Secret with key serviceAccountKey); only an emulator's endpoint goes without"
type GCSStore struct {
	// Endpoint is the JSON API's URL; empty: Google's. For a namespaced
	// BackupStore it must start with one of the operator's
	// --backup-store-endpoints.
	// +optional
	// +kubebuilder:validation:Pattern=`^https?://[^\s]+$`
	Endpoint string `json:"endpoint,omitempty"`
	// +kubebuilder:validation:Pattern=`^[a-z0-9][a-z0-9._-]{1,220}[a-z0-9]$`
	Bucket string `json:"bucket"`
	// Prefix is prepended to every key.
	// +optional
	// +kubebuilder:validation:Pattern=`^[^.][^\s]*$`
	Prefix string `json:"prefix,omitempty"`
	// CredentialsSecretRef names a Secret with key serviceAccountKey (a
	// service account's JSON key): in the store's namespace for a
	// BackupStore; a ClusterBackupStore names the namespace. Only an
	// emulator's endpoint goes without.
	// +optional
	CredentialsSecretRef *SecretRef `json:"credentialsSecretRef,omitempty"`
}

// VolumeStore is a directory of a PersistentVolumeClaim.
type VolumeStore struct {
	// +kubebuilder:validation:MinLength=1
	ClaimName string `json:"claimName"`
	// Path inside the volume.
	// +optional
	// +kubebuilder:validation:Pattern=`^[^.][^\s]*$`
	Path string `json:"path,omitempty"`
}

// BackupStoreStatus reports the last check of the store.
type BackupStoreStatus struct {
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`
	// Conditions: Ready is True when an object was written, read back and
	// deleted (S3), or the claim is bound (volume).
	// +optional
	// +listType=map
	// +listMapKey=type
	Conditions []metav1.Condition `json:"conditions,omitempty"`
	// LastChecked is when the store was last checked.
	// +optional
	LastChecked *metav1.Time `json:"lastChecked,omitempty"`
}

// BackupStore is a destination for the backups of its namespace.
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:categories=chartpilot
// +kubebuilder:printcolumn:name="Ready",type=string,JSONPath=`.status.conditions[?(@.type=="Ready")].status`
// +kubebuilder:printcolumn:name="Reason",type=string,JSONPath=`.status.conditions[?(@.type=="Ready")].reason`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type BackupStore struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec   BackupStoreSpec   `json:"spec"`
	Status BackupStoreStatus `json:"status,omitempty"`
}

// BackupStoreList is a list of BackupStore.
// +kubebuilder:object:root=true
type BackupStoreList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []BackupStore `json:"items"`
}

// ClusterBackupStoreSpec is a BackupStoreSpec an admin offers to the
// namespaces NamespaceSelector matches.
// +kubebuilder:validation:XValidation:rule="(has(self.s3) ? 1 : 0) + (has(self.gcs) ? 1 : 0) + (has(self.azure) ? 1 : 0) + (has(self.volume) ? 1 : 0) == 1",message="set exactly one of s3, gcs, azure or volume"
// +kubebuilder:validation:XValidation:rule="!has(self.gcs) || !has(self.gcs.credentialsSecretRef) || has(self.gcs.credentialsSecretRef.__namespace__)",message="a ClusterBackupStore names the namespace of its Secrets: set gcs.credentialsSecretRef.namespace"
// +kubebuilder:validation:XValidation:rule="!has(self.s3) || (has(self.s3.credentialsSecretRef.__namespace__) && (!has(self.s3.caSecretRef) || has(self.s3.caSecretRef.__namespace__)))",message="a ClusterBackupStore names the namespace of its Secrets: set s3.credentialsSecretRef.namespace (and s3.caSecretRef.namespace)"
// +kubebuilder:validation:XValidation:rule="!has(self.azure) || has(self.azure.credentialsSecretRef.__namespace__)",message="a ClusterBackupStore names the namespace of its Secrets: set azure.credentialsSecretRef.namespace"
type ClusterBackupStoreSpec struct {
	// +optional
	S3 *S3Store `json:"s3,omitempty"`
	// +optional
	GCS *GCSStore `json:"gcs,omitempty"`
	// +optional
	Azure *AzureStore `json:"azure,omitempty"`
	// +optional
	Volume *VolumeStore `json:"volume,omitempty"`
	// NamespaceSelector chooses the namespaces whose backups may use the
	// store; empty selects none.
	// +optional
	NamespaceSelector *metav1.LabelSelector `json:"namespaceSelector,omitempty"`
}

// ClusterBackupStore is a backup destination an admin offers to
// namespaces.
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:scope=Cluster,categories=chartpilot
// +kubebuilder:printcolumn:name="Ready",type=string,JSONPath=`.status.conditions[?(@.type=="Ready")].status`
// +kubebuilder:printcolumn:name="Reason",type=string,JSONPath=`.status.conditions[?(@.type=="Ready")].reason`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type ClusterBackupStore struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec   ClusterBackupStoreSpec `json:"spec"`
	Status BackupStoreStatus      `json:"status,omitempty"`
}

// ClusterBackupStoreList is a list of ClusterBackupStore.
// +kubebuilder:object:root=true
type ClusterBackupStoreList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []ClusterBackupStore `json:"items"`
}

func init() {
	knownTypes = append(knownTypes, &BackupStore{}, &BackupStoreList{}, &ClusterBackupStore{}, &ClusterBackupStoreList{})
}
