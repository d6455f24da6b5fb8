package release_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/chartpilot/chartpilot/internal/api/v1alpha1"
	"github.com/chartpilot/chartpilot/internal/hooks"
	"github.com/chartpilot/chartpilot/internal/operator"
	"github.com/chartpilot/chartpilot/internal/watches"
)

// TestHooks: a hook's Values layer reaches the release; its PreUpgrade can
// hold an upgrade (condition and event, release untouched), its PreInstall
// a first install (no release record until it lets go), and its
// PostRelease runs after each release; an unknown hook name is a start-up
// error naming the watch.
func TestHooks(t *testing.T) {
	e := newEnv(t)
	var holdUpgrades atomic.Bool
	var postReleases atomic.Int32
	var holdInstall atomic.Bool
	holdInstall.Store(true)
	var waitStore atomic.Bool
	waitStore.Store(true)
	gate := &hooks.Hook{
		Name:          "gate",
		ConditionType: "GatePassed",
		Values: hooks.ValuesFunc(func(_ context.Context, obj hooks.Object) (map[string]any, error) {
			if obj.Resource.GetName() == "waiting" && waitStore.Load() {
				return nil, hooks.Wait("StoreNotReady", "store s of %s has not been checked yet", obj.Resource.GetName())
			}
			return map[string]any{"message": "from-hook-" + obj.Resource.GetName()}, nil
		}),
		PreUpgrade: hooks.PreUpgradeFunc(func(_ context.Context, _ hooks.Object, from, to string) error {
			if holdUpgrades.Load() {
				return hooks.Reject("MaintenanceFreeze", "upgrades from %s to %s are frozen", from, to)
			}
			return nil
		}),
		PreInstall: hooks.PreInstallFunc(func(_ context.Context, obj hooks.Object) error {
			switch name := obj.Resource.GetName(); {
			case name == "held" && holdInstall.Load():
				return hooks.Reject("DataNotReady", "the data of %s is not on its volume yet", name)
			case name == "refused":
				return hooks.Reject("DataFailed", "the data of %s cannot be restored: fix its source", name)
			}
			return nil
		}),
		PostRelease: hooks.PostReleaseFunc(func(_ context.Context, obj hooks.Object) error {
			// Only this test's resources: the operator also acts on those
			// other tests leave in namespaces being deleted.
			if obj.Resource.GetNamespace() == e.ns {
				postReleases.Add(1)
			}
			return nil
		}),
	}
	w := webappWatch(t, func(w *watches.Watch) { w.Hooks = []string{"gate"} })
	startOperator(t, cluster.Config, []watches.Watch{w}, func(o *operator.Options) { o.Hooks = []*hooks.Hook{gate} })

	e.create("hooked", map[string]any{"message": "own", "replicas": 1}, nil, nil)
	e.waitCondition("hooked", v1alpha1.ConditionReady, metav1.ConditionTrue, "")
	if cm, _ := e.configMap("hooked-config"); cm.Data["message"] != "from-hook-hooked" {
		t.Errorf("hook values layer not applied: message %q", cm.Data["message"])
	}
	if postReleases.Load() != 1 {
		t.Errorf("PostRelease ran %d times after install", postReleases.Load())
	}

	holdUpgrades.Store(true)
	e.patch("hooked", `{"spec":{"replicas":2}}`)
	u := e.waitCondition("hooked", "GatePassed", metav1.ConditionFalse, "MaintenanceFreeze")
	if c := condition(u, v1alpha1.ConditionReady); c.Status != metav1.ConditionFalse || c.Reason != "MaintenanceFreeze" {
		t.Errorf("Ready while a hook holds the upgrade: %+v", c)
	}
	e.waitEvent("hooked", "MaintenanceFreeze", "frozen")
	if n := len(e.history("hooked")); n != 1 {
		t.Errorf("held upgrade ran: %d revisions", n)
	}

	holdUpgrades.Store(false)
	e.patch("hooked", fmt.Sprintf(`{"metadata":{"annotations":{%q:"go"}}}`, v1alpha1.AnnotationReconcileRequestedAt))
	e.waitFor("upgrade after the hold", func() (bool, string) {
		h := e.history("hooked")
		return len(h) == 2, fmt.Sprintf("%d revisions", len(h))
	})
	e.waitCondition("hooked", v1alpha1.ConditionReady, metav1.ConditionTrue, "")
	if postReleases.Load() != 2 {
		t.Errorf("PostRelease ran %d times after install and upgrade", postReleases.Load())
	}

	// A first install held by PreInstall: no release until it lets go.
	e.create("held", map[string]any{"message": "own", "replicas": 1}, nil, nil)
	u = e.waitCondition("held", v1alpha1.ConditionReconciling, metav1.ConditionTrue, "InstallBlocked")
	if c := condition(u, v1alpha1.ConditionReconciling); !strings.Contains(c.Message, "hook gate holds the install: the data of held is not on its volume yet") {
		t.Errorf("Reconciling while the install is held: %+v", c)
	}
	if c := condition(u, v1alpha1.ConditionReady); c.Status == metav1.ConditionTrue {
		t.Errorf("Ready while a hook holds the install: %+v", c)
	}
	e.waitEvent("held", "DataNotReady", "not on its volume yet")
	if n := len(e.history("held")); n != 0 {
		t.Errorf("held install ran: %d revisions", n)
	}
	holdInstall.Store(false)
	e.patch("held", fmt.Sprintf(`{"metadata":{"annotations":{%q:"go"}}}`, v1alpha1.AnnotationReconcileRequestedAt))
	e.waitCondition("held", v1alpha1.ConditionReady, metav1.ConditionTrue, "")
	if n := len(e.history("held")); n != 1 {
		t.Errorf("after the hold: %d revisions, want 1", n)
	}

	// A refusal that waits on something outside the resource is looked
	// at again on its own: nothing touches the resource after it lets go.
	e.create("waiting", map[string]any{"message": "own", "replicas": 1}, nil, nil)
	e.waitCondition("waiting", "GatePassed", metav1.ConditionFalse, "StoreNotReady")
	if n := len(e.history("waiting")); n != 0 {
		t.Errorf("a waiting hook let the install run: %d revisions", n)
	}
	waitStore.Store(false)
	e.waitCondition("waiting", v1alpha1.ConditionReady, metav1.ConditionTrue, "")

	// A hold that needs a person (a reason ending in Failed) is Stalled.
	e.create("refused", map[string]any{"message": "own", "replicas": 1}, nil, nil)
	u = e.waitCondition("refused", v1alpha1.ConditionStalled, metav1.ConditionTrue, "DataFailed")
	if c := condition(u, v1alpha1.ConditionStalled); !strings.Contains(c.Message, "fix its source") {
		t.Errorf("Stalled: %+v", c)
	}
	if n := len(e.history("refused")); n != 0 {
		t.Errorf("refused install ran: %d revisions", n)
	}

	// An unknown hook name stops start-up with the watch named.
	bad := webappWatch(t, func(w *watches.Watch) { w.Hooks = []string{"nope"} })
	_, err := operator.New(operator.Options{Config: cluster.Config, Watches: []watches.Watch{bad}, MetricsAddr: "0", ProbeAddr: "0", SeveralInProcess: true})
	if err == nil || !strings.Contains(err.Error(), "Webapp") || !strings.Contains(err.Error(), "nope") || !strings.Contains(err.Error(), "tenancy") {
		t.Errorf("unknown hook: want an error naming the watch, the hook and the known hooks, got %v", err)
	}
	var rej *hooks.Rejection
	if !errors.As(hooks.Reject("R", "m"), &rej) {
		t.Error("Reject does not build a Rejection")
	}
}
