package release

import (
	"context"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"

	helmrelease "helm.sh/helm/v3/pkg/release"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/chartpilot/chartpilot/internal/api/v1alpha1"
	"github.com/chartpilot/chartpilot/internal/helm"
)

// choose is the action a pass would choose for o with the gates the
// memory and slots of e give (the API path's gatesFor).
func (e *actionEnv) choose(p *pass, d *desired, o Observation) action {
	return nextAction(o, e.r.gatesFor(context.Background(), p, d, o, e.history(), false).gates)
}

func TestInstallAction(t *testing.T) {
	ctx := context.Background()
	t.Run("deploys revision 1 and waits for its workloads", func(t *testing.T) {
		e := newActionEnv(t)
		p, d := e.pass(), e.desired("hello")
		if a := e.choose(p, d, e.observe(d)); a != actInstall {
			t.Fatalf("no release: chose %s", a)
		}
		res, err := (installStep{}).run(ctx, e.r, p, d)
		if err != nil {
			t.Fatal(err)
		}
		h := e.history()
		if len(h) != 1 || h[0].Status != helm.StatusDeployed || h[0].Labels[v1alpha1.LabelOwnerUID] != offlineUID || h[0].Labels[v1alpha1.LabelDigest] != d.digest {
			t.Fatalf("records after install: %s, labels %v", e.statuses(), h[len(h)-1].Labels)
		}
		e.event("InstallSucceeded", "revision 1")
		if got := e.objects.names(); got != "ConfigMap/web-config, Deployment/web, Service/web" {
			t.Errorf("objects applied: %s", got)
		}
		condition(t, p, v1alpha1.ConditionReconciling, metav1.ConditionTrue, "Progressing")
		if !p.settling || res.RequeueAfter != healthPoll || !e.r.mem.get(e.key()).awaiting {
			t.Errorf("a fresh install does not wait for the health gate: settling %v, requeue %s", p.settling, res.RequeueAfter)
		}
		if rel := p.status.Release; rel == nil || rel.Revision != 1 {
			t.Errorf("status.release = %+v, want revision 1", rel)
		}
	})
	t.Run("a failure of its objects stores a failed revision and counts", func(t *testing.T) {
		e := newActionEnv(t)
		e.objects.createErr = errChart
		p, d := e.pass(), e.desired("hello")
		if _, err := (installStep{}).run(ctx, e.r, p, d); err != nil {
			t.Fatal(err)
		}
		if got := e.statuses(); got != "1 failed" {
			t.Fatalf("records after a failed install: %s", got)
		}
		e.event("InstallFailed", "spec.replicas")
		if f := p.status.LastFailure; f == nil || f.Action != "Install" || f.Count != 1 {
			t.Errorf("lastFailure = %+v, want the first failed Install", f)
		}
		// The next pass cleans up, after the back-off.
		if a := e.choose(e.r.newPass(e.key(), withStatus(e.obj, p)), d, e.observe(d)); a != actBackOff {
			t.Errorf("right after a failed install: chose %s, want %s", a, actBackOff)
		}
	})
	t.Run("an API error breaks it off, to be discarded and tried again", func(t *testing.T) {
		e := newActionEnv(t)
		e.objects.createErr = errAPI
		p, d := e.pass(), e.desired("hello")
		res, err := (installStep{}).run(ctx, e.r, p, d)
		if err != nil {
			t.Fatal(err)
		}
		if got := e.statuses(); got != "1 failed" {
			t.Fatalf("records: %s", got)
		}
		if m := e.r.mem.get(e.key()); m.brokenOff != 1 || m.failure != nil || p.status.LastFailure != nil {
			t.Errorf("broken off: memory %d, failure %v / %v, want revision 1 and no failure", m.brokenOff, m.failure, p.status.LastFailure)
		}
		condition(t, p, v1alpha1.ConditionReconciling, metav1.ConditionTrue, "APIError")
		if res.RequeueAfter <= 0 {
			t.Errorf("not looked at again: %+v", res)
		}
		if a := e.choose(p, d, e.observe(d)); a != actDiscard {
			t.Errorf("after an install broken off: chose %s, want %s", a, actDiscard)
		}
	})
	t.Run("values the chart refuses store nothing and stall", func(t *testing.T) {
		e := newActionEnv(t)
		p, d := e.pass(), e.desired("hello")
		d.vals["replicas"] = "three"
		if _, err := (installStep{}).run(ctx, e.r, p, d); err != nil {
			t.Fatal(err)
		}
		if h := e.history(); len(h) != 0 {
			t.Fatalf("records after refused values: %s", e.statuses())
		}
		c := condition(t, p, v1alpha1.ConditionStalled, metav1.ConditionTrue, "")
		if c != nil && !containsAll(c.Message, "replicas", "before anything was applied") {
			t.Errorf("Stalled message = %q", c.Message)
		}
	})
}

func TestUpgradeAction(t *testing.T) {
	ctx := context.Background()
	t.Run("deploys the new inputs as the next revision", func(t *testing.T) {
		e := newActionEnv(t)
		e.installed("blue")
		p, d := e.pass(), e.desired("green")
		o := e.observe(d)
		if a := e.choose(p, d, o); a != actUpgrade {
			t.Fatalf("new inputs: chose %s", a)
		}
		if !e.r.slots.begin(e.key()) {
			t.Fatal("no upgrade slot free")
		}
		res, err := (upgradeStep{}).run(ctx, e.r, p, d, o)
		if err != nil {
			t.Fatal(err)
		}
		if got := e.statuses(); got != "1 superseded, 2 deployed" {
			t.Fatalf("records after upgrade: %s", got)
		}
		if h := e.history(); h[1].Labels[v1alpha1.LabelDigest] != d.digest {
			t.Errorf("revision 2 digest = %q, want %q", h[1].Labels[v1alpha1.LabelDigest], d.digest)
		}
		e.event("UpgradeSucceeded", "revision 2")
		condition(t, p, v1alpha1.ConditionReconciling, metav1.ConditionTrue, "Progressing")
		if !p.settling || res.RequeueAfter != healthPoll {
			t.Errorf("the upgrade does not wait for the health gate: %+v", res)
		}
		if !e.r.slots.held[e.key()] {
			t.Error("the upgrade gave its slot back before its health gate")
		}
	})
	t.Run("a failure stores a failed revision and gives the slot back", func(t *testing.T) {
		e := newActionEnv(t)
		e.installed("blue")
		e.objects.updateErr = errChart
		p, d := e.pass(), e.desired("green")
		e.r.slots.begin(e.key())
		if _, err := (upgradeStep{}).run(ctx, e.r, p, d, e.observe(d)); err != nil {
			t.Fatal(err)
		}
		// Helm keeps the previous revision deployed.
		if got := e.statuses(); got != "1 deployed, 2 failed" {
			t.Fatalf("records after a failed upgrade: %s", got)
		}
		e.event("UpgradeFailed", "spec.replicas")
		if f := p.status.LastFailure; f == nil || f.Action != "Upgrade" {
			t.Errorf("lastFailure = %+v", f)
		}
		if len(e.r.slots.held) != 0 {
			t.Errorf("slots held after a failed upgrade: %v", e.r.slots.held)
		}
		if a := e.choose(p, d, e.observe(d)); a != actRollback {
			t.Errorf("after a failed upgrade: chose %s, want %s", a, actRollback)
		}
	})
}

func TestRollbackAction(t *testing.T) {
	ctx := context.Background()
	failedUpgrade := func(t *testing.T) (*actionEnv, *desired) {
		e := newActionEnv(t)
		e.installed("blue")
		e.objects.updateErr = errChart
		d := e.desired("green")
		e.r.slots.begin(e.key())
		if _, err := (upgradeStep{}).run(ctx, e.r, e.pass(), d, e.observe(d)); err != nil {
			t.Fatal(err)
		}
		e.objects.updateErr = nil
		e.drainEvents()
		return e, d
	}
	t.Run("goes back to the last good revision", func(t *testing.T) {
		e, d := failedUpgrade(t)
		p, o := e.pass(), e.observe(d)
		if o.State != StateFailedUpgrade || e.choose(p, d, o) != actRollback {
			t.Fatalf("a failed upgrade: %s, chose %s", o.State, e.choose(p, d, o))
		}
		if _, err := (rollbackStep{}).run(context.Background(), e.r, p, d, o); err != nil {
			t.Fatal(err)
		}
		h := e.history()
		if got := e.statuses(); got != "1 superseded, 2 failed, 3 deployed" {
			t.Fatalf("records after rollback: %s", got)
		}
		if !strings.Contains(h[2].Manifest, "blue") || strings.Contains(h[2].Manifest, "green") {
			t.Errorf("revision 3 is not revision 1's inputs:\n%s", h[2].Manifest)
		}
		e.event("RolledBack", "revision 1")
		if cm := e.objects.get("ConfigMap", "web-config"); cm == nil || cm.Object["data"].(map[string]any)["message"] != "blue" {
			t.Errorf("ConfigMap after rollback: %v", cm)
		}
		condition(t, p, v1alpha1.ConditionReleased, metav1.ConditionFalse, "UpgradeFailed")
		if rel := p.status.Release; rel == nil || rel.Revision != 3 {
			t.Errorf("status.release = %+v, want revision 3", rel)
		}
	})
	t.Run("a failed rollback is said and tried again later", func(t *testing.T) {
		e, d := failedUpgrade(t)
		e.objects.updateErr = errChart
		p, o := e.pass(), e.observe(d)
		res, err := (rollbackStep{}).run(context.Background(), e.r, p, d, o)
		if err != nil {
			t.Fatal(err)
		}
		e.event("RollbackFailed", "revision 1")
		condition(t, p, v1alpha1.ConditionReleased, metav1.ConditionFalse, "RollbackFailed")
		if res.RequeueAfter <= 0 {
			t.Errorf("a failed rollback is not tried again: %+v", res)
		}
		if n := len(p.status.History); n == 0 || p.status.History[n-1].Succeeded {
			t.Errorf("history does not record the failed rollback: %+v", p.status.History)
		}
	})
}

func TestUnlockAction(t *testing.T) {
	e := newActionEnv(t)
	e.installed("blue")
	d := e.desired("green")
	e.seed(2, helmrelease.StatusPendingUpgrade, d, "Upgrade in progress")
	p, o := e.pass(), e.observe(d)
	if o.State != StateLocked || e.choose(p, d, o) != actUnlock {
		t.Fatalf("a pending revision without a live holder: %s, chose %s", o.State, e.choose(p, d, o))
	}
	if _, err := (unlockStep{}).run(e.r, p, d, o); err != nil {
		t.Fatal(err)
	}
	if got := e.statuses(); got != "1 deployed" {
		t.Fatalf("records after unlock: %s", got)
	}
	e.event("Unlocked", "revision 2", "pending-upgrade")
	condition(t, p, v1alpha1.ConditionReconciling, metav1.ConditionTrue, "Unlocked")
	// The interrupted upgrade runs again as revision 2.
	if o := e.observe(d); o.State != StateOutOfSync {
		t.Errorf("after unlock: %s, want %s", o.State, StateOutOfSync)
	}
}

func TestCleanupAction(t *testing.T) {
	e := newActionEnv(t)
	d := e.desired("blue")
	e.seed(1, helmrelease.StatusFailed, d, "Release \"web\" failed: objects refused")
	p, o := e.pass(), e.observe(d)
	if a := e.choose(p, d, o); o.State != StateFailedInstall || a != actBackOff {
		t.Fatalf("a failed install: %s, chose %s, want %s first", o.State, a, actBackOff)
	}
	e.now = e.now.Add(time.Hour)
	if a := e.choose(p, d, o); a != actCleanup {
		t.Fatalf("a failed install after its back-off: chose %s", a)
	}
	if _, err := (cleanupStep{}).run(context.Background(), e.r, p, d, o); err != nil {
		t.Fatal(err)
	}
	if got := e.statuses(); got != "" {
		t.Fatalf("records after cleanup: %s", got)
	}
	e.event("FailedInstallRemoved", "revision 1")
	condition(t, p, v1alpha1.ConditionReconciling, metav1.ConditionTrue, "Reinstalling")
	if a := e.choose(p, d, e.observe(d)); a != actInstall {
		t.Errorf("after cleanup: chose %s, want %s", a, actInstall)
	}
}

func TestDiscardAction(t *testing.T) {
	ctx := context.Background()
	e := newActionEnv(t)
	e.installed("blue")
	e.objects.updateErr = errAPI
	d := e.desired("green")
	e.r.slots.begin(e.key())
	if _, err := (upgradeStep{}).run(ctx, e.r, e.pass(), d, e.observe(d)); err != nil {
		t.Fatal(err)
	}
	e.objects.updateErr = nil
	p, o := e.pass(), e.observe(d)
	if o.State != StateFailedUpgrade || e.choose(p, d, o) != actDiscard {
		t.Fatalf("an upgrade broken off by an API error: %s, chose %s", o.State, e.choose(p, d, o))
	}
	if _, err := (discardStep{}).run(e.r, p, d, o); err != nil {
		t.Fatal(err)
	}
	if got := e.statuses(); got != "1 deployed" {
		t.Fatalf("records after discard: %s", got)
	}
	if m := e.r.mem.get(e.key()); m.brokenOff != 0 {
		t.Errorf("memory still says revision %d was broken off", m.brokenOff)
	}
	condition(t, p, v1alpha1.ConditionReconciling, metav1.ConditionTrue, "APIError")
	if a := e.choose(p, d, e.observe(d)); a != actUpgrade {
		t.Errorf("after discard: chose %s, want %s (the same upgrade again)", a, actUpgrade)
	}
}

// withStatus is obj with the status p ends with, as the next pass reads it.
func withStatus(obj *unstructured.Unstructured, p *pass) *unstructured.Unstructured {
	out := obj.DeepCopy()
	if st, err := runtime.DefaultUnstructuredConverter.ToUnstructured(p.status); err == nil {
		out.Object["status"] = st
	}
	return out
}

func TestUninstallAction(t *testing.T) {
	ctx := context.Background()
	t.Run("removes the release, then the finalizer", func(t *testing.T) {
		e := newActionEnv(t)
		e.installed("blue")
		e.deleting()
		p := e.pass()
		if _, err := e.r.finalize(ctx, p); err != nil {
			t.Fatal(err)
		}
		if got := e.statuses(); got != "" {
			t.Errorf("records after uninstall: %s", got)
		}
		if got := e.objects.names(); got != "" {
			t.Errorf("objects after uninstall: %s", got)
		}
		e.event("Uninstalled", offlineName)
		if fin := e.stored().GetFinalizers(); len(fin) != 0 {
			t.Errorf("finalizers after uninstall: %v", fin)
		}
	})
	t.Run("a failed uninstall keeps the finalizer and says why", func(t *testing.T) {
		e := newActionEnv(t)
		e.installed("blue")
		e.deleting()
		e.objects.deleteErr = errChart
		p := e.pass()
		res, err := e.r.finalize(ctx, p)
		if err != nil {
			t.Fatal(err)
		}
		e.event("UninstallFailed", "failed to delete release")
		condition(t, p, v1alpha1.ConditionReconciling, metav1.ConditionTrue, "UninstallFailed")
		if fin := e.stored().GetFinalizers(); len(fin) != 1 {
			t.Errorf("finalizers after a failed uninstall: %v", fin)
		}
		if res.RequeueAfter <= 0 {
			t.Errorf("a failed uninstall is not tried again: %+v", res)
		}
	})
	t.Run("never touches another object's release", func(t *testing.T) {
		e := newActionEnv(t)
		e.installed("blue")
		e.obj.SetUID("uid-another")
		e.deleting()
		if _, err := e.r.finalize(ctx, e.pass()); err != nil {
			t.Fatal(err)
		}
		if got := e.statuses(); got != "1 deployed" {
			t.Errorf("another object's records after its namesake's deletion: %s", got)
		}
		if got := e.objects.names(); got == "" {
			t.Error("another object's release objects were deleted")
		}
		if fin := e.stored().GetFinalizers(); len(fin) != 0 {
			t.Errorf("finalizers: %v, want none (nothing of its own to remove)", fin)
		}
	})
}

func TestAdoptAction(t *testing.T) {
	ctx := context.Background()
	signed := func(t *testing.T) *actionEnv {
		e := newActionEnv(t)
		e.r.Helm.UseRecords(helm.Records{Key: []byte("0123456789abcdef0123456789abcdef")})
		// A record chartpilot did not write (no MAC): made with the helm CLI.
		e.seed(1, helmrelease.StatusDeployed, e.desired("blue"), "Install complete")
		return e
	}
	t.Run("an unsigned record stalls the resource and is left alone", func(t *testing.T) {
		e := signed(t)
		p, d := e.pass(), e.desired("blue")
		h := e.history()
		if rec := firstUntrusted(h); rec == nil {
			t.Fatal("the seeded record is trusted")
		}
		if _, err := e.r.untrustedRecords(ctx, p, d, e.observe(d), firstUntrusted(h)); err != nil {
			t.Fatal(err)
		}
		c := condition(t, p, v1alpha1.ConditionStalled, metav1.ConditionTrue, "UntrustedReleaseRecord")
		if c != nil && !strings.Contains(c.Message, v1alpha1.AnnotationAdopt) {
			t.Errorf("Stalled does not name %s: %q", v1alpha1.AnnotationAdopt, c.Message)
		}
		if got := e.statuses(); got != "1 deployed" {
			t.Errorf("records: %s", got)
		}
	})
	t.Run("with the adopt annotation the records go and the install follows", func(t *testing.T) {
		e := signed(t)
		e.obj.SetAnnotations(map[string]string{v1alpha1.AnnotationAdopt: "true"})
		p, d := e.pass(), e.desired("blue")
		if _, err := e.r.untrustedRecords(ctx, p, d, e.observe(d), firstUntrusted(e.history())); err != nil {
			t.Fatal(err)
		}
		if got := e.statuses(); got != "" {
			t.Errorf("records after adopting: %s", got)
		}
		e.event("Adopted", "installing afresh")
		condition(t, p, v1alpha1.ConditionReconciling, metav1.ConditionTrue, "Adopting")
		if a := e.choose(p, d, e.observe(d)); a != actInstall {
			t.Errorf("after adopting: chose %s, want %s", a, actInstall)
		}
	})
}

func TestCorrectDriftAction(t *testing.T) {
	ctx := context.Background()
	e := newActionEnv(t)
	d := e.installed("blue")
	e.applied()
	p, o := e.pass(), e.observe(d)
	g := e.r.gatesFor(ctx, p, d, o, e.history(), true).gates
	if a := nextAction(o, g); a != actCorrectDrift {
		t.Fatalf("in sync, healthy, drift due: chose %s", a)
	}
	// Nothing changed: nothing to do.
	if _, err := (correctDriftStep{}).run(ctx, e.r, p, d, o); err != nil {
		t.Fatal(err)
	}
	if evs := e.drainEvents(); len(evs) != 0 {
		t.Errorf("events without drift: %q", evs)
	}
	condition(t, p, v1alpha1.ConditionReleased, metav1.ConditionTrue, "")

	// The ConfigMap deleted and the Service's port changed: both set back.
	cms := e.dyn.Resource(corev1.SchemeGroupVersion.WithResource("configmaps")).Namespace(offlineNS)
	if err := cms.Delete(ctx, "web-config", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	svcs := e.dyn.Resource(corev1.SchemeGroupVersion.WithResource("services")).Namespace(offlineNS)
	svc, err := svcs.Get(ctx, "web", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	ports, _, _ := unstructured.NestedSlice(svc.Object, "spec", "ports")
	ports[0].(map[string]any)["port"] = int64(9999)
	_ = unstructured.SetNestedSlice(svc.Object, ports, "spec", "ports")
	if _, err := svcs.Update(ctx, svc, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	p = e.pass()
	if _, err := (correctDriftStep{}).run(ctx, e.r, p, d, o); err != nil {
		t.Fatal(err)
	}
	cm, err := cms.Get(ctx, "web-config", metav1.GetOptions{})
	if err != nil {
		t.Fatalf("the deleted ConfigMap was not created again: %v", err)
	}
	if msg, _, _ := unstructured.NestedString(cm.Object, "data", "message"); msg != "blue" {
		t.Errorf("restored ConfigMap message = %q", msg)
	}
	svc, _ = svcs.Get(ctx, "web", metav1.GetOptions{})
	ports, _, _ = unstructured.NestedSlice(svc.Object, "spec", "ports")
	if port := ports[0].(map[string]any)["port"]; port != int64(8080) {
		t.Errorf("Service port after correction = %v, want 8080", port)
	}
	e.event("DriftCorrected", "ConfigMap/shop/web-config")
	c := condition(t, p, v1alpha1.ConditionDrifted, metav1.ConditionFalse, "DriftCorrected")
	if c != nil && !containsAll(c.Message, "web-config (deleted)", "Service/shop/web (spec.ports[0].port)") {
		t.Errorf("Drifted message = %q", c.Message)
	}
	if len(e.history()) != 1 {
		t.Errorf("drift correction made a revision: %s", e.statuses())
	}
}

func TestCheckHealthAction(t *testing.T) {
	ctx := context.Background()
	upgraded := func(t *testing.T) (*actionEnv, *desired) {
		e := newActionEnv(t)
		e.installed("blue")
		d := e.desired("green")
		e.r.slots.begin(e.key())
		if _, err := (upgradeStep{}).run(ctx, e.r, e.pass(), d, e.observe(d)); err != nil {
			t.Fatal(err)
		}
		e.applied()
		e.drainEvents()
		return e, d
	}
	t.Run("waits for the workloads, then passes", func(t *testing.T) {
		e, d := upgraded(t)
		p, o := e.pass(), e.observe(d)
		if a := e.choose(p, d, o); a != actCheckHealth {
			t.Fatalf("a fresh revision: chose %s", a)
		}
		res, healthy, err := (checkHealthStep{}).run(ctx, e.r, p, d, o, e.history())
		if err != nil || healthy {
			t.Fatalf("a Deployment without ready replicas: healthy %v, %v", healthy, err)
		}
		c := condition(t, p, v1alpha1.ConditionReconciling, metav1.ConditionTrue, "Progressing")
		if c != nil && !strings.Contains(c.Message, "Deployment/web") {
			t.Errorf("Progressing does not name the Deployment: %q", c.Message)
		}
		if res.RequeueAfter <= 0 || !e.r.slots.held[e.key()] {
			t.Errorf("settling: requeue %s, slot held %v", res.RequeueAfter, e.r.slots.held[e.key()])
		}
		e.deploymentReady()
		p = e.pass()
		if _, healthy, err := (checkHealthStep{}).run(ctx, e.r, p, d, o, e.history()); err != nil || !healthy {
			t.Fatalf("a ready Deployment: healthy %v, %v", healthy, err)
		}
		if m := e.r.mem.get(e.key()); m.healthyRev != 2 || m.awaiting {
			t.Errorf("memory after the gate: healthy revision %d, awaiting %v", m.healthyRev, m.awaiting)
		}
		if e.r.slots.held[e.key()] {
			t.Error("the slot is still held once healthy")
		}
		if a := e.choose(p, d, o); a != actNone {
			t.Errorf("healthy and in sync: chose %s", a)
		}
	})
	t.Run("an upgrade not ready in time is condemned, to be rolled back", func(t *testing.T) {
		e, d := upgraded(t)
		e.now = e.now.Add(2 * e.r.Watch.HealthTimeout)
		p, o := e.pass(), e.observe(d)
		if _, healthy, err := (checkHealthStep{}).run(ctx, e.r, p, d, o, e.history()); err != nil || healthy {
			t.Fatalf("past the health timeout: healthy %v, %v", healthy, err)
		}
		h := e.history()
		if h[1].Status != helm.StatusFailed || !strings.HasPrefix(h[1].Description, unhealthyPrefix) {
			t.Fatalf("revision 2 after the timeout: %s %q", h[1].Status, h[1].Description)
		}
		e.event("UpgradeFailed", "did not become ready", "Deployment/web")
		if e.r.slots.held[e.key()] {
			t.Error("a condemned upgrade still holds its slot")
		}
		if a := e.choose(p, d, e.observe(d)); a != actRollback {
			t.Errorf("after condemning: chose %s, want %s", a, actRollback)
		}
	})
}

// The holds change nothing in Helm and say what they wait for.
func TestHoldActions(t *testing.T) {
	e := newActionEnv(t)
	d := e.installed("blue")
	o := e.observe(e.desired("green"))
	for _, tc := range []struct {
		a      action
		c      choice
		reason string
		says   string
	}{
		{actBackOff, choice{gates: gates{backoff: time.Minute}, failure: &v1alpha1.Failure{Count: 2}, backoffAction: "Upgrade"}, "BackingOff", "Upgrade failed 2 time(s)"},
		{actQueue, choice{}, "UpgradeQueued", "waits its turn"},
		{actHoldUnhealthy, choice{condemned: &helm.Release{Revision: 2, Description: unhealthyPrefix + "Deployment/web not ready"}}, "UpgradeFailed", "revision 2: Deployment/web not ready"},
		{actWaitLock, choice{lock: lockInfo{holder: "replica-b", lease: "chartpilot", leaseNamespace: "ops", startedAt: e.now}, lockRecheck: 5 * time.Second}, "LockHeld", "replica-b"},
	} {
		p := e.pass()
		res := e.r.hold(p, tc.a, o, tc.c)
		c := condition(t, p, v1alpha1.ConditionReconciling, metav1.ConditionTrue, tc.reason)
		if c != nil && !strings.Contains(c.Message, tc.says) {
			t.Errorf("%s: Reconciling message %q does not say %q", tc.a, c.Message, tc.says)
		}
		if res.RequeueAfter <= 0 {
			t.Errorf("%s: not looked at again: %+v", tc.a, res)
		}
	}
	// A release of another object stalls the resource.
	foreign := e.observe(d)
	foreign.State = StateConflict
	foreign.Latest.Labels = map[string]string{v1alpha1.LabelOwnerUID: "uid-another", v1alpha1.LabelOwnerKind: "Webapp.test.chartpilot.dev"}
	p := e.pass()
	e.r.hold(p, actStallForeign, foreign, choice{})
	if c := condition(t, p, v1alpha1.ConditionStalled, metav1.ConditionTrue, "ReleaseConflict"); c != nil && !strings.Contains(c.Message, "uid-another") {
		t.Errorf("Stalled message %q does not name the owner", c.Message)
	}
	if got := e.statuses(); got != "1 deployed" {
		t.Errorf("records after the holds: %s", got)
	}
}
