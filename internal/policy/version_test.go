package policy

import (
	"strings"
	"testing"

	"github.com/chartpilot/chartpilot/internal/api/v1alpha1"
)

func TestChoose(t *testing.T) {
	versions := []string{"1.0.0", "1.4.2", "1.5.0", "1.5.1", "2.0.0", "2.1.0", "3.0.0", "not-a-version"}
	for _, tc := range []struct {
		name                    string
		p                       Policy
		version, desired, avail string
		blocked, msgHas, errHas string
	}{
		{name: "fresh install takes the highest", p: Policy{}, version: "3.0.0", desired: "3.0.0"},
		{name: "fresh install within the watch", p: Policy{Watch: "<2"}, version: "1.5.1", desired: "1.5.1"},
		{name: "patch and minor upgrades proceed", p: Policy{Watch: "<2", Deployed: "1.4.2"}, version: "1.5.1", desired: "1.5.1"},
		{name: "major waits for opt-in, minor proceeds", p: Policy{Deployed: "1.4.2"}, version: "1.5.1", desired: "3.0.0", avail: "3.0.0",
			blocked: ReasonMajorUpgrade, msgHas: `chartpilot.dev/allow-major-upgrade: "3"`},
		{name: "opt-in to 2 moves to the highest 2.x", p: Policy{Deployed: "1.4.2", AllowMajor: []uint64{2}}, version: "2.1.0", desired: "3.0.0", avail: "3.0.0",
			blocked: ReasonMajorUpgrade},
		{name: "opt-in to the target major", p: Policy{Deployed: "2.1.0", AllowMajor: []uint64{3}}, version: "3.0.0", desired: "3.0.0"},
		{name: "resource constraint narrows", p: Policy{Resource: "~1.4", Field: "spec.chartVersion", Deployed: "1.0.0"}, version: "1.4.2", desired: "1.4.2", avail: "3.0.0"},
		{name: "downgrade refused keeps deployed", p: Policy{Watch: "<=1.5.1", Resource: ">=1.4.2, <1.5", Field: "spec.chartVersion", Deployed: "1.5.0"},
			version: "", desired: "1.4.2", avail: "1.5.1", blocked: ReasonDowngrade, msgHas: `chartpilot.dev/allow-downgrade: "1.4.2"`},
		{name: "downgrade refused but deployed still allowed", p: Policy{Watch: "<2", Deployed: "1.5.1", Resource: "<=1.5.1", Field: "spec.chartVersion"}, version: "1.5.1", desired: "1.5.1"},
		{name: "deployed gone from the repository, lower chosen: refused", p: Policy{Watch: "<2", Deployed: "1.9.0"}, version: "", desired: "1.5.1",
			blocked: ReasonDowngrade},
		{name: "downgrade allowed exactly", p: Policy{Watch: "<2", Deployed: "1.9.0", AllowDowngrade: "1.5.1"}, version: "1.5.1", desired: "1.5.1"},
		{name: "nothing satisfies", p: Policy{Chart: "redis", Resource: ">=9", Field: "spec.chartVersion"}, errHas: `no version of chart redis satisfies spec.chartVersion ">=9" (known: 3.0.0, 2.1.0`},
		{name: "bad resource constraint names the field", p: Policy{Resource: "one point four", Field: "annotation chartpilot.dev/chart-version"}, errHas: "annotation chartpilot.dev/chart-version"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := Choose(versions, tc.p)
			if tc.errHas != "" {
				if err == nil || !strings.Contains(err.Error(), tc.errHas) {
					t.Fatalf("error %v, want one containing %q", err, tc.errHas)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if c.Version != tc.version || c.Desired != tc.desired || c.AvailableUpgrade != tc.avail || c.Blocked != tc.blocked {
				t.Errorf("got version=%q desired=%q available=%q blocked=%q (%s); want %q %q %q %q", c.Version, c.Desired, c.AvailableUpgrade, c.Blocked, c.Message, tc.version, tc.desired, tc.avail, tc.blocked)
			}
			if !strings.Contains(c.Message, tc.msgHas) {
				t.Errorf("message %q, want it to contain %q", c.Message, tc.msgHas)
			}
		})
	}
}

func TestParseMajors(t *testing.T) {
	got, err := ParseMajors(" 2, 16 ")
	if err != nil || len(got) != 2 || got[0] != 2 || got[1] != 16 {
		t.Fatalf("got %v %v", got, err)
	}
	if _, err := ParseMajors("two"); err == nil || !strings.Contains(err.Error(), v1alpha1.AnnotationAllowMajorUpgrade) {
		t.Fatalf("error %v, want one naming the annotation", err)
	}
}
