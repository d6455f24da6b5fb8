// Package values layers chart values and hashes a release's inputs.
//
// Layers, lowest to highest: chart defaults (applied by Helm),
// the custom resource (translator or spec as-is), hook contributions, tenant
// overrides, and watches.yaml overrideValues.
package values

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"sort"
)

// Layer is one named source of values.
type Layer struct {
	// Name says where the values came from ("cr", "hook:monitoring", "tenant:acme", "overrides").
	Name   string
	Values map[string]any
}

// Merge deep-merges layers in order; a later layer wins. Maps merge key by
// key; any other value (lists included) replaces what was below. A null in a
// higher layer removes the key, as in Helm. The inputs are not modified.
func Merge(layers ...Layer) map[string]any {
	out := map[string]any{}
	for _, l := range layers {
		mergeInto(out, l.Values, false)
	}
	return out
}

// Compose deep-merges the parts of one layer (a tenant's several values
// entries, say) the way Merge does, except that a null is kept: it must
// still remove the key from the layers below when the layer is merged.
func Compose(parts ...map[string]any) map[string]any {
	out := map[string]any{}
	for _, p := range parts {
		mergeInto(out, p, true)
	}
	return out
}

func mergeInto(dst, src map[string]any, keepNull bool) {
	for k, v := range src {
		if v == nil {
			if keepNull {
				dst[k] = nil
			} else {
				delete(dst, k)
			}
			continue
		}
		if sm, ok := v.(map[string]any); ok {
			if dm, ok := dst[k].(map[string]any); ok {
				mergeInto(dm, sm, keepNull)
				continue
			}
			nm := map[string]any{}
			mergeInto(nm, sm, keepNull)
			dst[k] = nm
			continue
		}
		dst[k] = copyValue(v)
	}
}

func copyValue(v any) any {
	switch t := v.(type) {
	case map[string]any:
		m := map[string]any{}
		mergeInto(m, t, true)
		return m
	case []any:
		l := make([]any, len(t))
		for i := range t {
			l[i] = copyValue(t[i])
		}
		return l
	default:
		return v
	}
}

// DigestLength is the number of hex digits of a digest: it is stored as a
// label value on release records, which allows at most 63 characters.
const DigestLength = 40

// Digest hashes everything a release is made from: the chart's content
// digest, the final values and the operator-relevant annotations. Equal
// inputs give equal digests whatever the map order; numbers that JSON cannot
// tell apart (1 and 1.0) hash the same.
func Digest(chartDigest string, vals map[string]any, annotations map[string]string) (string, error) {
	h := sha256.New()
	fmt.Fprintf(h, "chart\x00%s\x00", chartDigest)
	b, err := json.Marshal(vals) // encoding/json sorts map keys
	if err != nil {
		return "", fmt.Errorf("hashing values: %w", err)
	}
	h.Write([]byte("values\x00"))
	h.Write(b)
	keys := make([]string, 0, len(annotations))
	for k := range annotations {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		fmt.Fprintf(h, "\x00ann\x00%s\x00%s", k, annotations[k])
	}
	return hex.EncodeToString(h.Sum(nil))[:DigestLength], nil
}

// Number reads a numeric value as decoded from YAML or JSON (ints, floats,
// json.Number).
func Number(v any) (float64, bool) {
	switch n := v.(type) {
	case int:
		return float64(n), true
	case int32:
		return float64(n), true
	case int64:
		return float64(n), true
	case float64:
		return n, true
	case json.Number:
		f, err := n.Float64()
		return f, err == nil
	}
	return 0, false
}
