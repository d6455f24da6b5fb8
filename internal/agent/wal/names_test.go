package wal

import (
	"strings"
	"testing"
)

func TestSegmentNames(t *testing.T) {
	for _, c := range []struct {
		name    string
		segSize int64
		want    Segment
	}{
		{"000000010000000000000003", DefaultSegmentSize, Segment{1, 3}},
		{"0000000200000001000000FF", DefaultSegmentSize, Segment{2, 256 + 255}},
		{"000000010000000A00000001", 1 << 30, Segment{1, 10*4 + 1}},
	} {
		got, err := ParseSegment(c.name, c.segSize)
		if err != nil || got != c.want {
			t.Errorf("ParseSegment(%s) = %+v, %v; want %+v", c.name, got, err, c.want)
		}
		if back := got.Name(c.segSize); back != c.name {
			t.Errorf("Name of %+v = %s, want %s", got, back, c.name)
		}
	}
	for _, bad := range []string{"00000001000000000000000", "000000010000000000000100", "../00000001000000000000", "0000000100000000000000zz"} {
		if _, err := ParseSegment(bad, DefaultSegmentSize); err == nil {
			t.Errorf("ParseSegment(%q) took it", bad)
		}
	}
	for name, ok := range map[string]bool{
		"000000010000000000000003":                 true,
		"00000002.history":                         true,
		"000000010000000000000003.partial":         true,
		"000000010000000000000003.00000028.backup": true,
		"../etc/passwd":                            false,
		"00000002.history/x":                       false,
		"RECOVERYXLOG":                             false,
	} {
		if ValidName(name) != ok {
			t.Errorf("ValidName(%q) = %v", name, !ok)
		}
	}
}

func TestLSN(t *testing.T) {
	lsn, err := ParseLSN("16/B374D848")
	if err != nil || lsn != 0x16B374D848 || FormatLSN(lsn) != "16/B374D848" {
		t.Fatalf("ParseLSN: %x, %v", lsn, err)
	}
	for _, bad := range []string{"", "16", "x/1", "1/100000000"} {
		if _, err := ParseLSN(bad); err == nil {
			t.Errorf("ParseLSN(%q) took it", bad)
		}
	}
}

func TestHistoryAndExpected(t *testing.T) {
	hist, err := ParseHistory("1\t0/5000000\tno recovery target specified\n\n# a comment\n2\t0/70000A0\tbefore 2026-12-04 12:00:00+00\n")
	if err != nil || len(hist) != 2 || hist[0] != (Switch{1, 0x5000000}) || hist[1] != (Switch{2, 0x70000A0}) {
		t.Fatalf("ParseHistory: %+v, %v", hist, err)
	}
	if _, err := ParseHistory("2\t0/5000000\tx\n1\t0/6000000\ty\n"); err == nil {
		t.Error("ParseHistory took timelines going down")
	}
	if _, err := ParseHistory("1 nonsense\n"); err == nil {
		t.Error("ParseHistory took a line without an LSN")
	}
	// Timeline 3's history: 1 ended in segment 5 (at its start), 2 in
	// segment 7. From segment 3 of timeline 1 to segment 9 of timeline 3.
	hist = []Switch{{1, 0x5000000}, {2, 0x70000A0}}
	got, err := Expected(Segment{1, 3}, 3, hist, 9, DefaultSegmentSize)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, s := range got {
		names = append(names, s.Name(DefaultSegmentSize)[:8]+":"+s.Name(DefaultSegmentSize)[22:])
	}
	if want := "00000001:03 00000001:04 00000002:05 00000002:06 00000003:07 00000003:08 00000003:09"; strings.Join(names, " ") != want {
		t.Fatalf("Expected = %s, want %s", strings.Join(names, " "), want)
	}
	// Starting on timeline 2 skips timeline 1's switch.
	got, err = Expected(Segment{2, 6}, 3, hist, 7, DefaultSegmentSize)
	if err != nil || len(got) != 2 || got[0] != (Segment{2, 6}) || got[1] != (Segment{3, 7}) {
		t.Fatalf("Expected from timeline 2 = %+v, %v", got, err)
	}
	if _, err := Expected(Segment{4, 1}, 3, hist, 9, DefaultSegmentSize); err == nil {
		t.Error("Expected took a start on a timeline that is no ancestor")
	}
	if _, err := Expected(Segment{1, 6}, 3, hist, 9, DefaultSegmentSize); err == nil {
		t.Error("Expected took a start after its timeline's end")
	}
}
