package release

import (
	"strconv"
	"strings"

	"github.com/chartpilot/chartpilot/internal/api/v1alpha1"
	"github.com/chartpilot/chartpilot/internal/helm"
)

// State is what observing a release found. Exactly one action follows from it.
type State string

// States of a release, as observed.
const (
	// StateAbsent: no revision is stored.
	StateAbsent State = "Absent"
	// StateUnmanaged: a release of this name exists that chartpilot did not install.
	StateUnmanaged State = "Unmanaged"
	// StateConflict: the release belongs to another object.
	StateConflict State = "Conflict"
	// StateLocked: the latest revision is pending-*; its action was interrupted.
	StateLocked State = "Locked"
	// StateFailedInstall: the release failed and was never deployed.
	StateFailedInstall State = "FailedInstall"
	// StateFailedUpgrade: the latest revision failed; an earlier one was deployed.
	StateFailedUpgrade State = "FailedUpgrade"
	// StateInterrupted: an interrupted action was unlocked and must be finished.
	StateInterrupted State = "Interrupted"
	// StateUninstalling: an uninstall was interrupted.
	StateUninstalling State = "Uninstalling"
	// StateOutOfSync: deployed, but from other inputs than the desired ones.
	StateOutOfSync State = "OutOfSync"
	// StateInSync: deployed from the desired inputs.
	StateInSync State = "InSync"
)

// unlockedPrefix marks a revision that chartpilot unlocked after a process
// died mid-action: the action is finished, not counted as a failure.
const unlockedPrefix = "chartpilot: unlocked interrupted "

// Observation is the release as seen at the start of a pass.
type Observation struct {
	State State
	// Latest is the newest revision (nil when absent).
	Latest *helm.Release
	// LastGood is the newest deployed or superseded revision, the rollback target.
	LastGood *helm.Release
}

// observe classifies a release history (oldest first) against the owner's
// UID and the desired digest. It is a pure function.
func observe(history []*helm.Release, ownerUID, desiredDigest string, adopt bool) Observation {
	if len(history) == 0 {
		return Observation{State: StateAbsent}
	}
	latest := history[len(history)-1]
	o := Observation{Latest: latest, LastGood: lastGood(history)}
	switch uid := latest.Labels[v1alpha1.LabelOwnerUID]; {
	case uid == "" && !adopt:
		o.State = StateUnmanaged
		return o
	case uid != "" && uid != ownerUID && !adopt:
		o.State = StateConflict
		return o
	}
	switch {
	case latest.Status.IsPending():
		o.State = StateLocked
	case latest.Status == helm.StatusUninstalling:
		o.State = StateUninstalling
	case latest.Status == helm.StatusFailed && strings.HasPrefix(latest.Description, unlockedPrefix):
		o.State = StateInterrupted
	case latest.Status == helm.StatusFailed && o.LastGood == nil:
		o.State = StateFailedInstall
	case latest.Status == helm.StatusFailed:
		o.State = StateFailedUpgrade
	case latest.Status == helm.StatusDeployed && latest.Labels[v1alpha1.LabelDigest] == desiredDigest:
		o.State = StateInSync
	default:
		o.State = StateOutOfSync
	}
	return o
}

// revisionOf parses a storage Secret's version label.
func revisionOf(labels map[string]string) int {
	v, err := strconv.Atoi(labels[helm.StorageLabelVersion])
	if err != nil {
		return 0
	}
	return v
}

// lastGood is the newest deployed or superseded revision of a history
// (oldest first), the rollback target; nil when none.
func lastGood(history []*helm.Release) *helm.Release {
	for i := len(history) - 1; i >= 0; i-- {
		if s := history[i].Status; s == helm.StatusDeployed || s == helm.StatusSuperseded {
			return history[i]
		}
	}
	return nil
}

// lastGoodBefore is the newest deployed or superseded revision older than rev.
func lastGoodBefore(history []*helm.Release, rev int) *helm.Release {
	for i := len(history) - 1; i >= 0; i-- {
		if h := history[i]; h.Revision < rev && (h.Status == helm.StatusDeployed || h.Status == helm.StatusSuperseded) {
			return h
		}
	}
	return nil
}
