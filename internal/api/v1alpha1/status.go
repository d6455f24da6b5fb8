package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Condition types of a managed custom resource. Ready summarises the others.
const (
	// ConditionReady is True when the release is deployed from the current
	// inputs, nothing drifted and no input is stalled.
	ConditionReady = "Ready"
	// ConditionReleased is True when the release's last action succeeded.
	ConditionReleased = "Released"
	// ConditionReconciling is True while chartpilot is acting or waiting to act.
	ConditionReconciling = "Reconciling"
	// ConditionStalled is True when input must change before chartpilot can act.
	ConditionStalled = "Stalled"
	// ConditionDrifted is True when objects of the release differ from it.
	ConditionDrifted = "Drifted"
	// ConditionUpgradeBlocked is True when policy holds the release below the
	// version its constraints select (a major upgrade not opted in to, a
	// refused downgrade); the message says how to proceed.
	ConditionUpgradeBlocked = "UpgradeBlocked"
	// ConditionSourceAvailable is False when the chart's repository or
	// registry cannot be read; releases stay on what they have.
	ConditionSourceAvailable = "SourceAvailable"
	// ConditionWorkloadsAvailable is False when workloads of a release that
	// was seen healthy stop being available (named in the message), and
	// True again once they are; absent until that first happens.
	ConditionWorkloadsAvailable = "WorkloadsAvailable"
	// ConditionLastBackupSucceeded says how the newest finished backup of
	// a resource with scheduled backups ended (Unknown before the first).
	ConditionLastBackupSucceeded = "LastBackupSucceeded"
	// ConditionMonitoringReady says whether the monitoring asked for
	// (Postgres spec.monitoring) is in place: False while the Prometheus
	// Operator's CRDs are not installed. It never makes a resource not Ready.
	ConditionMonitoringReady = "MonitoringReady"
	// ConditionRestored is False while spec.restore has not completed; it
	// keeps the resource not Ready until it has.
	ConditionRestored = "Restored"
	// ConditionContinuousArchiving is a Postgres's WAL archiving, as its
	// primary reports it: True while every file closed is archived, False
	// (ArchiveFailing, ArchiveBehind) when not; absent when it does not
	// archive.
	ConditionContinuousArchiving = "ContinuousArchiving"
	// ConditionStorageResizing is True while volumes of the release's
	// StatefulSets grow (the message gives each claim's state), False once
	// every claim has its new size; absent until storage first grows.
	ConditionStorageResizing = "StorageResizing"
	// ConditionStorageAutoExpand says whether automatic growth of the
	// volumes is watching (True) or cannot act (False: at its maximum, a
	// tenant limit, no volume statistics); absent when not asked for.
	ConditionStorageAutoExpand = "StorageAutoExpand"
	// ConditionDeprecatedAPIs is True while the release's stored manifest
	// names an API version this cluster no longer serves, that its minor
	// deprecates, or that the next minor removes (the message names each
	// kind, the minor that removes it and its replacement); absent otherwise.
	ConditionDeprecatedAPIs = "DeprecatedAPIs"
	// ConditionAnomalous is True while the release's pods restart, change
	// readiness or stay unready far more than in the release's own recent
	// history (the message names the signal and its figures); False within
	// that normal; absent when the watch does not ask for it.
	ConditionAnomalous = "Anomalous"
)

// StorageAutoExpand grows a resource's volumes before they fill up: when the
// fullest volume is used above ThresholdPercent (the kubelets' volume
// statistics), the size grows by Step, never above Max, at most once per Window.
type StorageAutoExpand struct {
	// Enabled turns automatic growth on.
	Enabled bool `json:"enabled"`
	// ThresholdPercent of a volume used that triggers a step (default 80).
	// +optional
	// +kubebuilder:validation:Minimum=50
	// +kubebuilder:validation:Maximum=99
	ThresholdPercent int32 `json:"thresholdPercent,omitempty"`
	// Step is a percentage of the size ("25%", the default) or a quantity
	// ("5Gi"); a step is at least 1Gi.
	// +optional
	// +kubebuilder:validation:Pattern=`^([1-9][0-9]?%|[0-9]+(\.[0-9]+)?(Mi|Gi|Ti|M|G|T))$`
	Step string `json:"step,omitempty"`
	// Max is the largest size the volumes grow to (required when enabled).
	// +optional
	// +kubebuilder:validation:Pattern=`^[0-9]+(\.[0-9]+)?(Mi|Gi|Ti|Pi|M|G|T|P)$`
	Max string `json:"max,omitempty"`
	// Window is the least time between two steps (default 10m).
	// +optional
	Window *metav1.Duration `json:"window,omitempty"`
}

// StorageStatus is what the operator last saw of a resource's volumes.
type StorageStatus struct {
	// UsedPercent of the fullest volume at the last check that changed it
	// by 5 points or more.
	// +optional
	UsedPercent int32 `json:"usedPercent,omitempty"`
	// Fullest is that volume's claim.
	// +optional
	Fullest string `json:"fullest,omitempty"`
	// LastExpansion is the newest automatic growth.
	// +optional
	LastExpansion *StorageExpansion `json:"lastExpansion,omitempty"`
}

// StorageExpansion is one automatic growth of a resource's volumes.
type StorageExpansion struct {
	At          metav1.Time `json:"at"`
	From        string      `json:"from"`
	To          string      `json:"to"`
	UsedPercent int32       `json:"usedPercent"`
}

// ReleaseStatus is the status shared by every kind chartpilot manages.
type ReleaseStatus struct {
	// ObservedGeneration is the generation the conditions describe.
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`
	// Conditions: Ready, Released, Reconciling, Stalled, Drifted and hook conditions.
	// +optional
	// +listType=map
	// +listMapKey=type
	Conditions []metav1.Condition `json:"conditions,omitempty"`
	// Release describes the deployed (or last attempted) release.
	// +optional
	Release *ReleaseInfo `json:"release,omitempty"`
	// History lists chartpilot's last actions on the release, newest first.
	// +optional
	// +kubebuilder:validation:MaxItems=10
	History []HistoryEntry `json:"history,omitempty"`
	// Chart says which chart version is deployed, which one the resource's
	// constraints select, and which newer one exists.
	// +optional
	Chart *ChartStatus `json:"chart,omitempty"`
	// LastFailure is the last failed action, for back-off; cleared on success.
	// +optional
	LastFailure *Failure `json:"lastFailure,omitempty"`
	// ValuesLayers are the values layers the release is rendered from, in
	// order (later ones win), each with its top-level keys: which layer
	// set what, never the values themselves.
	// +optional
	ValuesLayers []ValuesLayer `json:"valuesLayers,omitempty"`
	// DeprecatedAPIs are the kinds of the release's stored manifest whose
	// API version Kubernetes deprecates and removes, or that this cluster
	// no longer serves: the minor that removes each and what replaces it
	// (chartpilot preflight reads them).
	// +optional
	// +kubebuilder:validation:MaxItems=32
	DeprecatedAPIs []DeprecatedAPI `json:"deprecatedAPIs,omitempty"`
}

// DeprecatedAPI is one kind of a release's objects at an API version that
// a Kubernetes minor removes.
type DeprecatedAPI struct {
	APIVersion string `json:"apiVersion"`
	Kind       string `json:"kind"`
	// Objects counts the release's objects of the kind at this version.
	Objects int32 `json:"objects"`
	// DeprecatedIn and RemovedIn are the Kubernetes minors ("1.37") that
	// deprecate the version and stop serving it.
	// +optional
	DeprecatedIn string `json:"deprecatedIn,omitempty"`
	RemovedIn    string `json:"removedIn"`
	// Replacement is the apiVersion to use instead ("" when there is none);
	// ReplacementKind is set when the kind changes too.
	// +optional
	Replacement string `json:"replacement,omitempty"`
	// +optional
	ReplacementKind string `json:"replacementKind,omitempty"`
	// Served is whether the cluster serves the version now.
	Served bool `json:"served"`
}

// ValuesLayer is one values layer: its name ("cr", "hook:tenancy",
// "overrides", ...) and its top-level keys.
type ValuesLayer struct {
	Name string   `json:"name"`
	Keys []string `json:"keys,omitempty"`
}

// ReleaseInfo says what is deployed.
type ReleaseInfo struct {
	Name         string `json:"name"`
	Revision     int    `json:"revision,omitempty"`
	ChartName    string `json:"chartName,omitempty"`
	ChartVersion string `json:"chartVersion,omitempty"`
	AppVersion   string `json:"appVersion,omitempty"`
	// Status is Helm's status of the revision (deployed, failed, pending-upgrade, ...).
	Status string `json:"status,omitempty"`
	// +optional
	LastDeployed *metav1.Time `json:"lastDeployed,omitempty"`
	// ValuesDigest hashes the chart, the final values and the relevant annotations.
	ValuesDigest string `json:"valuesDigest,omitempty"`
}

// ChartStatus is the chart version state of a resource.
type ChartStatus struct {
	// Name of the chart.
	Name string `json:"name,omitempty"`
	// DeployedVersion is the version of the last good revision.
	// +optional
	DeployedVersion string `json:"deployedVersion,omitempty"`
	// DesiredVersion is the highest version the constraints select.
	// +optional
	DesiredVersion string `json:"desiredVersion,omitempty"`
	// AvailableUpgrade is a higher version the watch allows but that is not
	// deployed (policy or the resource's constraint holds it back).
	// +optional
	AvailableUpgrade string `json:"availableUpgrade,omitempty"`
	// FailedVersion is the version whose upgrade failed and was rolled back;
	// it is not retried until the inputs change or a reconcile is requested.
	// +optional
	FailedVersion string `json:"failedVersion,omitempty"`
}

// HistoryEntry is one action chartpilot took.
type HistoryEntry struct {
	// Action is Install, Upgrade, Rollback, Uninstall, Unlock or CorrectDrift.
	Action       string      `json:"action"`
	Revision     int         `json:"revision,omitempty"`
	ChartVersion string      `json:"chartVersion,omitempty"`
	Digest       string      `json:"digest,omitempty"`
	Succeeded    bool        `json:"succeeded"`
	Time         metav1.Time `json:"time"`
	// +optional
	Message string `json:"message,omitempty"`
}

// Failure records the last failed action and how often it failed in a row.
type Failure struct {
	Action string      `json:"action"`
	Digest string      `json:"digest"`
	Count  int         `json:"count"`
	Time   metav1.Time `json:"time"`
	// RequestedAt is the reconcile-requested-at annotation when it failed: a
	// new value retries at once.
	// +optional
	RequestedAt string `json:"requestedAt,omitempty"`
	Message     string `json:"message,omitempty"`
}
