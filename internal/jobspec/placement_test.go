package jobspec

import (
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/chartpilot/chartpilot/internal/api/v1alpha1"
)

// TestJobsPlacedLikeTheirPostgres: a Postgres's Job takes its pods' node
// selector (a copy) and tolerations beside its own; a Postgres with
// neither leaves the Job unplaced.
func TestJobsPlacedLikeTheirPostgres(t *testing.T) {
	pg := &v1alpha1.Postgres{Spec: v1alpha1.PostgresSpec{
		NodeSelector: map[string]string{"pool": "databases"},
		Tolerations:  []corev1.Toleration{{Key: "databases", Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoSchedule}},
	}}
	job := placedLike(pg, agentJob("ns", "job", nil, "postgres:17", time.Hour, nil, nil, nil, nil))
	spec := job.Spec.Template.Spec
	if spec.NodeSelector["pool"] != "databases" || len(spec.Tolerations) != 1 || spec.Tolerations[0].Key != "databases" {
		t.Fatalf("the Job's pod: node selector %v, tolerations %v", spec.NodeSelector, spec.Tolerations)
	}
	pg.Spec.NodeSelector["pool"] = "changed"
	if spec.NodeSelector["pool"] != "databases" {
		t.Error("the Job shares the Postgres's node selector map")
	}
	bare := placedLike(&v1alpha1.Postgres{}, agentJob("ns", "job", nil, "postgres:17", time.Hour, nil, nil, nil, nil))
	if s := bare.Spec.Template.Spec; s.NodeSelector != nil || len(s.Tolerations) != 0 {
		t.Errorf("a Postgres without placement placed its Job: %v %v", s.NodeSelector, s.Tolerations)
	}
}
