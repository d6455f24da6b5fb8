package release

// The collaborators of Reconciler: each holds the methods of one concern
// and works with the reconciler's fields and clients. A pass builds them
// where it needs them (chartVersions{r}.selectChart(...)); they keep no
// state of their own.

// chartVersions chooses the chart version a release is to run, and the
// rollout gates (maintenance windows, canaries) that hold a change of it
// (versions.go, rollout.go).
type chartVersions struct{ *Reconciler }

// wiring connects the reconciler to its manager: the watches, the mapping
// of events to resources, the wake-ups (setup.go).
type wiring struct{ *Reconciler }

// storageGrowth grows the volumes of a release's StatefulSets (storage.go).
type storageGrowth struct{ *Reconciler }

// healthGate follows the workloads of a revision until they are ready
// (health.go).
type healthGate struct{ *Reconciler }

// reporter records what a pass found and did: the status and its
// conditions, the history, failures and back-offs (status.go, outcome.go).
type reporter struct{ *Reconciler }
