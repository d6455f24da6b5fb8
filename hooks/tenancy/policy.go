package tenancy

import (
	"fmt"
	corev1 "k8s.io/api/core/v1"
	"slices"
	"strings"

	"github.com/Masterminds/semver/v3"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/chartpilot/chartpilot/internal/api/v1alpha1"
	"github.com/chartpilot/chartpilot/internal/hooks"
)

// check is one limit: pure, from the tenant and a resource's facts to a
// verdict (reason, message, ok). Messages name the limit and the value.
type check func(t *v1alpha1.Tenant, obj hooks.Object) (reason, msg string, ok bool)

// checks are the per-resource limits, in the order they are reported.
var checks = []check{
	checkMaxReplicas,
	checkStorageClass,
	checkMaxStorage,
	checkVersions,
	checkMaxCPU,
	checkMaxMemory,
	checkPriorityClass,
	checkTolerations,
	checkNodePlacement,
}

// Evaluate runs every check and returns the first refusal.
func Evaluate(t *v1alpha1.Tenant, obj hooks.Object) (reason, msg string, ok bool) {
	for _, c := range checks {
		if reason, msg, ok := c(t, obj); !ok {
			return reason, msg, false
		}
	}
	return "", "", true
}

func checkMaxReplicas(t *v1alpha1.Tenant, obj hooks.Object) (string, string, bool) {
	max := t.Spec.Limits.MaxReplicas
	if max == nil || obj.Facts.Replicas <= *max {
		return "", "", true
	}
	return "MaxReplicasExceeded", fmt.Sprintf("replicas %d exceeds tenant %s's limits.maxReplicas %d", obj.Facts.Replicas, t.Name, *max), false
}

// effectiveStorageClass is the class a resource asks for, or the tenant's default.
func effectiveStorageClass(t *v1alpha1.Tenant, f hooks.Facts) string {
	if f.StorageClass != "" {
		return f.StorageClass
	}
	return t.Spec.Limits.DefaultStorageClass
}

func checkStorageClass(t *v1alpha1.Tenant, obj hooks.Object) (string, string, bool) {
	allowed := t.Spec.Limits.AllowedStorageClasses
	if len(allowed) == 0 || obj.Facts.StorageBytes == 0 {
		return "", "", true
	}
	class := effectiveStorageClass(t, obj.Facts)
	if slices.Contains(allowed, class) {
		return "", "", true
	}
	if class == "" {
		class = "(the cluster default)"
	}
	return "StorageClassNotAllowed", fmt.Sprintf("storage class %s is not in tenant %s's limits.allowedStorageClasses [%s]", class, t.Name, strings.Join(allowed, ", ")), false
}

// storageOf is a resource's total storage: per-pod size times replicas.
func storageOf(f hooks.Facts) int64 {
	return f.StorageBytes * max(1, f.Replicas)
}

func checkMaxStorage(t *v1alpha1.Tenant, obj hooks.Object) (string, string, bool) {
	max := t.Spec.Limits.MaxStorage
	total := storageOf(obj.Facts)
	if max == nil || total <= max.Value() {
		return "", "", true
	}
	return "MaxStorageExceeded", fmt.Sprintf("storage %s (%d replicas x %s) exceeds tenant %s's limits.maxStorage %s",
		bytes(total), max64(1, obj.Facts.Replicas), bytes(obj.Facts.StorageBytes), t.Name, max.String()), false
}

func checkVersions(t *v1alpha1.Tenant, obj hooks.Object) (string, string, bool) {
	constraint := t.Spec.Limits.AllowedVersions
	if constraint == "" {
		return "", "", true
	}
	c, err := semver.NewConstraint(constraint)
	if err != nil {
		return "TenantInvalid", fmt.Sprintf("tenant %s's limits.allowedVersions %q is not a semver constraint: %v", t.Name, constraint, err), false
	}
	// A kind that names its software version (Postgres spec.version) is
	// held to the constraint by that version; any other by its chart's.
	v := struct{ what, version string }{"chart version", obj.ChartVersion}
	if obj.Facts.Version != "" {
		v = struct{ what, version string }{"version", obj.Facts.Version}
	}
	if v.version != "" {
		sv, err := semver.NewVersion(v.version)
		if err != nil {
			return "VersionNotAllowed", fmt.Sprintf("%s %q is not a semantic version, so tenant %s's limits.allowedVersions %q cannot admit it", v.what, v.version, t.Name, constraint), false
		}
		if !c.Check(sv) {
			return "VersionNotAllowed", fmt.Sprintf("%s %s is outside tenant %s's limits.allowedVersions %q", v.what, v.version, t.Name, constraint), false
		}
	}
	return "", "", true
}

func checkMaxCPU(t *v1alpha1.Tenant, obj hooks.Object) (string, string, bool) {
	max := t.Spec.Limits.MaxCPU
	if max == nil || obj.Facts.CPUMilli <= max.MilliValue() {
		return "", "", true
	}
	return "MaxCPUExceeded", fmt.Sprintf("CPU %s per pod exceeds tenant %s's limits.maxCPU %s",
		resource.NewMilliQuantity(obj.Facts.CPUMilli, resource.DecimalSI).String(), t.Name, max.String()), false
}

func checkMaxMemory(t *v1alpha1.Tenant, obj hooks.Object) (string, string, bool) {
	max := t.Spec.Limits.MaxMemory
	if max == nil || obj.Facts.MemoryBytes <= max.Value() {
		return "", "", true
	}
	return "MaxMemoryExceeded", fmt.Sprintf("memory %s per pod exceeds tenant %s's limits.maxMemory %s",
		bytes(obj.Facts.MemoryBytes), t.Name, max.String()), false
}

// checkTotalStorage checks the tenant-wide limit given the storage of every
// other resource of the tenant and the claims that no resource accounts
// for (extra, see tenantStorage).
func checkPriorityClass(t *v1alpha1.Tenant, obj hooks.Object) (string, string, bool) {
	allowed, asked := t.Spec.Limits.AllowedPriorityClasses, obj.Facts.PriorityClassName
	if len(allowed) == 0 || asked == "" || slices.Contains(allowed, asked) {
		return "", "", true
	}
	return "PriorityClassNotAllowed", fmt.Sprintf("priorityClassName %s is not in tenant %s's limits.allowedPriorityClasses [%s]", asked, t.Name, strings.Join(allowed, ", ")), false
}

func checkTolerations(t *v1alpha1.Tenant, obj hooks.Object) (string, string, bool) {
	allowed := t.Spec.Limits.AllowedTolerationKeys
	if len(allowed) == 0 {
		return "", "", true
	}
	for _, key := range obj.Facts.TolerationKeys {
		switch {
		case key == "" && !slices.Contains(allowed, "*"):
			return "TolerationNotAllowed", fmt.Sprintf("a toleration without a key (it tolerates every taint) needs \"*\" in tenant %s's limits.allowedTolerationKeys [%s]", t.Name, strings.Join(allowed, ", ")), false
		case key != "" && !slices.Contains(allowed, key):
			return "TolerationNotAllowed", fmt.Sprintf("toleration key %s is not in tenant %s's limits.allowedTolerationKeys [%s]", key, t.Name, strings.Join(allowed, ", ")), false
		}
	}
	return "", "", true
}

func checkNodePlacement(t *v1alpha1.Tenant, obj hooks.Object) (string, string, bool) {
	if !t.Spec.Limits.DenyNodePlacement || len(obj.Facts.NodePlacement) == 0 {
		return "", "", true
	}
	return "NodePlacementNotAllowed", fmt.Sprintf("%s is set, and tenant %s's limits.denyNodePlacement leaves where its pods run to the Tenant's values: remove it", strings.Join(obj.Facts.NodePlacement, " and "), t.Name), false
}

func checkTotalStorage(t *v1alpha1.Tenant, obj hooks.Object, others int64) (string, string, bool) {
	max := t.Spec.Limits.MaxTotalStorage
	total := others + storageOf(obj.Facts)
	if max == nil || total <= max.Value() {
		return "", "", true
	}
	return "MaxTotalStorageExceeded", fmt.Sprintf("storage %s of this resource brings tenant %s to %s (claims kept after deletes, major upgrades and restores count too), over its limits.maxTotalStorage %s",
		bytes(storageOf(obj.Facts)), t.Name, bytes(total), max.String()), false
}

// LabelInstance is the label by which a claim is known as a resource's
// (the release's name on the pods of every shipped chart and most public
// ones, which StatefulSets copy to their claims).
const LabelInstance = "app.kubernetes.io/instance"

// claimSize is what a claim holds: its capacity once bound, its request
// before (the larger of the two).
func claimSize(c corev1.PersistentVolumeClaim) int64 {
	req := c.Spec.Resources.Requests[corev1.ResourceStorage]
	capacity := c.Status.Capacity[corev1.ResourceStorage]
	return max(req.Value(), capacity.Value())
}

// TenantStorage is the storage of a tenant's resources and claims: each
// resource counts the larger of what its spec asks for and what the claims
// labelled with its name hold (a kept old volume, a grown one), and a
// claim of no resource counts whole (a resource deleted with its claims
// kept, a restore's claim). except, when set, is left out: a resource
// whose spec is being checked; its own claims then count with it
// (exceptClaims), not here.
func TenantStorage(resources []hooks.Object, claims []corev1.PersistentVolumeClaim, except *hooks.Object) (total, exceptClaims int64) {
	type key struct{ ns, name string }
	held := map[key]int64{}
	for _, c := range claims {
		held[key{c.Namespace, c.Labels[LabelInstance]}] += claimSize(c)
	}
	var unlabelled int64
	for _, c := range claims {
		if c.Labels[LabelInstance] == "" {
			unlabelled += claimSize(c)
		}
	}
	accounted := map[key]bool{}
	if except != nil {
		k := key{except.Resource.GetNamespace(), except.Resource.GetName()}
		exceptClaims, accounted[k] = held[k], true
	}
	for _, o := range resources {
		k := key{o.Resource.GetNamespace(), o.Resource.GetName()}
		if accounted[k] {
			continue
		}
		accounted[k] = true
		total += max(storageOf(o.Facts), held[k])
	}
	for k, n := range held {
		if k.name != "" && !accounted[k] {
			total += n
		}
	}
	return total + unlabelled, exceptClaims
}

func bytes(n int64) string { return resource.NewQuantity(n, resource.BinarySI).String() }

func max64(a, b int64) int64 { return max(a, b) }
