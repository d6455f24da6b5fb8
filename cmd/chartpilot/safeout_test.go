package main

import (
	"bytes"
	"strings"
	"testing"
)

// TestTerminalSafe: escape sequences in text tenants wrote are shown
// escaped; text, newlines, tabs and other letters pass as they are.
func TestTerminalSafe(t *testing.T) {
	for in, want := range map[string]string{
		"Ready\tTrue\n":                       "Ready\tTrue\n",
		"ünïcode ✓":                           "ünïcode ✓",
		"msg \x1b[2J\x1b]0;pwned\x07 end":     `msg \u001b[2J\u001b]0;pwned\u0007 end`,
		"carriage\rreturn":                    `carriage\u000dreturn`,
		"c1 \u009b31m":                        `c1 \u009b31m`,
		"del\x7f":                             `del\u007f`,
		strings.Repeat("a", 5000) + "\x1b[1A": strings.Repeat("a", 5000) + `\u001b[1A`,
	} {
		var b bytes.Buffer
		n, err := terminalSafe(&b).Write([]byte(in))
		if err != nil || n != len(in) || b.String() != want {
			t.Errorf("terminalSafe(%q) = %q (%d, %v), want %q", in, b.String(), n, err, want)
		}
	}
}
