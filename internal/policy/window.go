package policy

import (
	"fmt"
	"strings"
	"time"
	_ "time/tzdata" // maintenance windows name time zones; the image may have no zoneinfo
)

// Window is one weekly maintenance window: on the given weekdays, from
// start to end (minutes after midnight, end may wrap past midnight), in loc.
type Window struct {
	days       [7]bool
	start, end int
	loc        *time.Location
}

var weekdays = map[string]time.Weekday{"sun": time.Sunday, "mon": time.Monday, "tue": time.Tuesday, "wed": time.Wednesday, "thu": time.Thursday, "fri": time.Friday, "sat": time.Saturday}

// windowFormat is shown in every parse error.
const windowFormat = `"<days> HH:MM-HH:MM <time zone>", e.g. "Sat 02:00-04:00 UTC", "Mon-Fri 22:00-23:30 Europe/Berlin" or "* 01:00-02:00 UTC"; several separated by ";"`

// ParseWindows reads the maintenance-window annotation.
func ParseWindows(s string) ([]Window, error) {
	var out []Window
	for _, part := range strings.Split(s, ";") {
		part = strings.TrimSpace(part)
		if part == "" {
			continue
		}
		f := strings.Fields(part)
		if len(f) != 3 {
			return nil, fmt.Errorf("%q is not %s", part, windowFormat)
		}
		var w Window
		if err := parseDays(f[0], &w.days); err != nil {
			return nil, fmt.Errorf("%q: %w; write %s", part, err, windowFormat)
		}
		span := strings.Split(f[1], "-")
		if len(span) != 2 {
			return nil, fmt.Errorf("%q: %q is not a time span HH:MM-HH:MM", part, f[1])
		}
		var err error
		if w.start, err = parseClock(span[0]); err == nil {
			w.end, err = parseClock(span[1])
		}
		if err != nil {
			return nil, fmt.Errorf("%q: %w", part, err)
		}
		if w.start == w.end {
			return nil, fmt.Errorf("%q: the window is empty (start equals end)", part)
		}
		if w.loc, err = time.LoadLocation(f[2]); err != nil {
			return nil, fmt.Errorf("%q: unknown time zone %q: use UTC or an IANA name such as Europe/Berlin", part, f[2])
		}
		out = append(out, w)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("no window given: write %s", windowFormat)
	}
	return out, nil
}

func parseDays(s string, days *[7]bool) error {
	if s == "*" || strings.EqualFold(s, "daily") {
		for i := range days {
			days[i] = true
		}
		return nil
	}
	for _, item := range strings.Split(s, ",") {
		lo, hi, isRange := strings.Cut(item, "-")
		a, ok := weekdays[strings.ToLower(lo)]
		if !ok {
			return fmt.Errorf("%q is not a weekday (Mon, Tue, …)", lo)
		}
		b := a
		if isRange {
			if b, ok = weekdays[strings.ToLower(hi)]; !ok {
				return fmt.Errorf("%q is not a weekday (Mon, Tue, …)", hi)
			}
		}
		for d := a; ; d = (d + 1) % 7 {
			days[d] = true
			if d == b {
				break
			}
		}
	}
	return nil
}

func parseClock(s string) (int, error) {
	t, err := time.Parse("15:04", s)
	if err != nil {
		return 0, fmt.Errorf("%q is not a time of day HH:MM", s)
	}
	return t.Hour()*60 + t.Minute(), nil
}

// InWindow reports whether now falls in one of the windows, and if not,
// how long until the next one opens.
func InWindow(ws []Window, now time.Time) (bool, time.Duration) {
	next := time.Duration(-1)
	for _, w := range ws {
		local := now.In(w.loc)
		midnight := time.Date(local.Year(), local.Month(), local.Day(), 0, 0, 0, 0, w.loc)
		// A window that wraps past midnight may have opened yesterday.
		for dayOffset := -1; dayOffset <= 7; dayOffset++ {
			day := midnight.AddDate(0, 0, dayOffset)
			if !w.days[day.Weekday()] {
				continue
			}
			open := day.Add(time.Duration(w.start) * time.Minute)
			length := w.end - w.start
			if length < 0 {
				length += 24 * 60
			}
			closes := open.Add(time.Duration(length) * time.Minute)
			if !now.Before(open) && now.Before(closes) {
				return true, 0
			}
			if open.After(now) {
				if d := open.Sub(now); next < 0 || d < next {
					next = d
				}
				break
			}
		}
	}
	return false, next
}
