package policy

import (
	"strings"
	"testing"
)

func TestAppMajorPolicy(t *testing.T) {
	for _, tc := range []struct {
		have, want     string
		allow          []uint64
		allowDowngrade string
		reason, msgHas string
	}{
		{have: "", want: "17"},    // fresh install
		{have: "16", want: "16"},  // same major
		{have: "16", want: "abc"}, // not a number: the CRD pattern refuses it first
		{have: "16", want: "17", reason: ReasonAppMajor, msgHas: `chartpilot.dev/allow-major-upgrade: "17"`},
		{have: "16", want: "17", allow: []uint64{2, 17}},
		{have: "16", want: "18", allow: []uint64{17}, reason: ReasonAppMajor, msgHas: `"18"`},
		{have: "17", want: "16", reason: "DowngradeRefused", msgHas: `chartpilot.dev/allow-downgrade: "16"`},
		{have: "17", want: "16", allowDowngrade: "16"},
	} {
		reason, msg := AppMajor(tc.have, tc.want, tc.allow, tc.allowDowngrade)
		if reason != tc.reason || !strings.Contains(msg, tc.msgHas) {
			t.Errorf("%s -> %s (allow %v): got %q %q, want %q containing %q", tc.have, tc.want, tc.allow, reason, msg, tc.reason, tc.msgHas)
		}
	}
}
