package main

import (
	"bytes"
	"strings"
	"testing"
)

// TestColourReady: on a terminal the READY cell is coloured after the
// table is aligned, so every column still starts where it did; into a
// buffer (a pipe, a file) nothing is coloured.
func TestColourReady(t *testing.T) {
	table := "KIND      NAME    READY                  AGE\n" +
		"Postgres  a       True                   3h\n" +
		"Postgres  b       False (UpgradeQueued)  3h\n" +
		"Redis     c       Unknown                3h\n"
	got := colourReady(table)
	for _, want := range []string{green + "True" + reset, red + "False" + reset + " (UpgradeQueued)", amber + "Unknown" + reset} {
		if !strings.Contains(got, want) {
			t.Errorf("no %q in\n%s", want, got)
		}
	}
	plain := strings.NewReplacer(green, "", red, "", amber, "", reset, "").Replace(got)
	if plain != table {
		t.Errorf("without the colour codes the table changed:\n%s", plain)
	}
	if colourful(&bytes.Buffer{}) {
		t.Error("a buffer is not a terminal")
	}
}
