// Package kubeapis knows which Kubernetes API versions a minor stops
// serving, and checks a release's objects against them and against what
// the cluster serves.
//
// What it knows comes from k8s.io/api itself: each built-in type carries
// the minors that deprecate and remove it and its replacement (the
// prerelease-lifecycle methods generated from its types.go). Only the
// versions whose Go types are gone from k8s.io/api are listed by hand
// (gone.go).
package kubeapis

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"

	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/version"
	"k8s.io/client-go/kubernetes/scheme"
)

// Minor is a Kubernetes 1.x minor version; zero means none.
type Minor int

// ParseMinor reads "1.38", "v1.38.2" or "1.38.0-rc.1" (and a provider's
// "1.38+"): the major must be 1.
func ParseMinor(s string) (Minor, error) {
	v := strings.TrimPrefix(strings.TrimSpace(s), "v")
	major, rest, ok := strings.Cut(v, ".")
	if !ok || major != "1" {
		return 0, fmt.Errorf("%q is not a Kubernetes version: write 1.MINOR, e.g. 1.38", s)
	}
	end := strings.IndexFunc(rest, func(r rune) bool { return r < '0' || r > '9' })
	if end < 0 {
		end = len(rest)
	}
	m, err := strconv.Atoi(rest[:end])
	if err != nil || m <= 0 || m > 999 {
		return 0, fmt.Errorf("%q is not a Kubernetes version: write 1.MINOR, e.g. 1.38", s)
	}
	return Minor(m), nil
}

// FromServer is the minor of a version the API server reports (its
// /version major and minor fields; the minor may carry a "+").
func FromServer(major, minor string) (Minor, error) {
	return ParseMinor(major + "." + minor)
}

func (m Minor) String() string {
	if m == 0 {
		return ""
	}
	return "1." + strconv.Itoa(int(m))
}

// Lifecycle is what Kubernetes says of one API version of a kind.
type Lifecycle struct {
	Group, Version, Kind string
	// Deprecated and Removed are the minors that deprecate the version
	// and stop serving it (zero: none planned).
	Deprecated, Removed Minor
	// Replacement is the kind's served successor ("" when there is none).
	Replacement schema.GroupVersionKind
	// Source says where this was read from.
	Source string
}

// APIVersion is the lifecycle's group/version as a manifest writes it.
func (l Lifecycle) APIVersion() string {
	return schema.GroupVersion{Group: l.Group, Version: l.Version}.String()
}

// ReplacementAPIVersion is the replacement's apiVersion ("" when none).
func (l Lifecycle) ReplacementAPIVersion() string {
	if l.Replacement.Empty() {
		return ""
	}
	return l.Replacement.GroupVersion().String()
}

// The prerelease-lifecycle methods of k8s.io/api's types.
type (
	deprecatedIn interface{ APILifecycleDeprecated() (int, int) }
	removedIn    interface{ APILifecycleRemoved() (int, int) }
	replacedBy   interface {
		APILifecycleReplacement() schema.GroupVersionKind
	}
)

// Lookup returns what Kubernetes says of gvk's version; false for a kind
// Kubernetes does not define (a CRD's) and for versions with no planned
// removal (GA APIs).
func Lookup(gvk schema.GroupVersionKind) (Lifecycle, bool) {
	if l, ok := gone[gvk]; ok {
		return l, true
	}
	obj, err := scheme.Scheme.New(gvk)
	if err != nil {
		return Lifecycle{}, false
	}
	l := Lifecycle{Group: gvk.Group, Version: gvk.Version, Kind: gvk.Kind, Source: "k8s.io/api"}
	if r, ok := obj.(removedIn); ok {
		if major, minor := r.APILifecycleRemoved(); major == 1 {
			l.Removed = Minor(minor)
		}
	}
	if l.Removed == 0 {
		return Lifecycle{}, false
	}
	if d, ok := obj.(deprecatedIn); ok {
		if major, minor := d.APILifecycleDeprecated(); major == 1 {
			l.Deprecated = Minor(minor)
		}
	}
	if r, ok := obj.(replacedBy); ok {
		l.Replacement = r.APILifecycleReplacement()
	}
	if l.Replacement.Empty() {
		// Not every type names its successor (resource.k8s.io/v1beta1
		// DeviceClass does not): then it is the kind's most stable version
		// that k8s.io/api defines with no removal planned.
		l.Replacement = stableVersion(gvk.GroupKind())
	}
	return l, true
}

// stableVersions is, by group and kind, the most stable version k8s.io/api
// defines with no removal planned.
var stableVersions = sync.OnceValue(func() map[schema.GroupKind]string {
	out := map[schema.GroupKind]string{}
	for gvk := range scheme.Scheme.AllKnownTypes() {
		if gvk.Version == runtime.APIVersionInternal {
			continue
		}
		obj, err := scheme.Scheme.New(gvk)
		if err != nil {
			continue
		}
		if r, ok := obj.(removedIn); ok {
			if major, _ := r.APILifecycleRemoved(); major != 0 {
				continue
			}
		}
		gk := gvk.GroupKind()
		if have, ok := out[gk]; !ok || version.CompareKubeAwareVersionStrings(gvk.Version, have) > 0 {
			out[gk] = gvk.Version
		}
	}
	return out
})

func stableVersion(gk schema.GroupKind) schema.GroupVersionKind {
	v, ok := stableVersions()[gk]
	if !ok {
		return schema.GroupVersionKind{}
	}
	return gk.WithVersion(v)
}

// Use is a kind of a release's objects whose API version Kubernetes
// removes (or has removed), and whether the cluster serves it.
type Use struct {
	Lifecycle
	// Objects counts the release's objects of the kind at this version.
	Objects int
	// Served: the cluster serves the version now.
	Served bool
}

// Breaks reports whether the use stops working on the target minor: the
// minor removes it, or the cluster no longer serves it.
func (u Use) Breaks(target Minor) bool {
	return !u.Served || (u.Removed != 0 && target >= u.Removed)
}

// Due reports whether the use needs attention on a cluster at minor: the
// cluster no longer serves it, the minor deprecates it, or the next
// minor removes it.
func (u Use) Due(cluster Minor) bool {
	if !u.Served {
		return true
	}
	if cluster == 0 {
		return false
	}
	return (u.Deprecated != 0 && u.Deprecated <= cluster) || (u.Removed != 0 && u.Removed <= cluster+1)
}

// Uses returns the kinds of gvks (a release's objects, repeated per
// object) that Kubernetes removes, counted, with served's answer for
// each, ordered by removal and then by name. served is asked once per kind.
func Uses(gvks []schema.GroupVersionKind, served func(schema.GroupVersionKind) bool) []Use {
	byKind := map[schema.GroupVersionKind]int{}
	var out []Use
	for _, gvk := range gvks {
		if i, ok := byKind[gvk]; ok {
			out[i].Objects++
			continue
		}
		l, ok := Lookup(gvk)
		if !ok {
			continue
		}
		byKind[gvk] = len(out)
		out = append(out, Use{Lifecycle: l, Objects: 1, Served: served == nil || served(gvk)})
	}
	slices.SortFunc(out, func(a, b Use) int {
		if a.Removed != b.Removed {
			return int(a.Removed) - int(b.Removed)
		}
		return strings.Compare(a.APIVersion()+"/"+a.Kind, b.APIVersion()+"/"+b.Kind)
	})
	return out
}

// Describe is one line for people: the kind, what removes it and what
// replaces it.
func (u Use) Describe() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s %s", u.APIVersion(), u.Kind)
	if u.Objects > 1 {
		fmt.Fprintf(&b, " (%d objects)", u.Objects)
	}
	switch {
	case !u.Served:
		b.WriteString(" is not served by this cluster")
	case u.Removed != 0:
		fmt.Fprintf(&b, " is removed in Kubernetes %s", u.Removed)
	}
	if r := u.ReplacementAPIVersion(); r != "" {
		fmt.Fprintf(&b, ": use %s %s", r, u.Replacement.Kind)
	} else {
		b.WriteString(": it has no replacement")
	}
	return b.String()
}
