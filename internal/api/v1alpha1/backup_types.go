package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Phases of a Backup.
const (
	BackupPending   = "Pending"
	BackupRunning   = "Running"
	BackupCompleted = "Completed"
	BackupFailed    = "Failed"
)

// Methods of a Backup.
const (
	// BackupLogical is a full logical backup: the roles as rows, every
	// database with pg_dump (a passthrough kind: its backup block's
	// command).
	BackupLogical = "logical"
	// BackupPhysical is a base backup of a Postgres (pg_basebackup) into
	// its WAL archive, from which a recovery to a point starts.
	BackupPhysical = "physical"
)

// BackupSpec says what to back up and where to. It cannot change once the
// Backup exists: a new backup is a new Backup.
// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="a Backup's spec cannot change: create a new Backup"
type BackupSpec struct {
	// Target is the resource backed up, in the Backup's namespace.
	Target BackupTarget `json:"target"`
	// Store is where the backup goes. A physical backup goes to the
	// store of the Postgres's WAL archive (its spec.backup.store).
	Store StoreRef `json:"store"`
	// Method: logical (the default; restored by spec.restore) or
	// physical (a Postgres with spec.backup.walArchive only: a base
	// backup into its archive, which a recovery to a point starts from).
	// +optional
	// +kubebuilder:default=logical
	// +kubebuilder:validation:Enum=logical;physical
	Method string `json:"method,omitempty"`
}

// MethodOf is b's method (logical when unset).
func (b *Backup) MethodOf() string {
	if b.Spec.Method == "" {
		return BackupLogical
	}
	return b.Spec.Method
}

// BackupTarget names a resource of the Backup's namespace.
type BackupTarget struct {
	// Kind of the resource: Postgres, or a kind whose watches.yaml entry
	// has a backup block (Redis in the shipped one).
	// +kubebuilder:validation:Pattern=`^[A-Z][A-Za-z0-9]{0,62}$`
	Kind string `json:"kind"`
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=53
	Name string `json:"name"`
}

// StoreRef names a BackupStore of the Backup's namespace, or a
// ClusterBackupStore whose namespaceSelector selects that namespace.
type StoreRef struct {
	// Kind: BackupStore (default) or ClusterBackupStore.
	// +optional
	// +kubebuilder:default=BackupStore
	// +kubebuilder:validation:Enum=BackupStore;ClusterBackupStore
	Kind string `json:"kind,omitempty"`
	// +kubebuilder:validation:MinLength=1
	Name string `json:"name"`
}

// BackupStatus is what became of the backup.
type BackupStatus struct {
	// Phase: Pending (waiting to start: its store, its target, or another
	// backup of the same target), Running (its Job runs), Completed or
	// Failed (final).
	// +optional
	Phase string `json:"phase,omitempty"`
	// Message says why the backup waits or failed, and what to do.
	// +optional
	Message string `json:"message,omitempty"`
	// Job is the name of the Job that runs the backup.
	// +optional
	Job string `json:"job,omitempty"`
	// Location is the key prefix of the backup in the store: data and
	// manifest.json below it.
	// +optional
	Location string `json:"location,omitempty"`
	// +optional
	StartedAt *metav1.Time `json:"startedAt,omitempty"`
	// +optional
	CompletedAt *metav1.Time `json:"completedAt,omitempty"`
	// Size of the stored data in bytes (compressed, encrypted).
	// +optional
	Size int64 `json:"size,omitempty"`
	// SHA256 of the stored data, checked before any restore.
	// +optional
	SHA256 string `json:"sha256,omitempty"`
	// DatabaseVersion and ChartVersion of the target when it was backed up.
	// +optional
	DatabaseVersion string `json:"databaseVersion,omitempty"`
	// +optional
	ChartVersion string `json:"chartVersion,omitempty"`
}

// Backup is one backup of a resource to a store. Deleting it deletes its
// Job, never the data in the store (retention does that).
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:categories=chartpilot
// +kubebuilder:printcolumn:name="Target",type=string,JSONPath=`.spec.target.name`
// +kubebuilder:printcolumn:name="Store",type=string,JSONPath=`.spec.store.name`
// +kubebuilder:printcolumn:name="Phase",type=string,JSONPath=`.status.phase`
// +kubebuilder:printcolumn:name="Size",type=integer,JSONPath=`.status.size`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type Backup struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec   BackupSpec   `json:"spec"`
	Status BackupStatus `json:"status,omitempty"`
}

// BackupList is a list of Backup.
// +kubebuilder:object:root=true
type BackupList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []Backup `json:"items"`
}

func init() {
	knownTypes = append(knownTypes, &Backup{}, &BackupList{})
}
