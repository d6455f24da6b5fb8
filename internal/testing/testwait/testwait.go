// Package testwait waits on conditions in tests: a condition is looked at
// again at an interval until it holds or a deadline passes, never slept
// past, so that a test is as quick as the system it watches and as patient
// as a loaded machine needs.
package testwait

import "time"

// Until calls ok at once and then every interval until it returns true,
// and reports whether it did within timeout (ok is asked a last time at
// the deadline).
func Until(timeout, interval time.Duration, ok func() bool) bool {
	if ok() {
		return true
	}
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	tick := time.NewTicker(interval)
	defer tick.Stop()
	for {
		select {
		case <-deadline.C:
			return ok()
		case <-tick.C:
			if ok() {
				return true
			}
		}
	}
}

// Holds calls ok every interval for d and reports whether it returned true
// each time: the wait that gives a wrong action room to show.
func Holds(d, interval time.Duration, ok func() bool) bool {
	return !Until(d, interval, func() bool { return !ok() })
}

// HoldsSaying is Holds for a condition that also says what it saw: it
// reports whether ok held every time, and what it said last (at the
// look that found it false, when one did).
func HoldsSaying(d, interval time.Duration, ok func() (bool, string)) (bool, string) {
	var last string
	held := Holds(d, interval, func() bool {
		yes, said := ok()
		last = said
		return yes
	})
	return held, last
}
