package helm

import (
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// countingMapper is a fixed mapper that counts the RESTMapping questions
// that reach it, and its resets.
type countingMapper struct {
	meta.RESTMapper
	asked, resets int
}

func (c *countingMapper) RESTMapping(gk schema.GroupKind, versions ...string) (*meta.RESTMapping, error) {
	c.asked++
	return c.RESTMapper.RESTMapping(gk, versions...)
}

func (c *countingMapper) Reset() { c.resets++ }

// TestMapperRemembersMappingsUntilReset: a mapping asked again is
// answered from memory, as a copy its caller may change; a Reset (which a
// kind not found triggers) forgets it; a kind not found is never
// remembered.
func TestMapperRemembersMappingsUntilReset(t *testing.T) {
	gv := schema.GroupVersion{Group: "apps", Version: "v1"}
	def := meta.NewDefaultRESTMapper([]schema.GroupVersion{gv})
	def.Add(gv.WithKind("Deployment"), meta.RESTScopeNamespace)
	c := &countingMapper{RESTMapper: def}
	m := &rediscoveringMapper{ResettableRESTMapper: c}
	gk := schema.GroupKind{Group: "apps", Kind: "Deployment"}

	first, err := m.RESTMapping(gk, "v1")
	if err != nil {
		t.Fatal(err)
	}
	first.Resource.Resource = "changed-by-a-caller"
	second, err := m.RESTMapping(gk, "v1")
	if err != nil || second.Resource.Resource != "deployments" {
		t.Fatalf("second answer %+v, %v: want deployments, unchanged by the first caller", second, err)
	}
	if c.asked != 1 {
		t.Errorf("the mapper was asked %d times, want 1", c.asked)
	}
	if _, err := m.RESTMapping(gk); err != nil || c.asked != 2 {
		t.Errorf("other versions are another question: asked %d, %v", c.asked, err)
	}
	m.Reset()
	if _, err := m.RESTMapping(gk, "v1"); err != nil || c.asked != 3 || c.resets != 1 {
		t.Errorf("after a reset: asked %d, resets %d, %v; want the mapper asked again", c.asked, c.resets, err)
	}
	m.last = time.Now() // discovery was just read again: no new round for the missing kind
	missing := schema.GroupKind{Group: "example.com", Kind: "Missing"}
	for range 2 {
		if _, err := m.RESTMapping(missing); !meta.IsNoMatchError(err) {
			t.Fatalf("a kind not known: %v", err)
		}
	}
	if c.asked != 5 {
		t.Errorf("a kind not found was answered from memory: asked %d, want 5", c.asked)
	}
}
