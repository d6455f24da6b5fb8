package release

import (
	"slices"
	"sync"

	"k8s.io/apimachinery/pkg/types"
)

// slots bounds how many resources of a kind upgrade at once
// (maxConcurrentUpgrades). A slot is held from the upgrade until the new
// revision is healthy (or fails); resources that find no slot queue, and a
// freed slot wakes the longest-queued ones.
type slots struct {
	max int
	mu  sync.Mutex
	// held are the resources upgrading now.
	held map[types.NamespacedName]bool
	// queue holds the resources waiting for a slot, oldest first.
	queue []types.NamespacedName
	// wake is called for each queued resource a freed slot can take.
	wake func(types.NamespacedName)
	// inUse is told the number of held slots when it changes (metrics).
	inUse func(int)
}

// free reports whether key holds a slot or one is free (no reservation).
func (s *slots) free(key types.NamespacedName) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.held[key] || len(s.held) < s.max
}

// begin reserves a slot for key; false means the kind is at its bound.
func (s *slots) begin(key types.NamespacedName) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.held[key] {
		return true
	}
	if len(s.held) >= s.max {
		return false
	}
	s.holdLocked(key)
	return true
}

// reserve takes a slot for key before its upgrade is certain: newly is
// true when key held none (the caller gives it back with end if no
// upgrade begins); ok is false when the kind is at its bound.
func (s *slots) reserve(key types.NamespacedName) (newly, ok bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.held[key] {
		return false, true
	}
	if len(s.held) >= s.max {
		return false, false
	}
	s.holdLocked(key)
	return true, true
}

// hold counts key as upgrading even beyond the bound: its upgrade is
// already applied and settling, so new upgrades wait for it.
func (s *slots) hold(key types.NamespacedName) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.held[key] {
		s.holdLocked(key)
	}
}

func (s *slots) holdLocked(key types.NamespacedName) {
	if s.held == nil {
		s.held = map[types.NamespacedName]bool{}
	}
	s.held[key] = true
	s.dequeueLocked(key)
	s.report()
}

// end gives key's slot back and wakes queued resources for the free slots.
func (s *slots) end(key types.NamespacedName) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.held[key] {
		return
	}
	delete(s.held, key)
	s.report()
	free := s.max - len(s.held)
	for i := 0; s.wake != nil && i < free && i < len(s.queue); i++ {
		s.wake(s.queue[i])
	}
}

// enqueue puts key at the end of the queue (once).
func (s *slots) enqueue(key types.NamespacedName) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !slices.Contains(s.queue, key) {
		s.queue = append(s.queue, key)
	}
}

// dequeue takes key out of the queue.
func (s *slots) dequeue(key types.NamespacedName) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.dequeueLocked(key)
}

func (s *slots) dequeueLocked(key types.NamespacedName) {
	s.queue = slices.DeleteFunc(s.queue, func(k types.NamespacedName) bool { return k == key })
}

// forget gives back key's slot and queue place.
func (s *slots) forget(key types.NamespacedName) {
	s.dequeue(key)
	s.end(key)
}

func (s *slots) report() {
	if s.inUse != nil {
		s.inUse(len(s.held))
	}
}

// holds reports whether key holds a slot (it is upgrading).
func (s *slots) holds(key types.NamespacedName) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.held[key]
}
