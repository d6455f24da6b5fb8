package watches

import (
	"fmt"
	"sort"
	"strings"

	"k8s.io/apimachinery/pkg/util/validation"
)

// SecretValue is an overrideValues entry whose value is read from a Secret
// when a release's values are composed:
//
//	overrideValues:
//	  auth:
//	    password:
//	      valueFrom:
//	        secretKeyRef: {namespace: chartpilot-system, name: redis-auth, key: password}
//
// so that a secret never sits in watches.yaml or the operator's environment.
type SecretValue struct {
	// Path is the keys from the top of the values to the entry.
	Path []string
	// Namespace, Name and Key locate the value.
	Namespace, Name, Key string
}

// Field names the entry as watches.yaml does, e.g. overrideValues.auth.password.
func (s SecretValue) Field() string { return "overrideValues." + strings.Join(s.Path, ".") }

// takeSecretValues removes every valueFrom entry from vals (a map made by
// expandEnv, so owned here) and returns them, validated.
func takeSecretValues(vals map[string]any, path []string) ([]SecretValue, error) {
	keys := make([]string, 0, len(vals))
	for k := range vals {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var out []SecretValue
	for _, k := range keys {
		p := append(append([]string{}, path...), k)
		field := "overrideValues." + strings.Join(p, ".")
		switch v := vals[k].(type) {
		case map[string]any:
			if from, ok := v["valueFrom"]; ok {
				sv, err := secretValue(from, field)
				if err != nil {
					return nil, err
				}
				if len(v) != 1 {
					return nil, fmt.Errorf("field %s: valueFrom must be the only key of its entry", field)
				}
				sv.Path = p
				out = append(out, sv)
				delete(vals, k)
				continue
			}
			more, err := takeSecretValues(v, p)
			if err != nil {
				return nil, err
			}
			out = append(out, more...)
		case []any:
			if hasValueFrom(v) {
				return nil, fmt.Errorf("field %s: valueFrom is not supported inside a list: move the value to a map key", field)
			}
		}
	}
	return out, nil
}

// hasValueFrom reports whether v holds a valueFrom key at any depth.
func hasValueFrom(v any) bool {
	switch t := v.(type) {
	case map[string]any:
		if _, ok := t["valueFrom"]; ok {
			return true
		}
		for _, x := range t {
			if hasValueFrom(x) {
				return true
			}
		}
	case []any:
		for _, x := range t {
			if hasValueFrom(x) {
				return true
			}
		}
	}
	return false
}

// secretValue reads {secretKeyRef: {namespace, name, key}}.
func secretValue(from any, field string) (SecretValue, error) {
	const want = "write valueFrom: {secretKeyRef: {namespace: ..., name: ..., key: ...}}"
	m, ok := from.(map[string]any)
	if !ok || len(m) != 1 {
		return SecretValue{}, fmt.Errorf("field %s.valueFrom: %s", field, want)
	}
	ref, ok := m["secretKeyRef"].(map[string]any)
	if !ok {
		return SecretValue{}, fmt.Errorf("field %s.valueFrom: %s", field, want)
	}
	var sv SecretValue
	for k, v := range ref {
		s, ok := v.(string)
		if !ok {
			return SecretValue{}, fmt.Errorf("field %s.valueFrom.secretKeyRef.%s: not a string", field, k)
		}
		switch k {
		case "namespace":
			sv.Namespace = s
		case "name":
			sv.Name = s
		case "key":
			sv.Key = s
		default:
			return SecretValue{}, fmt.Errorf("field %s.valueFrom.secretKeyRef.%s: unknown field (namespace, name, key)", field, k)
		}
	}
	if errs := validation.IsDNS1123Label(sv.Namespace); len(errs) > 0 {
		return SecretValue{}, fmt.Errorf("field %s.valueFrom.secretKeyRef.namespace %q: name the Secret's namespace (%s)", field, sv.Namespace, strings.Join(errs, "; "))
	}
	if errs := validation.IsDNS1123Subdomain(sv.Name); len(errs) > 0 {
		return SecretValue{}, fmt.Errorf("field %s.valueFrom.secretKeyRef.name %q: not a Secret name (%s)", field, sv.Name, strings.Join(errs, "; "))
	}
	if errs := validation.IsConfigMapKey(sv.Key); len(errs) > 0 {
		return SecretValue{}, fmt.Errorf("field %s.valueFrom.secretKeyRef.key %q: not a Secret key (%s)", field, sv.Key, strings.Join(errs, "; "))
	}
	return sv, nil
}
