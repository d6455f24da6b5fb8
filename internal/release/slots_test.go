package release

import (
	"slices"
	"testing"

	"k8s.io/apimachinery/pkg/types"
)

func TestSlots(t *testing.T) {
	k := func(n string) types.NamespacedName { return types.NamespacedName{Namespace: "ns", Name: n} }
	var woken []string
	inUse := -1
	s := &slots{max: 2, wake: func(key types.NamespacedName) { woken = append(woken, key.Name) }, inUse: func(n int) { inUse = n }}
	if !s.begin(k("a")) || !s.begin(k("b")) {
		t.Fatal("two slots of two should be granted")
	}
	if !s.begin(k("a")) {
		t.Error("a resource holding a slot keeps it on its next pass")
	}
	if s.free(k("c")) || s.begin(k("c")) {
		t.Fatal("a third upgrade must wait")
	}
	s.enqueue(k("c"))
	s.enqueue(k("d"))
	s.enqueue(k("c"))
	if inUse != 2 {
		t.Errorf("in use %d, want 2", inUse)
	}
	s.end(k("a"))
	if !slices.Equal(woken, []string{"c"}) {
		t.Errorf("a freed slot woke %v, want the longest-queued [c]", woken)
	}
	if !s.begin(k("c")) {
		t.Fatal("the woken resource gets the free slot")
	}
	if slices.Contains(s.queue, k("c")) {
		t.Error("a resource that took a slot leaves the queue")
	}
	// An upgrade found settling after a restart is counted beyond the bound.
	s.hold(k("e"))
	if inUse != 3 || s.free(k("d")) {
		t.Errorf("in use %d, free for d %v: want 3 and no slot", inUse, s.free(k("d")))
	}
	woken = nil
	s.forget(k("b"))
	s.end(k("e"))
	if !slices.Equal(woken, []string{"d"}) {
		t.Errorf("woken %v after two slots freed with one queued, want [d]", woken)
	}
	s.end(k("nobody"))
	if inUse != 1 {
		t.Errorf("in use %d after ending an unknown key, want 1", inUse)
	}
}

func TestSlotReservation(t *testing.T) {
	k := func(n string) types.NamespacedName { return types.NamespacedName{Namespace: "ns", Name: n} }
	var woken []string
	s := &slots{max: 1, wake: func(key types.NamespacedName) { woken = append(woken, key.Name) }}
	newly, ok := s.reserve(k("a"))
	if !newly || !ok {
		t.Fatalf("reserve of a free slot = (%v, %v), want (true, true)", newly, ok)
	}
	// Another pass of the same resource (or its upgrade) finds its slot
	// held and must not give it back at its end.
	if newly, ok := s.reserve(k("a")); newly || !ok {
		t.Errorf("reserve of a held slot = (%v, %v), want (false, true)", newly, ok)
	}
	if !s.begin(k("a")) {
		t.Error("the reserving resource's upgrade gets its slot")
	}
	if newly, ok := s.reserve(k("b")); newly || ok {
		t.Fatalf("reserve beyond the bound = (%v, %v), want (false, false)", newly, ok)
	}
	s.enqueue(k("b"))
	// A reservation given back (no upgrade began) wakes the queue.
	s.end(k("a"))
	if !slices.Equal(woken, []string{"b"}) {
		t.Errorf("a returned reservation woke %v, want [b]", woken)
	}
	if newly, ok := s.reserve(k("b")); !newly || !ok {
		t.Errorf("the woken resource's reserve = (%v, %v), want (true, true)", newly, ok)
	}
	if slices.Contains(s.queue, k("b")) {
		t.Error("a resource that reserved a slot leaves the queue")
	}
}
