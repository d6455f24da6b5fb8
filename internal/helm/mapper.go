package helm

import (
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
	m.ResettableRESTMapper.Reset()
	return true
}

func (m *rediscoveringMapper) RESTMapping(gk schema.GroupKind, versions ...string) (*meta.RESTMapping, error) {
	r, err := m.ResettableRESTMapper.RESTMapping(gk, versions...)
	if err != nil && m.again(err) {
		return m.ResettableRESTMapper.RESTMapping(gk, versions...)
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
