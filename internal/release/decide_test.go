package release

import (
	"testing"
	"time"

	"github.com/chartpilot/chartpilot/internal/helm"
)

// TestNextAction covers every release state and every gate.
func TestNextAction(t *testing.T) {
	good := &helm.Release{Revision: 1, Status: helm.StatusSuperseded}
	free := gates{slotFree: true, healthy: true}
	with := func(f func(*gates)) gates { g := free; f(&g); return g }
	for _, tc := range []struct {
		name  string
		state State
		last  *helm.Release
		g     gates
		want  action
	}{
		{"absent installs", StateAbsent, nil, free, actInstall},
		{"absent after a failed install backs off", StateAbsent, nil, with(func(g *gates) { g.backoff = time.Second }), actBackOff},
		{"unmanaged release is left alone", StateUnmanaged, nil, free, actStallForeign},
		{"another object's release is left alone", StateConflict, good, free, actStallForeign},
		{"pending revision is unlocked", StateLocked, good, free, actUnlock},
		{"pending revision is unlocked whatever the gates", StateLocked, good, gates{backoff: time.Minute}, actUnlock},
		{"a live replica's pending revision is left alone", StateLocked, good, with(func(g *gates) { g.lockLive = true }), actWaitLock},
		{"interrupted uninstall is finished", StateUninstalling, nil, free, actCleanup},
		{"failed install is removed", StateFailedInstall, nil, free, actCleanup},
		{"failed install waits out its back-off", StateFailedInstall, nil, with(func(g *gates) { g.backoff = time.Second }), actBackOff},
		{"failed upgrade is rolled back", StateFailedUpgrade, good, free, actRollback},
		{"install broken off by an API error is discarded, not removed", StateFailedInstall, nil, with(func(g *gates) { g.brokenOff = true; g.backoff = time.Second }), actDiscard},
		{"unlocked revision broken off by an API error is discarded", StateInterrupted, nil, with(func(g *gates) { g.brokenOff = true }), actDiscard},
		{"upgrade broken off by an API error is discarded, not rolled back", StateFailedUpgrade, good, with(func(g *gates) { g.brokenOff = true; g.slotFree = false }), actDiscard},
		{"interrupted install is removed", StateInterrupted, nil, free, actCleanup},
		{"interrupted upgrade is finished", StateInterrupted, good, free, actUpgrade},
		{"interrupted upgrade waits for a slot", StateInterrupted, good, with(func(g *gates) { g.slotFree = false }), actQueue},
		{"new inputs upgrade", StateOutOfSync, good, free, actUpgrade},
		{"inputs rolled back as unhealthy are held", StateOutOfSync, good, with(func(g *gates) { g.condemned = true; g.backoff = time.Second }), actHoldUnhealthy},
		{"new inputs back off after a failure", StateOutOfSync, good, with(func(g *gates) { g.backoff = time.Second; g.rolloutHold = true }), actBackOff},
		{"window or canaries hold a version change", StateOutOfSync, good, with(func(g *gates) { g.rolloutHold = true; g.slotFree = false }), actHoldRollout},
		{"no slot: queued", StateOutOfSync, good, with(func(g *gates) { g.slotFree = false }), actQueue},
		{"fresh revision: health gate", StateInSync, good, with(func(g *gates) { g.healthy = false; g.driftDue = true }), actCheckHealth},
		{"drift is corrected once healthy", StateInSync, good, with(func(g *gates) { g.driftDue = true }), actCorrectDrift},
		{"a stored manifest naming unserved APIs is rewritten before the health gate", StateInSync, good, with(func(g *gates) { g.unservedAPIs = true; g.healthy = false; g.driftDue = true }), actRewriteAPIs},
		{"a stored manifest naming unserved APIs is rewritten before the upgrade", StateOutOfSync, good, with(func(g *gates) { g.unservedAPIs = true; g.backoff = time.Second; g.slotFree = false }), actRewriteAPIs},
		{"a failed upgrade is rolled back whatever the stored APIs", StateFailedUpgrade, good, with(func(g *gates) { g.unservedAPIs = true }), actRollback},
		{"in sync and healthy: nothing", StateInSync, good, with(func(g *gates) { g.backoff = time.Second; g.slotFree = false }), actNone},
	} {
		o := Observation{State: tc.state, Latest: tc.last, LastGood: tc.last}
		if tc.state == StateInterrupted || tc.state == StateFailedInstall || tc.state == StateUninstalling {
			o.LastGood = tc.last
		}
		if got := nextAction(o, tc.g); got != tc.want {
			t.Errorf("%s: nextAction = %s, want %s", tc.name, got, tc.want)
		}
	}
}
