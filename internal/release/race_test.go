package release_test

import (
	"context"
	"testing"
	"time"

	"github.com/go-logr/logr"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/tools/record"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/chartpilot/chartpilot/internal/api/v1alpha1"
	"github.com/chartpilot/chartpilot/internal/helm"
	"github.com/chartpilot/chartpilot/internal/release"
	"github.com/chartpilot/chartpilot/internal/source"
	"github.com/chartpilot/chartpilot/internal/watches"
)

// laggingCache is an informer cache that has not yet seen the newest write
// of one resource: Get returns an older read of it.
type laggingCache struct {
	client.Client
	key   types.NamespacedName
	stale *unstructured.Unstructured
}

func (c laggingCache) Get(ctx context.Context, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
	if u, ok := obj.(*unstructured.Unstructured); ok && key == c.key {
		c.stale.DeepCopyInto(u)
		return nil
	}
	return c.Client.Get(ctx, key, obj, opts...)
}

// directReconciler is a release reconciler that a test drives pass by
// pass, reading resource key from a cache that lags at stale.
func directReconciler(t *testing.T, w watches.Watch, key types.NamespacedName, stale *unstructured.Unstructured) *release.Reconciler {
	t.Helper()
	c, err := client.New(cluster.Config, client.Options{})
	if err != nil {
		t.Fatal(err)
	}
	hc, err := helm.NewClient(cluster.Config, logr.Discard())
	if err != nil {
		t.Fatal(err)
	}
	dyn, err := dynamic.NewForConfig(cluster.Config)
	if err != nil {
		t.Fatal(err)
	}
	src, err := source.NewRepo(w.Remote.Repo, w.Remote.Name, source.Options{CacheDir: t.TempDir(), Interval: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := src.Refresh(context.Background()); err != nil {
		t.Fatal(err)
	}
	return &release.Reconciler{
		Watch: w, Source: src, Helm: hc, Dynamic: dyn,
		Client:    laggingCache{Client: c, key: key, stale: stale},
		APIReader: c,
		Recorder:  record.NewFakeRecorder(100),
		Log:       logr.Discard(),
	}
}

// TestBlockedBetweenCacheAndAPIRead: the cache still shows a new spec
// without the annotation that blocks it (a constraint that would be a
// downgrade); the API server shows both. The pass acts on the API's read
// alone: no Helm action, nothing applied, the block reported. The same
// reconciler upgrades once the block is gone (so the first pass could act).
func TestBlockedBetweenCacheAndAPIRead(t *testing.T) {
	e := newEnv(t)
	repo := newChartRepo(t)
	repo.publish("1.0.0", false)
	repo.publish("1.0.1", false)
	w := repoWatch(t, repo)
	stop := startOperator(t, cluster.Config, []watches.Watch{w}, withCache(t.TempDir()))
	e.create("racy", map[string]any{"message": "first"}, nil, nil)
	e.waitVersion("racy", "1.0.1")
	stop()
	revisions := len(e.history("racy"))
	key := types.NamespacedName{Namespace: e.ns, Name: "racy"}
	ctx := context.Background()

	e.patch("racy", `{"spec":{"message":"from the stale read"}}`)
	cached := e.get("racy")
	e.patch("racy", `{"metadata":{"annotations":{"`+v1alpha1.AnnotationChartVersion+`":"<1.0.1"}}}`)

	r := directReconciler(t, w, key, cached)
	if _, err := r.Reconcile(ctx, ctrl.Request{NamespacedName: key}); err != nil {
		t.Fatalf("pass: %v", err)
	}
	if n := len(e.history("racy")); n != revisions {
		t.Fatalf("a resource blocked in the API's read got a Helm action: %d revisions, want %d", n, revisions)
	}
	if cm, err := e.configMap("racy-config"); err != nil || cm.Data["message"] != "first" {
		t.Fatalf("the stale read's values were applied: %v %v", cm.Data, err)
	}
	if c := condition(e.get("racy"), v1alpha1.ConditionUpgradeBlocked); c == nil || c.Status != metav1.ConditionTrue || c.Reason != "DowngradeRefused" {
		t.Fatalf("UpgradeBlocked = %+v, want True DowngradeRefused", c)
	}

	// Without the annotation the same reconciler applies the new spec.
	e.patch("racy", `{"metadata":{"annotations":{"`+v1alpha1.AnnotationChartVersion+`":null}}}`)
	r = directReconciler(t, w, key, e.get("racy"))
	if _, err := r.Reconcile(ctx, ctrl.Request{NamespacedName: key}); err != nil {
		t.Fatalf("pass: %v", err)
	}
	if n := len(e.history("racy")); n != revisions+1 {
		t.Fatalf("after the block was lifted: %d revisions, want %d", n, revisions+1)
	}
	if cm, err := e.configMap("racy-config"); err != nil || cm.Data["message"] != "from the stale read" {
		t.Fatalf("the new spec was not applied: %v %v", cm.Data, err)
	}
}
