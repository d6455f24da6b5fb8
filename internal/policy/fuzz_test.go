package policy

import (
	"testing"
	"time"
)

// FuzzParseWindows: any annotation parses or errors; a parsed window says
// whether it is open and, if not, when it opens within a week.
func FuzzParseWindows(f *testing.F) {
	for _, s := range []string{"Sat 02:00-04:00 UTC", "Mon-Fri 22:00-02:00 Europe/Berlin; * 12:00-12:30 UTC", "*", "Sun,Sat 00:00-01:00 UTC", ";;"} {
		f.Add(s)
	}
	now := time.Date(2026, 11, 28, 3, 0, 0, 0, time.UTC)
	f.Fuzz(func(t *testing.T, s string) {
		ws, err := ParseWindows(s)
		if err != nil {
			return
		}
		open, next := InWindow(ws, now)
		if !open && (next <= 0 || next > 8*24*time.Hour) {
			t.Fatalf("%q: closed, next opening in %s", s, next)
		}
	})
}

// FuzzParseMajors: any annotation parses or errors, never panics.
func FuzzParseMajors(f *testing.F) {
	for _, s := range []string{"2", "2,16", " 3 , ", "x", "-1", "99999999999999999999"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		if majors, err := ParseMajors(s); err == nil && len(majors) > len(s) {
			t.Fatalf("%q: %d majors", s, len(majors))
		}
	})
}
