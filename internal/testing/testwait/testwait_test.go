package testwait

import (
	"fmt"
	"testing"
	"time"
)

func TestUntil(t *testing.T) {
	n := 0
	if !Until(time.Minute, time.Millisecond, func() bool { n++; return n == 5 }) {
		t.Fatal("Until gave up on a condition that came true")
	}
	if n != 5 {
		t.Errorf("asked %d times, want 5", n)
	}
	if Until(20*time.Millisecond, time.Millisecond, func() bool { return false }) {
		t.Error("Until reported a condition that never held")
	}
}

func TestHolds(t *testing.T) {
	if !Holds(20*time.Millisecond, time.Millisecond, func() bool { return true }) {
		t.Error("Holds reported a break in a condition that always held")
	}
	n := 0
	if Holds(time.Minute, time.Millisecond, func() bool { n++; return n < 3 }) {
		t.Error("Holds missed the condition breaking")
	}
}

func TestHoldsSaying(t *testing.T) {
	n := 0
	held, said := HoldsSaying(time.Minute, time.Millisecond, func() (bool, string) { n++; return n < 3, fmt.Sprint("look ", n) })
	if held || said != "look 3" {
		t.Errorf("a condition broken at the third look: held %v, said %q", held, said)
	}
	if held, said := HoldsSaying(10*time.Millisecond, time.Millisecond, func() (bool, string) { return true, "fine" }); !held || said != "fine" {
		t.Errorf("a condition that held: %v %q", held, said)
	}
}
