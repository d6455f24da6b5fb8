package helm

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"helm.sh/helm/v3/pkg/release"
	"helm.sh/helm/v3/pkg/storage/driver"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
)

// History read through the cache: a body is read once per version, a
// record written here is seen before the cache shows it, a record deleted
// here is gone before the cache drops it, and a version the cache shows
// that this process has not seen is read again.
func TestCachedHistoryReadsEachVersionOnce(t *testing.T) {
	cs := fake.NewSimpleClientset()
	gets := 0
	cs.PrependReactor("get", "secrets", func(k8stesting.Action) (bool, runtime.Object, error) { gets++; return false, nil, nil })
	rv := 0
	stamp := func(a k8stesting.Action) (bool, runtime.Object, error) {
		if o, ok := a.(k8stesting.CreateAction); ok {
			rv++
			o.GetObject().(*corev1.Secret).ResourceVersion = fmt.Sprint(rv)
		}
		return false, nil, nil
	}
	cs.PrependReactor("create", "secrets", stamp)
	cs.PrependReactor("update", "secrets", stamp)
	lists := 0
	cs.PrependReactor("list", "secrets", func(k8stesting.Action) (bool, runtime.Object, error) { lists++; return false, nil, nil })
	// The cache: what the test says the informer shows.
	var cached []metav1.ObjectMeta
	index := func(_ context.Context, ns string, match map[string]string) ([]metav1.ObjectMeta, error) {
		var out []metav1.ObjectMeta
		for _, m := range cached {
			ok := true
			for k, v := range match {
				ok = ok && m.Labels[k] == v
			}
			if ok {
				out = append(out, m)
			}
		}
		return out, nil
	}
	d := &recordDriver{secrets: cs.CoreV1().Secrets("ns"), namespace: "ns", index: index, store: &recordStore{m: map[string]map[string]*storedRecord{}}}
	rel := func(v int, st release.Status) *release.Release {
		return &release.Release{Name: "web", Namespace: "ns", Version: v, Manifest: fmt.Sprintf("# %d", v), Info: &release.Info{Status: st}}
	}
	key := func(v int) string { return fmt.Sprintf("sh.helm.release.v1.web.v%d", v) }
	history := func() []string {
		t.Helper()
		rs, err := d.Query(map[string]string{"name": "web", "owner": "helm"})
		if err != nil && !errors.Is(err, driver.ErrReleaseNotFound) {
			t.Fatal(err)
		}
		var out []string
		for _, r := range rs {
			out = append(out, fmt.Sprintf("v%d %s", r.Version, r.Info.Status))
		}
		return out
	}
	show := func() { // the informer catches up with the API server
		list, err := cs.CoreV1().Secrets("ns").List(context.Background(), metav1.ListOptions{})
		if err != nil {
			t.Fatal(err)
		}
		lists--
		cached = nil
		for _, s := range list.Items {
			cached = append(cached, s.ObjectMeta)
		}
	}

	if err := d.Create(key(1), rel(1, release.StatusPendingInstall)); err != nil {
		t.Fatal(err)
	}
	if h := history(); len(h) != 1 || h[0] != "v1 pending-install" {
		t.Fatalf("a record written here, not yet in the cache: history %v", h)
	}
	if err := d.Update(key(1), rel(1, release.StatusDeployed)); err != nil {
		t.Fatal(err)
	}
	show()
	for range 3 {
		if h := history(); len(h) != 1 || h[0] != "v1 deployed" {
			t.Fatalf("history %v", h)
		}
	}
	if gets != 0 || lists != 0 {
		t.Errorf("history of records written here cost %d GETs and %d LISTs", gets, lists)
	}

	// Another writer changes the record: the cache shows a version this
	// process has not seen; it is read once.
	s, _ := cs.CoreV1().Secrets("ns").Get(context.Background(), key(1), metav1.GetOptions{})
	gets--
	s.Labels["status"] = "superseded"
	s.ResourceVersion = "99"
	if err := cs.Tracker().Update(corev1.SchemeGroupVersion.WithResource("secrets"), s, "ns"); err != nil {
		t.Fatal(err)
	}
	cached = []metav1.ObjectMeta{s.ObjectMeta}
	for range 2 {
		history()
	}
	if gets != 1 {
		t.Errorf("a version not seen here: %d GETs, want 1", gets)
	}

	if _, err := d.Delete(key(1)); err != nil {
		t.Fatal(err)
	}
	if h := history(); len(h) != 0 {
		t.Errorf("a record deleted here is still in the history: %v", h)
	}

	// A record someone else deleted, which the cache still shows: deleting
	// it again is not an error (an uninstall must not fail on it).
	if err := d.Create(key(2), rel(2, release.StatusDeployed)); err != nil {
		t.Fatal(err)
	}
	show()
	if err := cs.CoreV1().Secrets("ns").Delete(context.Background(), key(2), metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := d.Delete(key(2)); err != nil {
		t.Errorf("deleting a record already gone: %v", err)
	}
}

// TestHasLabelsIsTheSetsSelector: hasLabels answers as the selector of the
// set does.
func TestHasLabelsIsTheSetsSelector(t *testing.T) {
	sets := []labels.Set{{}, {"name": "a"}, {"name": "a", "owner": "helm"}, {"status": ""}}
	records := []map[string]string{nil, {}, {"name": "a"}, {"name": "b", "owner": "helm"}, {"name": "a", "owner": "helm", "status": "deployed"}, {"status": ""}}
	for _, set := range sets {
		for _, l := range records {
			if got, want := hasLabels(l, set), set.AsSelector().Matches(labels.Set(l)); got != want {
				t.Errorf("hasLabels(%v, %v) = %v, the selector says %v", l, set, got, want)
			}
		}
	}
}
