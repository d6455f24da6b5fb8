package v1alpha1

import (
	corev1 "k8s.io/api/core/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// PostgresSpec is what a user asks of a PostgreSQL cluster. The translator
// (internal/kinds/postgres) maps it onto the values of charts/postgresql.
// +kubebuilder:validation:XValidation:rule="!has(self.restore) || !has(self.bootstrap) || !has(self.bootstrap.recovery)",message="spec.restore and spec.bootstrap.recovery both fill the new database: set one"
// +kubebuilder:validation:XValidation:rule="has(self.bootstrap) == has(oldSelf.bootstrap)",message="spec.bootstrap is fixed at creation: it cannot be added or removed later; make a new Postgres to recover"
// +kubebuilder:validation:XValidation:rule="!has(self.failover) || !has(self.failover.synchronous) || self.failover.synchronous == 0 || (has(self.replicas) && self.replicas >= 2)",message="failover.synchronous 1 needs replicas of at least 2: with no standby no commit could complete"
type PostgresSpec struct {
	// Version is the PostgreSQL major or major.minor version, e.g. "17" or "17.2".
	// +kubebuilder:validation:Pattern=`^[1-9][0-9]*(\.[0-9]+)?$`
	Version string `json:"version"`

	// ChartVersion is a semver constraint on the chart version, e.g. "~1.4"
	// (within the watch's own constraint). A major chart upgrade, or a change
	// of the PostgreSQL major version, also needs annotation
	// chartpilot.dev/allow-major-upgrade naming the target major.
	// +optional
	ChartVersion string `json:"chartVersion,omitempty"`

	// Replicas is 1 primary plus streaming replicas.
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=9
	// +kubebuilder:default=1
	// +optional
	Replicas *int32 `json:"replicas,omitempty"`
	// Failover runs chartpilot's instance manager in each pod: a standby
	// takes over when the primary is lost.
	// +optional
	Failover *PostgresFailover `json:"failover,omitempty"`

	// Storage of each pod's data volume.
	Storage PostgresStorage `json:"storage"`

	// Resources of the PostgreSQL container; memory and CPU limits drive auto-tuning.
	// +optional
	Resources corev1.ResourceRequirements `json:"resources,omitempty"`

	// Parameters are postgresql.conf settings (name: value as a string). A
	// parameter set here is never auto-tuned. Names and values are checked
	// when the chart renders (names as PostgreSQL settings, values without
	// control characters).
	// +optional
	// +kubebuilder:validation:MaxProperties=256
	Parameters map[string]string `json:"parameters,omitempty"`

	// Values are raw chart values, the lowest layer of this resource's values:
	// every typed field above wins over them.
	// +optional
	// +kubebuilder:pruning:PreserveUnknownFields
	// +kubebuilder:validation:Schemaless
	// +kubebuilder:validation:Type=object
	Values *apiextensionsv1.JSON `json:"values,omitempty"`

	// NodeSelector, Tolerations, Affinity and PriorityClassName place the pods.
	// +optional
	NodeSelector map[string]string `json:"nodeSelector,omitempty"`
	// +optional
	Tolerations []corev1.Toleration `json:"tolerations,omitempty"`
	// +optional
	Affinity *corev1.Affinity `json:"affinity,omitempty"`
	// +optional
	// +kubebuilder:validation:MaxLength=253
	// +kubebuilder:validation:Pattern=`^([a-z0-9]([-a-z0-9.]*[a-z0-9])?)?$`
	PriorityClassName string `json:"priorityClassName,omitempty"`

	// Metrics adds a postgres_exporter sidecar.
	// +optional
	Metrics bool `json:"metrics,omitempty"`

	// Monitoring turns the exporter on and, where the Prometheus Operator's
	// CRDs are installed (now or later), adds a ServiceMonitor and a
	// PrometheusRule with this database's alerts to the release.
	// +optional
	Monitoring *PostgresMonitoring `json:"monitoring,omitempty"`

	// Restore fills a new database from a backup once its release is
	// installed; the resource is Ready only after the restore completed.
	// It runs once: changing it later restores nothing.
	// +optional
	Restore *PostgresRestore `json:"restore,omitempty"`

	// Backup schedules backups of the database (it changes nothing in the
	// release).
	// +optional
	Backup *PostgresBackup `json:"backup,omitempty"`

	// Bootstrap is how the data begins (default: an empty cluster). Fixed
	// at creation.
	// +optional
	// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="spec.bootstrap is fixed at creation: make a new Postgres to recover again"
	Bootstrap *PostgresBootstrap `json:"bootstrap,omitempty"`
}

// PostgresRestore names the backup to restore: a completed Backup of the
// namespace, or a location in a store.
// +kubebuilder:validation:XValidation:rule="has(self.fromBackup) != has(self.fromStore)",message="set exactly one of fromBackup or fromStore"
type PostgresRestore struct {
	// FromBackup is the name of a completed Backup of this namespace.
	// +optional
	// +kubebuilder:validation:MinLength=1
	FromBackup string `json:"fromBackup,omitempty"`
	// FromStore is a backup's location in a store (a Backup's
	// status.location), e.g. of another cluster.
	// +optional
	FromStore *RestoreFromStore `json:"fromStore,omitempty"`
	// Encryption names the key of an encrypted backup: a Secret key
	// holding the age identity (AGE-SECRET-KEY-1…). Default: the one of
	// spec.backup.encryption.
	// +optional
	Encryption *BackupEncryption `json:"encryption,omitempty"`
}

// RestoreFromStore is a location in a store.
type RestoreFromStore struct {
	Store StoreRef `json:"store"`
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:Pattern=`^[^.][^\s]*$`
	Location string `json:"location"`
}

// PostgresRestoreStatus is what became of spec.restore.
type PostgresRestoreStatus struct {
	// Phase: Pending, Running, Completed or Failed.
	Phase string `json:"phase,omitempty"`
	// +optional
	Message string `json:"message,omitempty"`
	// +optional
	Job string `json:"job,omitempty"`
	// Location restored from, and the SHA-256 checked before restoring.
	// +optional
	Location string `json:"location,omitempty"`
	// +optional
	SHA256 string `json:"sha256,omitempty"`
	// +optional
	CompletedAt *metav1.Time `json:"completedAt,omitempty"`
}

// PostgresMonitoring is the monitoring of one database.
type PostgresMonitoring struct {
	// +optional
	Enabled bool `json:"enabled,omitempty"`
	// Labels added to the ServiceMonitor and PrometheusRule, for the
	// Prometheus selectors that pick them.
	// +optional
	// +kubebuilder:validation:MaxProperties=16
	Labels map[string]string `json:"labels,omitempty"`
}

// PostgresFailover is how the primary role moves between the pods.
type PostgresFailover struct {
	// Enabled: each pod's instance manager holds or follows the primary's
	// Lease (default: true with more than one replica).
	// +optional
	Enabled *bool `json:"enabled,omitempty"`
	// Synchronous standbys, 0 or 1: with 1, a commit is acknowledged once
	// a standby has it, and a failover loses no acknowledged commit (it
	// needs replicas of at least 2).
	// +optional
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=1
	Synchronous int32 `json:"synchronous,omitempty"`
	// MaxLagBytes: a standby further behind the lost primary than this
	// does not promote (0: no limit).
	// +optional
	// +kubebuilder:validation:Minimum=0
	MaxLagBytes int64 `json:"maxLagBytes,omitempty"`
}

// PostgresFailoverStatus is one failover: when, from which pod to which,
// and how far behind the lost primary the promoted standby was.
type PostgresFailoverStatus struct {
	At       metav1.Time `json:"at"`
	From     string      `json:"from"`
	To       string      `json:"to"`
	LagBytes int64       `json:"lagBytes"`
}

// PostgresStorage is the data volume of each pod.
// +kubebuilder:validation:XValidation:rule="!has(oldSelf.size) || quantity(self.size).compareTo(quantity(oldSelf.size)) >= 0",message="storage.size can grow but never shrink: set it to at least the current size"
// +kubebuilder:validation:XValidation:rule="!has(oldSelf.storageClass) || self.storageClass == oldSelf.storageClass",message="storage.storageClass cannot change: volumes are not moved between classes"
// +kubebuilder:validation:XValidation:rule="!has(self.autoExpand) || !self.autoExpand.enabled || (has(self.autoExpand.max) && quantity(self.autoExpand.max).compareTo(quantity(self.size)) >= 0)",message="storage.autoExpand.max is required when autoExpand is enabled, and must be at least storage.size: set the largest size the volumes may grow to"
type PostgresStorage struct {
	// Size of each data volume, e.g. 10Gi.
	// +kubebuilder:validation:Pattern=`^[0-9]+(\.[0-9]+)?(Ki|Mi|Gi|Ti|Pi|k|M|G|T|P)?$`
	// +kubebuilder:validation:XValidation:rule="isQuantity(self)",message="storage.size must be a quantity such as 10Gi"
	Size string `json:"size"`
	// StorageClass of the data volumes; empty uses the cluster's default.
	// +optional
	// +kubebuilder:validation:MaxLength=253
	// +kubebuilder:validation:Pattern=`^([a-z0-9]([-a-z0-9.]*[a-z0-9])?)?$`
	StorageClass string `json:"storageClass,omitempty"`
	// AutoExpand grows Size, a step at a time, when a volume fills up.
	// +optional
	AutoExpand *StorageAutoExpand `json:"autoExpand,omitempty"`
}

// PostgresEndpoints are the Services clients connect to.
type PostgresEndpoints struct {
	// ReadWrite is the primary's Service.
	ReadWrite string `json:"readWrite,omitempty"`
	// ReadOnly is the Service of every pod (replicas and primary).
	ReadOnly string `json:"readOnly,omitempty"`
	// Secret holds the superuser's username and password.
	Secret string `json:"secret,omitempty"`
	// Port is the port of both Services (the chart's service.port); absent
	// until the read-write Service exists.
	// +optional
	Port int32 `json:"port,omitempty"`
	// CASecret names the Secret whose ca.crt signed the server's
	// certificate. Every Job of chartpilot that connects verifies the server
	// against it (sslmode=verify-full, channel binding required). Absent
	// while the server takes no TLS (the chart's tls.enabled off) or before
	// its StatefulSet exists.
	// +optional
	CASecret string `json:"caSecret,omitempty"`
	// TLS says whether the server's StatefulSet, as last seen, mounts a
	// certificate (the chart's tls.enabled): false lets a Job connect
	// with no CA to verify the server against. Absent before the
	// StatefulSet is seen.
	// +optional
	TLS *bool `json:"tls,omitempty"`
}

// PostgresStatus is the shared release status plus what a PostgreSQL user needs.
type PostgresStatus struct {
	ReleaseStatus `json:",inline"`
	// Version is the PostgreSQL version deployed.
	// +optional
	Version string `json:"version,omitempty"`
	// ReadyReplicas counts the Ready pods of the StatefulSet.
	// +optional
	ReadyReplicas int32 `json:"readyReplicas,omitempty"`
	// Endpoints are the Services to connect to.
	// +optional
	Endpoints *PostgresEndpoints `json:"endpoints,omitempty"`
	// Tuning lists the postgresql.conf settings chartpilot derived from the resources.
	// +optional
	Tuning map[string]string `json:"tuning,omitempty"`
	// Backup reports the scheduled backups (spec.backup).
	// +optional
	Backup *PostgresBackupStatus `json:"backup,omitempty"`
	// Restore reports spec.restore.
	// +optional
	Restore *PostgresRestoreStatus `json:"restore,omitempty"`
	// Archiving is the primary's WAL archiving (spec.backup.walArchive,
	// with failover).
	// +optional
	Archiving *PostgresArchivingStatus `json:"archiving,omitempty"`
	// Recovery reports spec.bootstrap.recovery.
	// +optional
	Recovery *PostgresRecoveryStatus `json:"recovery,omitempty"`
	// Primary is the pod running the primary (with failover: the holder of
	// the cluster's Lease).
	// +optional
	Primary string `json:"primary,omitempty"`
	// LastFailover is the newest change of primary by failover.
	// +optional
	LastFailover *PostgresFailoverStatus `json:"lastFailover,omitempty"`
	// Storage is the volumes' fullness and automatic growth.
	// +optional
	Storage *StorageStatus `json:"storage,omitempty"`
	// DataVolume is the claim template the data is on, once a major
	// upgrade moved it (before that: "data").
	// +optional
	DataVolume *PostgresVolume `json:"dataVolume,omitempty"`
	// PreviousVolume is the data of the major before the last major
	// upgrade, kept until a person deletes its claims.
	// +optional
	PreviousVolume *PostgresVolume `json:"previousVolume,omitempty"`
	// MajorUpgrade is the newest PostgreSQL major upgrade carried out.
	// +optional
	MajorUpgrade *PostgresMajorUpgrade `json:"majorUpgrade,omitempty"`
}

// PostgresVolume is a claim template of the data and the PostgreSQL major
// whose data it holds.
type PostgresVolume struct {
	// Name is the claim template (claims are NAME-POSTGRES-ORDINAL).
	Name string `json:"name"`
	// Major is the PostgreSQL major the data is for.
	Major string `json:"major"`
	// Claims are the claims of that template when the data moved away.
	// +optional
	Claims []string `json:"claims,omitempty"`
}

// PostgresMajorUpgrade reports a PostgreSQL major upgrade: the data dumped
// from the old major's server and restored into a new volume by a Job,
// every table compared, before the release switches.
type PostgresMajorUpgrade struct {
	From string `json:"from"`
	To   string `json:"to"`
	// Phase is Running, Failed or Completed (the data is on the new volume).
	Phase string `json:"phase"`
	// Job carries the data path out.
	// +optional
	Job string `json:"job,omitempty"`
	// Step is the step that failed.
	// +optional
	Step string `json:"step,omitempty"`
	// Message says what happened.
	// +optional
	Message string `json:"message,omitempty"`
	// Tables and Rows were compared on both servers.
	// +optional
	Tables int `json:"tables,omitempty"`
	// +optional
	Rows int64 `json:"rows,omitempty"`
}

// Postgres is a PostgreSQL cluster managed as a Helm release of charts/postgresql.
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:shortName=pg;pgs,categories=chartpilot
// +kubebuilder:printcolumn:name="Ready",type=string,JSONPath=`.status.conditions[?(@.type=="Ready")].status`
// +kubebuilder:printcolumn:name="Version",type=string,JSONPath=`.spec.version`
// +kubebuilder:printcolumn:name="Replicas",type=integer,JSONPath=`.spec.replicas`
// +kubebuilder:printcolumn:name="Chart",type=string,JSONPath=`.status.release.chartVersion`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type Postgres struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec   PostgresSpec   `json:"spec"`
	Status PostgresStatus `json:"status,omitempty"`
}

// PostgresList is a list of Postgres.
// +kubebuilder:object:root=true
type PostgresList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []Postgres `json:"items"`
}

func init() {
	knownTypes = append(knownTypes, &Postgres{}, &PostgresList{})
}
