package backup

import (
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/chartpilot/chartpilot/internal/api/v1alpha1"
)

func TestServing(t *testing.T) {
	cond := func(typ string, s metav1.ConditionStatus, reason string) metav1.Condition {
		return metav1.Condition{Type: typ, Status: s, Reason: reason}
	}
	released := cond(v1alpha1.ConditionReleased, metav1.ConditionTrue, "UpgradeSucceeded")
	held := cond(v1alpha1.ConditionReady, metav1.ConditionFalse, conditionBeforeMajor)
	for _, tc := range []struct {
		name  string
		conds []metav1.Condition
		want  bool
	}{
		{"no status yet", nil, false},
		{"Ready", []metav1.Condition{cond(v1alpha1.ConditionReady, metav1.ConditionTrue, "InstallSucceeded")}, true},
		{"not Ready for another reason", []metav1.Condition{cond(v1alpha1.ConditionReady, metav1.ConditionFalse, "Progressing"), released}, false},
		{"held for its backup before a major upgrade, released", []metav1.Condition{held, released}, true},
		{"held for its backup, workloads unavailable", []metav1.Condition{held, released, cond(v1alpha1.ConditionWorkloadsAvailable, metav1.ConditionFalse, "PodsNotReady")}, false},
		{"held for its backup, never released", []metav1.Condition{held}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pg := &v1alpha1.Postgres{}
			pg.Status.Conditions = tc.conds
			if got := serving(pg); got != tc.want {
				t.Errorf("serving %v, want %v", got, tc.want)
			}
		})
	}
}
