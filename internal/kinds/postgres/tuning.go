// Package postgres is the translator of the typed Postgres kind: it maps a
// PostgresSpec onto the values of charts/postgresql, derives postgresql.conf
// settings from the resources (auto-tuning), and reports endpoints, ready
// replicas and the chosen settings in status.
package postgres

import (
	"fmt"
	"math"
	"strconv"

	corev1 "k8s.io/api/core/v1"
)

// Tune derives postgresql.conf settings from the container's memory and CPU
// (limits, else requests), the way PGTune does for a general workload:
//
//	shared_buffers        = memory / 4                  (at least 32MB)
//	effective_cache_size  = memory * 3 / 4
//	maintenance_work_mem  = memory / 16                 (64MB .. 2GB)
//	max_connections       = memory in MiB / 16          (20 .. 400)
//	work_mem              = (memory - shared_buffers) / (3 * max_connections)   (at least 1MB;
//	                        max_connections as the user set it, if they did)
//	max_worker_processes  = CPUs rounded up             (at least 8)
//
// Without a memory figure nothing is tuned (the chart's defaults stay).
// Settings the user set in parameters are left out.
func Tune(res corev1.ResourceRequirements, userSet map[string]string) map[string]string {
	mem := quantityOf(res, corev1.ResourceMemory)
	if mem <= 0 {
		return nil
	}
	memMiB := mem / (1 << 20)
	shared := math.Max(32, memMiB/4)
	cache := memMiB * 3 / 4
	maint := math.Min(2048, math.Max(64, memMiB/16))
	conns := math.Min(400, math.Max(20, math.Floor(memMiB/16)))
	if v, err := strconv.ParseFloat(userSet["max_connections"], 64); err == nil && v > 0 {
		conns = v // work_mem is shared among the connections the server really allows
	}
	workKiB := math.Max(1024, math.Floor((memMiB-shared)*1024/(3*conns)))
	cpus := quantityOf(res, corev1.ResourceCPU)
	workers := math.Max(8, math.Ceil(cpus))

	out := map[string]string{
		"shared_buffers":       mb(shared),
		"effective_cache_size": mb(cache),
		"maintenance_work_mem": mb(maint),
		"max_connections":      fmt.Sprintf("%.0f", conns),
		"work_mem":             fmt.Sprintf("%.0fkB", workKiB),
		"max_worker_processes": fmt.Sprintf("%.0f", workers),
	}
	for k := range userSet {
		delete(out, k)
	}
	return out
}

func mb(v float64) string { return fmt.Sprintf("%.0fMB", math.Floor(v)) }

// quantityOf returns the limit of a resource, else its request, as a float
// (bytes for memory, cores for CPU); 0 when neither is set.
func quantityOf(res corev1.ResourceRequirements, name corev1.ResourceName) float64 {
	if q, ok := res.Limits[name]; ok {
		return q.AsApproximateFloat64()
	}
	if q, ok := res.Requests[name]; ok {
		return q.AsApproximateFloat64()
	}
	return 0
}
