package kinds

import (
	"encoding/json"
	"testing"
)

// FuzzGenericFacts: the facts of any passthrough values are read without a panic.
func FuzzGenericFacts(f *testing.F) {
	f.Add(`{"replicas":3,"persistence":{"size":"8Gi","storageClass":"fast"},"resources":{"limits":{"cpu":"500m","memory":"1Gi"}}}`)
	f.Add(`{"replicaCount":1e300,"storage":{"enabled":false,"size":"x"},"resources":{"requests":{"cpu":[]}}}`)
	f.Fuzz(func(t *testing.T, values string) {
		var vals map[string]any
		if json.Unmarshal([]byte(values), &vals) != nil {
			return
		}
		_ = GenericFacts(nil, vals)
	})
}
