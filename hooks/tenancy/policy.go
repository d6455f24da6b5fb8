package tenancy

import (
	"fmt"
	"slices"
	"strings"

	"github.com/Masterminds/semver/v3"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/chartpilot/chartpilot/hooks"
	"github.com/chartpilot/chartpilot/internal/api/v1alpha1"
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
}

// evaluate runs every check and returns the first refusal.
func evaluate(t *v1alpha1.Tenant, obj hooks.Object) (reason, msg string, ok bool) {
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
// other resource of the tenant.
func checkTotalStorage(t *v1alpha1.Tenant, obj hooks.Object, others int64) (string, string, bool) {
	max := t.Spec.Limits.MaxTotalStorage
	total := others + storageOf(obj.Facts)
	if max == nil || total <= max.Value() {
		return "", "", true
	}
	return "MaxTotalStorageExceeded", fmt.Sprintf("storage %s of this resource brings tenant %s to %s, over its limits.maxTotalStorage %s",
		bytes(storageOf(obj.Facts)), t.Name, bytes(total), max.String()), false
}

func bytes(n int64) string { return resource.NewQuantity(n, resource.BinarySI).String() }

func max64(a, b int64) int64 { return max(a, b) }
