package main

import (
	"strings"
	"testing"
)

func TestHelpExitsZero(t *testing.T) {
	for _, args := range [][]string{
		{"--help"}, {"help"},
		{"run", "--help"}, {"rbac", "--help"},
		{"backup", "--help"}, {"backup", "-h"}, {"backup", "run", "--help"}, {"backup", "verify", "--help"},
		{"instance", "--help"}, {"major-upgrade", "--help"},
		{"store", "--help"}, {"install-agent", "--help"},
		{"get", "--help"}, {"describe", "--help"}, {"tenants", "--help"},
		{"rollout", "--help"}, {"rollout", "status", "--help"},
		{"identity", "--help"}, {"identity", "create", "--help"},
	} {
		if code := dispatch(args); code != 0 {
			t.Errorf("chartpilot %s: exit code %d, want 0", strings.Join(args, " "), code)
		}
	}
}

func TestBadInvocationsFail(t *testing.T) {
	for args, want := range map[string]int{
		"":                    2,
		"frobnicate":          2,
		"get --no-such-flag":  1,
		"backup":              1,
		"rollout":             1,
		"identity delete":     1,
		"install-agent a b":   1,
		"instance --bogus=1":  1,
		"rbac --no-such-flag": 1,
	} {
		if code := dispatch(strings.Fields(args)); code != want {
			t.Errorf("chartpilot %s: exit code %d, want %d", args, code, want)
		}
	}
}

func TestWatchPrintsOnlyChangedFrames(t *testing.T) {
	var b strings.Builder
	c := &changedFrames{w: &b}
	for _, f := range []string{"A 1/3\n", "A 1/3\n", "A 1/3\n", "A 2/3\n", "A 2/3\n", "A 3/3\n"} {
		c.print([]byte(f))
	}
	if got, want := b.String(), "A 1/3\n\nA 2/3\n\nA 3/3\n"; got != want {
		t.Errorf("printed %q, want %q", got, want)
	}
}
