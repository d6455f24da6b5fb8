package helm

import (
	"strings"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/discovery"
)

// rediscoverEvery bounds how often a kind the mapper does not know makes
// it read discovery again: a chart naming kinds that do not exist costs at
// most one discovery round per period, not one per object.
const rediscoverEvery = 5 * time.Second

// rediscoveringMapper is a discovery-backed mapper that reads discovery
// again when asked for a kind it does not know, so that a kind whose CRD
// was installed after the operator started (the Prometheus Operator's
// ServiceMonitor, say) is found without a restart.
type rediscoveringMapper struct {
	meta.ResettableRESTMapper
	disc discovery.CachedDiscoveryInterface

	mu   sync.Mutex
	last time.Time

	// mappings remembers RESTMapping's answers (by group, kind and
	// versions) until the next Reset: the discovery mapper asks every
	// group's mapper in turn, and the "no match" errors of all the others
	// were 6 % of everything the manager allocated in an upgrade wave. gen
	// counts resets, so that an answer read before one is not kept after.
	mapMu    sync.RWMutex
	gen      uint64
	mappings map[string]meta.RESTMapping
}

// Reset forgets what discovery said, and the answers remembered from it.
func (m *rediscoveringMapper) Reset() {
	m.ResettableRESTMapper.Reset()
	m.mapMu.Lock()
	m.gen++
	m.mappings = nil
	m.mapMu.Unlock()
}

func (m *rediscoveringMapper) generation() uint64 {
	m.mapMu.RLock()
	defer m.mapMu.RUnlock()
	return m.gen
}

// again reports whether err is a kind not found and discovery was read
// again for it.
func (m *rediscoveringMapper) again(err error) bool {
	if !meta.IsNoMatchError(err) {
		return false
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if time.Since(m.last) < rediscoverEvery {
		return false
	}
	m.last = time.Now()
	m.disc.Invalidate()
	m.Reset()
	return true
}

func (m *rediscoveringMapper) RESTMapping(gk schema.GroupKind, versions ...string) (*meta.RESTMapping, error) {
	key := gk.String() + "/" + strings.Join(versions, ",")
	m.mapMu.RLock()
	known, ok := m.mappings[key]
	gen := m.gen
	m.mapMu.RUnlock()
	if ok {
		return &known, nil // a copy each time: callers own what they get
	}
	r, err := m.ResettableRESTMapper.RESTMapping(gk, versions...)
	if err != nil && m.again(err) {
		gen = m.generation()
		r, err = m.ResettableRESTMapper.RESTMapping(gk, versions...)
	}
	if err == nil && r != nil {
		m.mapMu.Lock()
		if m.gen == gen {
			if m.mappings == nil {
				m.mappings = map[string]meta.RESTMapping{}
			}
			m.mappings[key] = *r
		}
		m.mapMu.Unlock()
	}
	return r, err
}

func (m *rediscoveringMapper) RESTMappings(gk schema.GroupKind, versions ...string) ([]*meta.RESTMapping, error) {
	r, err := m.ResettableRESTMapper.RESTMappings(gk, versions...)
	if err != nil && m.again(err) {
		return m.ResettableRESTMapper.RESTMappings(gk, versions...)
	}
	return r, err
}

func (m *rediscoveringMapper) KindFor(resource schema.GroupVersionResource) (schema.GroupVersionKind, error) {
	k, err := m.ResettableRESTMapper.KindFor(resource)
	if err != nil && m.again(err) {
		return m.ResettableRESTMapper.KindFor(resource)
	}
	return k, err
}
