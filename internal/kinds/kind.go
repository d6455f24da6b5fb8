// Package kinds is the contract a watched kind implements. A kind listed in
// watches.yaml with no Kind registered is passthrough: its spec is the
// chart's values. Typed kinds (internal/kinds/postgres) register a
// translator from their spec to values, their own status fields and the
// figures tenant policy checks.
package kinds

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/chartpilot/chartpilot/internal/api/v1alpha1"
	"github.com/chartpilot/chartpilot/internal/hooks"
	"github.com/chartpilot/chartpilot/internal/values"
)

// ValuesFunc turns a custom resource into its values layer.
type ValuesFunc func(obj *unstructured.Unstructured) (map[string]any, error)

// Kind customises a typed kind; the zero Kind is a passthrough kind.
type Kind struct {
	// Values makes the resource's values layer (default Passthrough).
	Values ValuesFunc
	// Status returns the kind's own status fields, written next to the
	// shared release status (a nil value removes a field), and how soon to
	// look again (0: not until the next action). It is called after each
	// action and then only while it asks to be called again, so a resting
	// resource costs no request.
	Status func(ctx context.Context, c client.Reader, obj *unstructured.Unstructured) (map[string]any, time.Duration, error)
	// Conditions derives the kind's own conditions from the fields Status
	// returned: a type mapped to nil is removed. Each condition's Status,
	// Reason and Message are used; the rest is the reconciler's.
	Conditions func(fields map[string]any) map[string]*metav1.Condition
	// Facts reads the policy-relevant figures of a resource (default:
	// GenericFacts from its values layer).
	Facts func(obj *unstructured.Unstructured, crValues map[string]any) hooks.Facts
	// AppMajor is the major version of the software the resource asks for
	// (PostgreSQL's spec.version), "" if the kind names none. A change of it
	// is a major upgrade under the same opt-in rule as a chart's major.
	AppMajor func(obj *unstructured.Unstructured) string
	// DeployedAppMajor reads the major version running from the resource's
	// status; it stands in for releases deployed before chartpilot labelled
	// release records with it.
	DeployedAppMajor func(obj *unstructured.Unstructured) string
	// Storage reads the per-pod data volume the resource asks for, for the
	// growth checks of admission; nil when the kind has no such field.
	Storage func(obj *unstructured.Unstructured) Storage
}

// Storage is a typed kind's data volume request and where it is set.
type Storage struct {
	// Size is a quantity ("10Gi"); Class a StorageClass name, "" for the
	// cluster's default.
	Size, Class string
	// SizeField and ClassField are the fields' paths, for messages.
	SizeField, ClassField string
	// AutoExpand is the automatic growth asked for (nil: none), and
	// AutoExpandField where it is set; AutoExpandErr a malformed one.
	AutoExpand      *v1alpha1.StorageAutoExpand
	AutoExpandField string
	AutoExpandErr   error
}

// PassthroughStorage reads the data volume size of a passthrough kind from
// the values path sizeValue (watches.yaml storage.sizeValue) and its
// automatic growth from the chartpilot.dev/auto-expand annotation.
func PassthroughStorage(sizeValue []string) func(obj *unstructured.Unstructured) Storage {
	return func(obj *unstructured.Unstructured) Storage {
		size, _, _ := unstructured.NestedString(obj.Object, append([]string{"spec"}, sizeValue...)...)
		st := Storage{Size: size, SizeField: "spec." + strings.Join(sizeValue, "."), AutoExpandField: "annotation " + v1alpha1.AnnotationAutoExpand}
		if a, ok := obj.GetAnnotations()[v1alpha1.AnnotationAutoExpand]; ok {
			st.AutoExpand, st.AutoExpandErr = ParseAutoExpand(a)
		}
		return st
	}
}

// ParseAutoExpand reads "max=20Gi,threshold=80,step=25%,window=10m" (only
// max is required).
func ParseAutoExpand(s string) (*v1alpha1.StorageAutoExpand, error) {
	a := &v1alpha1.StorageAutoExpand{Enabled: true}
	for _, part := range strings.Split(s, ",") {
		k, v, ok := strings.Cut(strings.TrimSpace(part), "=")
		if !ok || v == "" {
			return nil, fmt.Errorf("annotation %s: %q is not key=value: write max=20Gi[,threshold=80][,step=25%%][,window=10m]", v1alpha1.AnnotationAutoExpand, part)
		}
		switch k {
		case "max":
			a.Max = v
		case "step":
			a.Step = v
		case "threshold":
			n, err := strconv.Atoi(v)
			if err != nil || n < 50 || n > 99 {
				return nil, fmt.Errorf("annotation %s: threshold=%s must be a percentage from 50 to 99", v1alpha1.AnnotationAutoExpand, v)
			}
			a.ThresholdPercent = int32(n)
		case "window":
			d, err := time.ParseDuration(v)
			if err != nil || d < time.Minute {
				return nil, fmt.Errorf("annotation %s: window=%s must be a duration of at least 1m, such as 10m", v1alpha1.AnnotationAutoExpand, v)
			}
			a.Window = &metav1.Duration{Duration: d}
		default:
			return nil, fmt.Errorf("annotation %s: unknown key %q: the keys are max, threshold, step and window", v1alpha1.AnnotationAutoExpand, k)
		}
	}
	if a.Max == "" {
		return nil, fmt.Errorf("annotation %s: max is required: the largest size the volumes may grow to, e.g. max=20Gi", v1alpha1.AnnotationAutoExpand)
	}
	return a, nil
}

// Typed reports whether the kind has its own translator (spec fields such as
// spec.chartVersion then have a meaning of their own).
func (k Kind) Typed() bool { return k.Values != nil }

// Object is what hooks, admission and tenant policy see of a resource: the
// kind's values layer and the facts read from it, with the chart it runs
// (or would run). The values layer is returned too, for the release.
func (k Kind) Object(obj *unstructured.Unstructured, chartName, chartVersion string) (hooks.Object, map[string]any, error) {
	vf := k.Values
	if vf == nil {
		vf = Passthrough
	}
	vals, err := vf(obj)
	if err != nil {
		return hooks.Object{}, nil, err
	}
	facts := k.Facts
	if facts == nil {
		facts = GenericFacts
	}
	return hooks.Object{Resource: obj, Facts: facts(obj, vals), ChartName: chartName, ChartVersion: chartVersion}, vals, nil
}

// Passthrough uses the resource's spec as the chart values.
func Passthrough(obj *unstructured.Unstructured) (map[string]any, error) {
	spec, _, err := unstructured.NestedMap(obj.Object, "spec")
	if err != nil {
		return nil, fmt.Errorf("spec: %w", err)
	}
	if spec == nil {
		spec = map[string]any{}
	}
	return spec, nil
}

// GenericFacts reads policy figures from a passthrough resource's values,
// at the paths charts conventionally use: replicas (or replicaCount),
// storage.size / persistence.size (counted only when persistence is not
// disabled), their storageClass, resources.limits (else requests), and
// the scheduling fields (schedulingFacts).
func GenericFacts(_ *unstructured.Unstructured, vals map[string]any) hooks.Facts {
	f := hooks.Facts{}
	for _, k := range []string{"replicas", "replicaCount"} {
		if n, ok := values.Number(vals[k]); ok {
			f.Replicas = int64(n)
			break
		}
	}
	storageFacts(vals, &f)
	schedulingFacts(vals, &f)
	if res, ok := vals["resources"].(map[string]any); ok {
		for _, kind := range []string{"requests", "limits"} { // limits win
			m, ok := res[kind].(map[string]any)
			if !ok {
				continue
			}
			if q, ok := quantity(m["cpu"]); ok {
				f.CPUMilli = q.MilliValue()
			}
			if q, ok := quantity(m["memory"]); ok {
				f.MemoryBytes = q.Value()
			}
		}
	}
	return f
}

// schedulingFacts reads where a resource asks its pods to run, at the
// top-level paths charts conventionally use: priorityClassName,
// tolerations, nodeSelector and affinity.
func schedulingFacts(vals map[string]any, f *hooks.Facts) {
	if s, ok := vals["priorityClassName"].(string); ok {
		f.PriorityClassName = s
	}
	if ts, ok := vals["tolerations"].([]any); ok {
		for _, t := range ts {
			key := ""
			if m, ok := t.(map[string]any); ok {
				key, _ = m["key"].(string)
			}
			f.TolerationKeys = append(f.TolerationKeys, key)
		}
	}
	for _, k := range []string{"nodeSelector", "affinity"} {
		if m, ok := vals[k].(map[string]any); ok && len(m) > 0 {
			f.NodePlacement = append(f.NodePlacement, k)
		}
	}
}

// storageFacts reads the first of storage.* and persistence.* that is not
// disabled.
func storageFacts(vals map[string]any, f *hooks.Facts) {
	for _, base := range []string{"storage", "persistence"} {
		m, ok := vals[base].(map[string]any)
		if !ok {
			continue
		}
		if enabled, ok := m["enabled"].(bool); ok && !enabled {
			continue
		}
		if s, ok := m["size"].(string); ok {
			if q, err := resource.ParseQuantity(s); err == nil {
				f.StorageBytes = q.Value()
			}
		}
		if c, ok := m["storageClass"].(string); ok {
			f.StorageClass = c
		}
		f.StorageClassPath = []string{base, "storageClass"}
		return
	}
}

func quantity(v any) (resource.Quantity, bool) {
	switch t := v.(type) {
	case string:
		q, err := resource.ParseQuantity(t)
		return q, err == nil
	default:
		if n, ok := values.Number(v); ok {
			return *resource.NewMilliQuantity(int64(n*1000), resource.DecimalSI), true
		}
	}
	return resource.Quantity{}, false
}
