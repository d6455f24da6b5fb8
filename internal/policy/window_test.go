package policy

import (
	"strings"
	"testing"
	"time"
)

func TestMaintenanceWindows(t *testing.T) {
	// 2026-11-28 is a Saturday.
	sat := func(h, m int) time.Time { return time.Date(2026, 11, 28, h, m, 0, 0, time.UTC) }
	for _, tc := range []struct {
		spec     string
		now      time.Time
		open     bool
		nextOpen time.Duration
	}{
		{"Sat 02:00-04:00 UTC", sat(3, 0), true, 0},
		{"Sat 02:00-04:00 UTC", sat(4, 0), false, 7*24*time.Hour - 2*time.Hour},
		{"Sat 02:00-04:00 UTC", sat(1, 30), false, 30 * time.Minute},
		{"Mon-Fri 22:00-02:00 UTC", sat(1, 0), true, 0},               // Friday's window runs into Saturday
		{"Mon-Fri 22:00-02:00 UTC", sat(3, 0), false, 67 * time.Hour}, // Monday 22:00
		{"Sun,Sat 00:00-01:00 UTC; * 12:00-12:30 UTC", sat(11, 0), false, time.Hour},
		{"Sat 02:00-04:00 Europe/Berlin", sat(1, 30), true, 0}, // 02:30 in Berlin (UTC+1)
		{"* 02:00-04:00 UTC", sat(5, 0), false, 21 * time.Hour},
	} {
		ws, err := ParseWindows(tc.spec)
		if err != nil {
			t.Fatalf("%s: %v", tc.spec, err)
		}
		open, next := InWindow(ws, tc.now)
		if open != tc.open || (!open && next != tc.nextOpen) {
			t.Errorf("%s at %s: open=%v next=%s; want %v %s", tc.spec, tc.now.Format(time.RFC3339), open, next, tc.open, tc.nextOpen)
		}
	}
	for spec, want := range map[string]string{
		"Saturday 02:00-04:00 UTC":  "not a weekday",
		"Sat 2-4 UTC":               "HH:MM",
		"Sat 02:00-04:00 Mars/Base": "unknown time zone",
		"Sat 02:00-02:00 UTC":       "empty",
		"Sat 02:00-04:00":           "e.g. \"Sat 02:00-04:00 UTC\"",
		"":                          "no window",
	} {
		if _, err := ParseWindows(spec); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%q: error %v, want one containing %q", spec, err, want)
		}
	}
}
