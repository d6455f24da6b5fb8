package release

import (
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/chartpilot/chartpilot/internal/api/v1alpha1"
	"github.com/chartpilot/chartpilot/internal/helm"
)

// recordLabels are the labels a release record of rel carries (Helm's and
// chartpilot's), as the metadata cache shows them.
func recordLabels(rel *helm.Release) map[string]string {
	l := map[string]string{
		helm.StorageLabelOwner:   helm.StorageOwnerHelm,
		helm.StorageLabelStatus:  string(rel.Status),
		helm.StorageLabelVersion: strconv.Itoa(rel.Revision),
	}
	for k, v := range rel.Labels {
		l[k] = v
	}
	return l
}

// everyGates is every combination of the gates, each at a value that
// matters and at its zero.
func everyGates() []gates {
	var out []gates
	for bits := 0; bits < 1<<8; bits++ {
		on := func(i int) bool { return bits&(1<<i) != 0 }
		g := gates{condemned: on(1), rolloutHold: on(2), slotFree: on(3), healthy: on(4), driftDue: on(5), lockLive: on(6), brokenOff: on(7)}
		if on(0) {
			g.backoff = time.Minute
		}
		out = append(out, g)
	}
	return out
}

// The cache path and the full pass choose the same action for the same
// release: what observeRecords makes of the records' labels is what
// observe makes of the history, and nextAction, given either, returns the
// same action for every combination of gates. Where the labels cannot
// tell (not deployed, not this owner's, a cache behind the status), the
// cache path gives the pass to the full one.
func TestCachePathChoosesAsHistory(t *testing.T) {
	const me, other = "uid-me", "uid-other"
	rev := func(n int, st helm.Status, uid, digest string) *helm.Release {
		l := map[string]string{v1alpha1.LabelDigest: digest}
		if uid != "" {
			l[v1alpha1.LabelOwnerUID] = uid
		}
		return &helm.Release{Revision: n, Status: st, Labels: l}
	}
	unlocked := rev(3, helm.StatusFailed, me, "d2")
	unlocked.Description = unlockedPrefix + "upgrade"
	histories := map[string][]*helm.Release{
		"installed":            {rev(1, helm.StatusDeployed, me, "d1")},
		"upgraded":             {rev(1, helm.StatusSuperseded, me, "d1"), rev(2, helm.StatusDeployed, me, "d2")},
		"rolled back":          {rev(1, helm.StatusSuperseded, me, "d1"), rev(2, helm.StatusSuperseded, me, "d2"), rev(3, helm.StatusDeployed, me, "d1")},
		"install pending":      {rev(1, helm.StatusPendingInstall, me, "d1")},
		"upgrade pending":      {rev(1, helm.StatusDeployed, me, "d1"), rev(2, helm.StatusPendingUpgrade, me, "d2")},
		"rollback pending":     {rev(1, helm.StatusSuperseded, me, "d1"), rev(2, helm.StatusPendingRollback, me, "d2")},
		"install failed":       {rev(1, helm.StatusFailed, me, "d1")},
		"upgrade failed":       {rev(1, helm.StatusDeployed, me, "d1"), rev(2, helm.StatusFailed, me, "d2")},
		"upgrade unlocked":     {rev(1, helm.StatusSuperseded, me, "d1"), rev(2, helm.StatusSuperseded, me, "d1"), unlocked},
		"uninstalling":         {rev(1, helm.StatusUninstalling, me, "d1")},
		"not chartpilot's":     {rev(1, helm.StatusDeployed, "", "")},
		"another object's":     {rev(1, helm.StatusDeployed, other, "d1")},
		"taken from another":   {rev(1, helm.StatusSuperseded, other, "d1"), rev(2, helm.StatusDeployed, me, "d1")},
		"given to another":     {rev(1, helm.StatusSuperseded, me, "d1"), rev(2, helm.StatusDeployed, other, "d1")},
		"deployed, no digest":  {rev(1, helm.StatusDeployed, me, "")},
		"superseded as newest": {rev(1, helm.StatusSuperseded, me, "d1")},
	}
	ended, given := 0, 0
	for name, history := range histories {
		records := make([]map[string]string, len(history))
		for i, h := range history {
			// The cache lists records in no particular order.
			records[len(history)-1-i] = recordLabels(h)
		}
		newest := history[len(history)-1].Revision
		for _, digest := range []string{"d1", "d2", ""} {
			for _, statusRev := range []int{0, newest, newest + 1} {
				for _, adopt := range []bool{false, true} {
					what := fmt.Sprintf("%s, desired %q, status revision %d, adopt %t", name, digest, statusRev, adopt)
					full := observe(history, me, digest, adopt)
					cached, ok := observeRecords(records, statusRev, me, digest)
					endable := (full.State == StateInSync && statusRev > 0 || full.State == StateOutOfSync) &&
						full.Latest.Status == helm.StatusDeployed && full.Latest.Labels[v1alpha1.LabelOwnerUID] == me &&
						statusRev <= newest && digest != ""
					if ok != endable {
						t.Errorf("%s: the cache path ends it: %t, want %t (history: %s)", what, ok, endable, full.State)
						continue
					}
					if !ok {
						given++
						continue
					}
					ended++
					if cached.State != full.State || cached.Latest.Revision != full.Latest.Revision || cached.LastGood.Revision != full.LastGood.Revision {
						t.Errorf("%s: records say %s at %d (last good %d), history %s at %d (last good %d)", what,
							cached.State, cached.Latest.Revision, cached.LastGood.Revision, full.State, full.Latest.Revision, full.LastGood.Revision)
						continue
					}
					for _, g := range everyGates() {
						if a, b := nextAction(cached, g), nextAction(full, g); a != b {
							t.Errorf("%s, gates %+v: the cache path chooses %s, the full pass %s", what, g, a, b)
						}
					}
				}
			}
		}
	}
	if ended == 0 || given == 0 {
		t.Fatalf("the cases end %d passes on the caches and give %d to the full pass: both must occur", ended, given)
	}
}

// An empty cache, or one whose newest record is not yet the revision the
// status names, ends nothing.
func TestObserveRecordsBehindStatus(t *testing.T) {
	if _, ok := observeRecords(nil, 0, "uid", "d1"); ok {
		t.Error("no records: the cache path ended the pass")
	}
	rec := recordLabels(&helm.Release{Revision: 4, Status: helm.StatusDeployed, Labels: map[string]string{v1alpha1.LabelOwnerUID: "uid", v1alpha1.LabelDigest: "d1"}})
	if _, ok := observeRecords([]map[string]string{rec}, 5, "uid", "d1"); ok {
		t.Error("records behind the status: the cache path ended the pass")
	}
	o, ok := observeRecords([]map[string]string{rec}, 4, "uid", "d1")
	if !ok || o.State != StateInSync || o.Latest.Revision != 4 {
		t.Errorf("records at the status's revision: %v %s %v, want in sync at 4", ok, o.State, o.Latest)
	}
}
