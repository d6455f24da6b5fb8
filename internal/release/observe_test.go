package release

import (
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/chartpilot/chartpilot/internal/api/v1alpha1"
	"github.com/chartpilot/chartpilot/internal/helm"
)

func rev(n int, st helm.Status, uid, digest, desc string) *helm.Release {
	l := map[string]string{}
	if uid != "" {
		l[v1alpha1.LabelOwnerUID] = uid
	}
	if digest != "" {
		l[v1alpha1.LabelDigest] = digest
	}
	return &helm.Release{Revision: n, Status: st, Labels: l, Description: desc}
}

func TestObserve(t *testing.T) {
	const uid, d1, d2 = "u1", "digest1", "digest2"
	for _, tc := range []struct {
		name     string
		history  []*helm.Release
		adopt    bool
		want     State
		lastGood int
	}{
		{"absent", nil, false, StateAbsent, 0},
		{"in sync", []*helm.Release{rev(1, helm.StatusDeployed, uid, d1, "")}, false, StateInSync, 1},
		{"out of sync", []*helm.Release{rev(1, helm.StatusDeployed, uid, d2, "")}, false, StateOutOfSync, 1},
		{"unmanaged", []*helm.Release{rev(1, helm.StatusDeployed, "", "", "")}, false, StateUnmanaged, 1},
		{"adopted", []*helm.Release{rev(1, helm.StatusDeployed, "", "", "")}, true, StateOutOfSync, 1},
		{"other owner", []*helm.Release{rev(1, helm.StatusDeployed, "u2", d1, "")}, false, StateConflict, 1},
		{"pending install", []*helm.Release{rev(1, helm.StatusPendingInstall, uid, d1, "")}, false, StateLocked, 0},
		{"pending upgrade", []*helm.Release{rev(1, helm.StatusDeployed, uid, d2, ""), rev(2, helm.StatusPendingUpgrade, uid, d1, "")}, false, StateLocked, 1},
		{"pending rollback", []*helm.Release{rev(1, helm.StatusSuperseded, uid, d2, ""), rev(2, helm.StatusFailed, uid, d1, ""), rev(3, helm.StatusPendingRollback, uid, d2, "")}, false, StateLocked, 1},
		{"failed install", []*helm.Release{rev(1, helm.StatusFailed, uid, d1, "")}, false, StateFailedInstall, 0},
		{"failed upgrade", []*helm.Release{rev(1, helm.StatusDeployed, uid, d2, ""), rev(2, helm.StatusFailed, uid, d1, "")}, false, StateFailedUpgrade, 1},
		{"failed after superseded", []*helm.Release{rev(1, helm.StatusSuperseded, uid, d2, ""), rev(2, helm.StatusSuperseded, uid, d2, ""), rev(3, helm.StatusFailed, uid, d1, "")}, false, StateFailedUpgrade, 2},
		{"interrupted upgrade", []*helm.Release{rev(1, helm.StatusDeployed, uid, d2, ""), rev(2, helm.StatusFailed, uid, d1, unlockedPrefix+"upgrade")}, false, StateInterrupted, 1},
		{"uninstalling", []*helm.Release{rev(1, helm.StatusUninstalling, uid, d1, "")}, false, StateUninstalling, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o := observe(tc.history, uid, d1, tc.adopt)
			if o.State != tc.want {
				t.Errorf("state = %s, want %s", o.State, tc.want)
			}
			got := 0
			if o.LastGood != nil {
				got = o.LastGood.Revision
			}
			if got != tc.lastGood {
				t.Errorf("last good revision = %d, want %d", got, tc.lastGood)
			}
		})
	}
}

func TestObjectDiffers(t *testing.T) {
	want := map[string]any{
		"apiVersion": "v1", "kind": "Service",
		"metadata": map[string]any{"name": "s", "labels": map[string]any{"a": "b"}},
		"spec": map[string]any{
			"ports":     []any{map[string]any{"port": int64(80), "targetPort": "http"}},
			"resources": map[string]any{"cpu": "500m", "memory": 1073741824.0},
		},
	}
	live := func(mut func(m map[string]any)) map[string]any {
		m := map[string]any{
			"apiVersion": "v1", "kind": "Service",
			"metadata": map[string]any{"name": "s", "uid": "x", "resourceVersion": "9", "labels": map[string]any{"a": "b", "extra": "ok"}},
			"spec": map[string]any{
				"clusterIP": "10.96.0.5",
				"ports":     []any{map[string]any{"port": int64(80), "targetPort": "http", "protocol": "TCP"}},
				"resources": map[string]any{"cpu": "0.5", "memory": "1Gi"},
			},
			"status": map[string]any{"loadBalancer": map[string]any{}},
		}
		if mut != nil {
			mut(m)
		}
		return m
	}
	spec := func(m map[string]any) map[string]any { return m["spec"].(map[string]any) }
	for _, tc := range []struct {
		name  string
		live  map[string]any
		drift bool
	}{
		{"defaults, status and extra fields are not drift", live(nil), false},
		{"changed port", live(func(m map[string]any) { spec(m)["ports"].([]any)[0].(map[string]any)["port"] = int64(81) }), true},
		{"extra list item", live(func(m map[string]any) {
			spec(m)["ports"] = append(spec(m)["ports"].([]any), map[string]any{"port": int64(9)})
		}), true},
		{"label removed", live(func(m map[string]any) { delete(m["metadata"].(map[string]any)["labels"].(map[string]any), "a") }), true},
		{"quantity changed", live(func(m map[string]any) { spec(m)["resources"].(map[string]any)["cpu"] = "1" }), true},
		{"status changed", live(func(m map[string]any) { m["status"] = map[string]any{"x": "y"} }), false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			field, d := objectDiffers(want, want, tc.live)
			if d != tc.drift {
				t.Errorf("drift = %v (field %q), want %v", d, field, tc.drift)
			}
		})
	}
}

func TestLabelSafe(t *testing.T) {
	for in, want := range map[string]string{
		"":                     "",
		"2026-11-30T10:00:00Z": "2026-11-30T100000Z",
		"-x-":                  "x",
	} {
		if got := labelSafe(in); got != want {
			t.Errorf("labelSafe(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestBackoffUsesObservedFailures(t *testing.T) {
	now := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	r := &Reconciler{Now: func() time.Time { return now }}
	failedAt := func(ago time.Duration, token string) []*helm.Release {
		ok := rev(1, helm.StatusDeployed, "u", "d1", "")
		bad := rev(2, helm.StatusFailed, "u", "d2", "")
		bad.LastDeployed = now.Add(-ago)
		bad.Labels[v1alpha1.LabelRequestedAt] = token
		return []*helm.Release{ok, bad}
	}
	newPass := func() *pass {
		return &pass{obj: &unstructured.Unstructured{Object: map[string]any{}}, status: &v1alpha1.ReleaseStatus{}}
	}
	backoff := func(p *pass, digest, requested string, h []*helm.Release) time.Duration {
		p.requested = requested
		w, _ := reporter{r}.backoff(p, digest, h)
		return w
	}
	if w := backoff(newPass(), "d2", "", failedAt(5*time.Second, "")); w != 10*time.Second {
		t.Errorf("a failure 5s ago (status not yet updated): wait %s, want 10s", w)
	}
	if w := backoff(newPass(), "d2", "", failedAt(20*time.Second, "")); w != 0 {
		t.Errorf("a failure 20s ago: wait %s, want 0", w)
	}
	if w := backoff(newPass(), "d2", "new-token", failedAt(5*time.Second, "")); w != 0 {
		t.Errorf("a new reconcile request: wait %s, want 0", w)
	}
	if w := backoff(newPass(), "d3", "", failedAt(5*time.Second, "")); w != 0 {
		t.Errorf("new inputs: wait %s, want 0", w)
	}
	// Two failed revisions of the same inputs double the wait.
	h := failedAt(20*time.Second, "")
	older := rev(0, helm.StatusFailed, "u", "d2", "")
	older.LastDeployed = now.Add(-time.Minute)
	h = append([]*helm.Release{older}, h...)
	if w := backoff(newPass(), "d2", "", h); w != 10*time.Second {
		t.Errorf("second failure 20s ago: wait %s, want 10s (30s back-off)", w)
	}
}
