package postgres

import (
	"reflect"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
)

func res(mem, cpu string, limits bool) corev1.ResourceRequirements {
	l := corev1.ResourceList{}
	if mem != "" {
		l[corev1.ResourceMemory] = resource.MustParse(mem)
	}
	if cpu != "" {
		l[corev1.ResourceCPU] = resource.MustParse(cpu)
	}
	if limits {
		return corev1.ResourceRequirements{Limits: l}
	}
	return corev1.ResourceRequirements{Requests: l}
}

func TestTune(t *testing.T) {
	for _, tc := range []struct {
		name string
		res  corev1.ResourceRequirements
		user map[string]string
		want map[string]string
	}{
		{"no memory: nothing tuned", res("", "2", true), nil, nil},
		{"256Mi, 500m", res("256Mi", "500m", true), nil, map[string]string{
			"shared_buffers": "64MB", "effective_cache_size": "192MB", "maintenance_work_mem": "64MB",
			"max_connections": "20", "work_mem": "3276kB", "max_worker_processes": "8",
		}},
		{"1Gi, 1 CPU", res("1Gi", "1", true), nil, map[string]string{
			"shared_buffers": "256MB", "effective_cache_size": "768MB", "maintenance_work_mem": "64MB",
			"max_connections": "64", "work_mem": "4096kB", "max_worker_processes": "8",
		}},
		{"4Gi, 4 CPU", res("4Gi", "4", true), nil, map[string]string{
			"shared_buffers": "1024MB", "effective_cache_size": "3072MB", "maintenance_work_mem": "256MB",
			"max_connections": "256", "work_mem": "4096kB", "max_worker_processes": "8",
		}},
		{"64Gi, 16 CPU: caps apply", res("64Gi", "16", true), nil, map[string]string{
			"shared_buffers": "16384MB", "effective_cache_size": "49152MB", "maintenance_work_mem": "2048MB",
			"max_connections": "400", "work_mem": "41943kB", "max_worker_processes": "16",
		}},
		{"requests when no limits", res("1Gi", "1", false), nil, map[string]string{
			"shared_buffers": "256MB", "effective_cache_size": "768MB", "maintenance_work_mem": "64MB",
			"max_connections": "64", "work_mem": "4096kB", "max_worker_processes": "8",
		}},
		{"user parameters win; work_mem follows the user's max_connections", res("1Gi", "1", true), map[string]string{"max_connections": "10", "shared_buffers": "1GB"}, map[string]string{
			"effective_cache_size": "768MB", "maintenance_work_mem": "64MB", "work_mem": "26214kB", "max_worker_processes": "8",
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := Tune(tc.res, tc.user)
			if !reflect.DeepEqual(got, tc.want) {
				t.Errorf("Tune = %v\nwant   %v", got, tc.want)
			}
		})
	}
}
