package release_test

import (
	"bytes"
	"compress/gzip"
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	ctrlmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"

	"github.com/chartpilot/chartpilot/internal/api/v1alpha1"
	"github.com/chartpilot/chartpilot/internal/helm"
	"github.com/chartpilot/chartpilot/internal/helm/helmtest"
	"github.com/chartpilot/chartpilot/internal/operator"
	"github.com/chartpilot/chartpilot/internal/watches"
)

// TestObjectsOutsideTheNamespaceRefused: a chart that renders a
// cluster-scoped object, or an object in another namespace, is refused
// before any API call (Stalled ObjectOutOfScope, naming the object and the
// fix); nothing is created and no release record is stored.
func TestObjectsOutsideTheNamespaceRefused(t *testing.T) {
	e := newEnv(t)
	other := cluster.Namespace(t)
	startOperator(t, cluster.Config, []watches.Watch{webappWatch(t)})
	e.create("cr", map[string]any{"clusterRole": true}, nil, nil)
	e.create("elsewhere", map[string]any{"otherNamespace": other}, nil, nil)
	u := e.waitCondition("cr", v1alpha1.ConditionStalled, metav1.ConditionTrue, "ObjectOutOfScope")
	if msg := condition(u, v1alpha1.ConditionStalled).Message; !strings.Contains(msg, "ClusterRole") || !strings.Contains(msg, "allowClusterScoped") {
		t.Errorf("Stalled message %q does not name the object and the fix", msg)
	}
	u = e.waitCondition("elsewhere", v1alpha1.ConditionStalled, metav1.ConditionTrue, "ObjectOutOfScope")
	if msg := condition(u, v1alpha1.ConditionStalled).Message; !strings.Contains(msg, other) {
		t.Errorf("Stalled message %q does not name the other namespace", msg)
	}
	ctx := context.Background()
	if _, err := e.cs.RbacV1().ClusterRoles().Get(ctx, e.ns+"-cr-reader", metav1.GetOptions{}); !isNotFound(err) {
		t.Errorf("the ClusterRole was created: %v", err)
	}
	if _, err := e.cs.CoreV1().ConfigMaps(other).Get(ctx, "elsewhere-elsewhere", metav1.GetOptions{}); !isNotFound(err) {
		t.Errorf("the other namespace's ConfigMap was created: %v", err)
	}
	for _, name := range []string{"cr", "elsewhere"} {
		if h := e.history(name); len(h) != 0 {
			t.Errorf("%s: %d release records stored for a refused release", name, len(h))
		}
		if _, err := e.configMap(name + "-config"); !isNotFound(err) {
			t.Errorf("%s: objects of a refused release were created: %v", name, err)
		}
	}
}

// TestClusterScopedKindAllowedByTheWatch: a kind listed under
// allowClusterScoped is installed, and removed with the release.
func TestClusterScopedKindAllowedByTheWatch(t *testing.T) {
	e := newEnv(t)
	startOperator(t, cluster.Config, []watches.Watch{webappWatch(t, func(w *watches.Watch) {
		w.AllowClusterScoped = []string{"ClusterRole.rbac.authorization.k8s.io"}
	})})
	e.create("cr", map[string]any{"clusterRole": true}, nil, nil)
	e.waitCondition("cr", v1alpha1.ConditionReady, metav1.ConditionTrue, "")
	ctx := context.Background()
	if _, err := e.cs.RbacV1().ClusterRoles().Get(ctx, e.ns+"-cr-reader", metav1.GetOptions{}); err != nil {
		t.Fatalf("the allowed ClusterRole: %v", err)
	}
	if err := e.dyn.Resource(webappGVR).Namespace(e.ns).Delete(ctx, "cr", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	e.waitFor("ClusterRole removed with the release", func() (bool, string) {
		_, err := e.cs.RbacV1().ClusterRoles().Get(ctx, e.ns+"-cr-reader", metav1.GetOptions{})
		return isNotFound(err), "still there"
	})
}

// TestEditedReleaseRecordCannotReachOutside: someone who may write Secrets
// in the namespace edits the release record to add a ClusterRole granting
// everything and a ConfigMap of another namespace. Neither drift repair nor
// uninstall acts on them: the ClusterRole is never created, the other
// namespace's ConfigMap is never deleted, and the resource says why.
func TestEditedReleaseRecordCannotReachOutside(t *testing.T) {
	e := newEnv(t)
	other := cluster.Namespace(t)
	ctx := context.Background()
	victim := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "victim", Namespace: other}, Data: map[string]string{"keep": "me"}}
	if _, err := e.cs.CoreV1().ConfigMaps(other).Create(ctx, victim, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	startOperator(t, cluster.Config, []watches.Watch{webappWatch(t)})
	e.create("rec", map[string]any{"message": "x"}, nil, nil)
	e.waitCondition("rec", v1alpha1.ConditionReady, metav1.ConditionTrue, "")

	granted := e.ns + "-granted"
	e.editRecord("rec", func(m string) string {
		return m + "\n---\napiVersion: rbac.authorization.k8s.io/v1\nkind: ClusterRole\nmetadata:\n  name: " + granted +
			"\nrules:\n- apiGroups: [\"*\"]\n  resources: [\"*\"]\n  verbs: [\"*\"]\n---\napiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: victim\n  namespace: " + other + "\n"
	})
	// Drift: one of the release's objects is deleted.
	if err := e.cs.CoreV1().ConfigMaps(e.ns).Delete(ctx, "rec-config", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	u := e.waitCondition("rec", v1alpha1.ConditionStalled, metav1.ConditionTrue, "ObjectOutOfScope")
	if msg := condition(u, v1alpha1.ConditionStalled).Message; !strings.Contains(msg, "ClusterRole "+granted) {
		t.Errorf("Stalled message %q does not name the object", msg)
	}
	if _, err := e.cs.RbacV1().ClusterRoles().Get(ctx, granted, metav1.GetOptions{}); !isNotFound(err) {
		t.Fatalf("the edited record's ClusterRole was created: %v", err)
	}
	// Uninstall refuses the record too: the other namespace keeps its ConfigMap.
	if err := e.dyn.Resource(webappGVR).Namespace(e.ns).Delete(ctx, "rec", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	e.waitEvent("rec", "UninstallFailed", "refused")
	if ok, seen := e.holds(2*time.Second, func() (bool, string) {
		if _, err := e.cs.CoreV1().ConfigMaps(other).Get(ctx, "victim", metav1.GetOptions{}); err != nil {
			return false, fmt.Sprintf("the other namespace's ConfigMap: %v", err)
		}
		if _, err := e.cs.RbacV1().ClusterRoles().Get(ctx, granted, metav1.GetOptions{}); !isNotFound(err) {
			return false, fmt.Sprintf("the edited record's ClusterRole exists: %v", err)
		}
		return true, ""
	}); !ok {
		t.Fatal(seen)
	}
}

// editRecord rewrites the manifest of the newest release record of name.
func (e *env) editRecord(name string, edit func(string) string) {
	e.t.Helper()
	e.editRevision(name, 0, edit)
}

// editRevision rewrites the manifest of one release record of name: of
// revision rev, or the newest when rev is 0.
func (e *env) editRevision(name string, rev int, edit func(string) string) {
	e.t.Helper()
	ctx := context.Background()
	list, err := e.cs.CoreV1().Secrets(e.ns).List(ctx, metav1.ListOptions{LabelSelector: "owner=helm,name=" + name})
	if err != nil || len(list.Items) == 0 {
		e.t.Fatalf("release records of %s: %d, %v", name, len(list.Items), err)
	}
	var newest *corev1.Secret
	best := 0
	for i := range list.Items {
		v, _ := strconv.Atoi(list.Items[i].Labels["version"])
		if (rev == 0 && v > best) || v == rev {
			newest, best = &list.Items[i], v
		}
	}
	if newest == nil {
		e.t.Fatalf("release %s has no revision %d", name, rev)
	}
	data, err := helmtest.EditManifest(newest.Data["release"], edit)
	if err != nil {
		e.t.Fatal(err)
	}
	newest.Data["release"] = data
	if _, err := e.cs.CoreV1().Secrets(e.ns).Update(ctx, newest, metav1.UpdateOptions{}); err != nil {
		e.t.Fatal(err)
	}
}

// TestLockdownActsOnlyAsTheServiceAccount: with --default-service-account,
// a namespace without that ServiceAccount gets nothing (Stalled NoIdentity,
// no record, no object); with it, install, drift repair and uninstall run
// as the ServiceAccount: once its rights are taken away, drift repair and
// uninstall are refused in its name.
func TestLockdownActsOnlyAsTheServiceAccount(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	startOperator(t, cluster.Config, []watches.Watch{webappWatch(t)}, func(o *operator.Options) { o.DefaultServiceAccount = "deployer" })
	e.create("locked", map[string]any{"message": "x"}, nil, nil)
	u := e.waitCondition("locked", v1alpha1.ConditionStalled, metav1.ConditionTrue, "NoIdentity")
	if msg := condition(u, v1alpha1.ConditionStalled).Message; !strings.Contains(msg, e.ns+"/deployer") || !strings.Contains(msg, "kubectl chartpilot identity create -n "+e.ns+" --service-account deployer") {
		t.Errorf("NoIdentity message %q does not name the ServiceAccount and the command that makes it", msg)
	}
	if h := e.history("locked"); len(h) != 0 {
		t.Fatalf("%d release records written without an identity", len(h))
	}
	if _, err := e.configMap("locked-config"); !isNotFound(err) {
		t.Fatalf("objects written without an identity: %v", err)
	}

	writes := e.serviceAccountWithNamespaceRights("deployer")
	e.patch("locked", `{"metadata":{"annotations":{"chartpilot.dev/reconcile-requested-at":"sa-created"}}}`)
	e.waitCondition("locked", v1alpha1.ConditionReady, metav1.ConditionTrue, "")
	user := "system:serviceaccount:" + e.ns + ":deployer"

	// The ServiceAccount may still read, no longer write.
	if err := e.cs.RbacV1().RoleBindings(e.ns).Delete(ctx, writes, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := e.cs.CoreV1().ConfigMaps(e.ns).Delete(ctx, "locked-config", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	e.waitEvent("locked", "DriftCorrectionFailed", user)
	if err := e.dyn.Resource(webappGVR).Namespace(e.ns).Delete(ctx, "locked", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	e.waitEvent("locked", "UninstallFailed", "")
	if _, err := e.cs.AppsV1().Deployments(e.ns).Get(ctx, "locked", metav1.GetOptions{}); err != nil {
		t.Fatalf("the release's Deployment went although its ServiceAccount may not delete it: %v", err)
	}
	// Rights back: the uninstall goes through.
	e.serviceAccountWithNamespaceRights("deployer")
	e.waitFor("resource gone", func() (bool, string) {
		_, err := e.dyn.Resource(webappGVR).Namespace(e.ns).Get(ctx, "locked", metav1.GetOptions{})
		return isNotFound(err), "still there"
	})
}

// serviceAccountWithNamespaceRights makes sure ServiceAccount name exists
// and may read everything in the test namespace, grants it every right
// there, and returns the name of the RoleBinding that grants the writes.
func (e *env) serviceAccountWithNamespaceRights(name string) string {
	e.t.Helper()
	ctx := context.Background()
	exists := func(err error) {
		if err != nil && !strings.Contains(err.Error(), "already exists") {
			e.t.Fatal(err)
		}
	}
	_, err := e.cs.CoreV1().ServiceAccounts(e.ns).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{})
	exists(err)
	for role, verbs := range map[string][]string{name + "-read": {"get", "list", "watch"}, name + "-write": {"*"}} {
		_, err := e.cs.RbacV1().Roles(e.ns).Create(ctx, &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Name: role}, Rules: []rbacv1.PolicyRule{{APIGroups: []string{"*"}, Resources: []string{"*"}, Verbs: verbs}}}, metav1.CreateOptions{})
		exists(err)
		_, err = e.cs.RbacV1().RoleBindings(e.ns).Create(ctx, &rbacv1.RoleBinding{
			ObjectMeta: metav1.ObjectMeta{Name: role},
			RoleRef:    rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "Role", Name: role},
			Subjects:   []rbacv1.Subject{{Kind: "ServiceAccount", Name: name, Namespace: e.ns}},
		}, metav1.CreateOptions{})
		exists(err)
	}
	return name + "-write"
}

var webshopGVR = schema.GroupVersionResource{Group: "test.chartpilot.dev", Version: "v1alpha1", Resource: "webshops"}

// TestAdoptRefusesALiveOwnersRelease: a resource of another kind with the
// same name asks to adopt a release that a live resource owns: it is
// refused (ReleaseConflict), the release is not upgraded, and deleting the
// would-be adopter does not uninstall it.
func TestAdoptRefusesALiveOwnersRelease(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	shop := webappWatch(t, func(w *watches.Watch) { w.GVK.Kind = "Webshop" })
	startOperator(t, cluster.Config, []watches.Watch{webappWatch(t), shop})
	e.create("same", map[string]any{"message": "the owner's"}, nil, nil)
	e.waitCondition("same", v1alpha1.ConditionReady, metav1.ConditionTrue, "")
	revisions := len(e.history("same"))

	thief := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "test.chartpilot.dev/v1alpha1", "kind": "Webshop",
		"metadata": map[string]any{"name": "same", "namespace": e.ns, "annotations": map[string]any{v1alpha1.AnnotationAdopt: "true"}},
		"spec":     map[string]any{"message": "taken over"},
	}}
	if _, err := e.dyn.Resource(webshopGVR).Namespace(e.ns).Create(ctx, thief, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	e.waitFor("the adopter stalled on a conflict", func() (bool, string) {
		u, err := e.dyn.Resource(webshopGVR).Namespace(e.ns).Get(ctx, "same", metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		c := condition(u, v1alpha1.ConditionStalled)
		return c != nil && c.Reason == "ReleaseConflict", fmt.Sprint(c)
	})
	if n := len(e.history("same")); n != revisions {
		t.Fatalf("a live owner's release was acted on by the adopter: %d revisions, want %d", n, revisions)
	}
	if err := e.dyn.Resource(webshopGVR).Namespace(e.ns).Delete(ctx, "same", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	e.waitFor("the adopter gone", func() (bool, string) {
		_, err := e.dyn.Resource(webshopGVR).Namespace(e.ns).Get(ctx, "same", metav1.GetOptions{})
		return isNotFound(err), "still there"
	})
	if cm, err := e.configMap("same-config"); err != nil || cm.Data["message"] != "the owner's" {
		t.Fatalf("the owner's release after the adopter was deleted: %v %v", cm, err)
	}
	if h := e.history("same"); len(h) != revisions {
		t.Fatalf("the owner's release records: %d, want %d", len(h), revisions)
	}
}

// TestAnotherNamespacesCanaryHasNoEffect: without tenancy, canaries count in
// their own namespace only. A canary that fails on a version elsewhere
// neither holds nor halts this namespace's rollout: its resource tries the
// version itself (and, the version being broken, rolls back on its own).
func TestAnotherNamespacesCanaryHasNoEffect(t *testing.T) {
	e := newEnv(t)
	elsewhere := *e
	elsewhere.ns = cluster.Namespace(t)
	repo := newChartRepo(t)
	repo.publish("1.0.0", false)
	startOperator(t, cluster.Config, []watches.Watch{repoWatch(t, repo, func(w *watches.Watch) {
		w.HealthTimeout = 8 * time.Second
		w.CanarySoak = time.Hour
	})}, withCache(t.TempDir()))
	elsewhere.create("canary", map[string]any{"message": "v"}, map[string]string{v1alpha1.LabelCanary: "true"}, nil)
	e.create("main", map[string]any{"message": "v"}, nil, nil)
	elsewhere.waitVersion("canary", "1.0.0")
	e.waitVersion("main", "1.0.0")

	repo.publish("1.1.0", true)
	elsewhere.waitRolledBack("canary")
	e.waitRolledBack("main")
	if got := e.chartVersions("main"); !slices.Contains(got, "1.1.0") {
		t.Fatalf("main was held by another namespace's canary: versions %v", got)
	}
}

// TestRecordChartpilotDidNotWriteIsNotActedOn: an edit of a release record
// that stays inside the namespace (an object planted in its manifest) breaks
// the record's MAC: nothing is done from it (UntrustedReleaseRecord), the
// planted object is never created, and with chartpilot.dev/adopt the
// release is installed afresh from the chart and values.
func TestRecordChartpilotDidNotWriteIsNotActedOn(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	startOperator(t, cluster.Config, []watches.Watch{webappWatch(t)})
	e.create("signed", map[string]any{"message": "x"}, nil, nil)
	e.waitCondition("signed", v1alpha1.ConditionReady, metav1.ConditionTrue, "")
	e.editRecord("signed", func(m string) string {
		return m + "\n---\napiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: planted\ndata:\n  by: tenant\n"
	})
	if err := e.cs.CoreV1().ConfigMaps(e.ns).Delete(ctx, "signed-config", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	u := e.waitCondition("signed", v1alpha1.ConditionStalled, metav1.ConditionTrue, "UntrustedReleaseRecord")
	if msg := condition(u, v1alpha1.ConditionStalled).Message; !strings.Contains(msg, v1alpha1.AnnotationAdopt) {
		t.Errorf("Stalled message %q does not say how to recover", msg)
	}
	if _, err := e.configMap("planted"); !isNotFound(err) {
		t.Fatalf("an object of the edited record was created: %v", err)
	}
	e.patch("signed", `{"metadata":{"annotations":{"`+v1alpha1.AnnotationAdopt+`":"true"}}}`)
	e.waitEvent("signed", "Adopted", "installing afresh")
	e.waitCondition("signed", v1alpha1.ConditionReady, metav1.ConditionTrue, "")
	if cm, err := e.configMap("signed-config"); err != nil || cm.Data["message"] != "x" {
		t.Fatalf("after the re-install: %v %v", cm, err)
	}
	if _, err := e.configMap("planted"); !isNotFound(err) {
		t.Fatalf("an object of the edited record was created: %v", err)
	}
	if h := e.history("signed"); len(h) != 1 || h[0].Revision != 1 {
		t.Errorf("after the re-install: %d records", len(h))
	}
}

// TestDeletionTrustsTheNewestRecordOnly: deleting a resource reads only
// its release's newest record, the one whose objects are deleted. An older
// record edited by someone else is deleted with the rest, unread (nothing
// of it is acted on); an edited newest record refuses the deletion: the
// objects and records stay and the event names the record.
func TestDeletionTrustsTheNewestRecordOnly(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	startOperator(t, cluster.Config, []watches.Watch{webappWatch(t)})
	names := []string{"older-edited", "newest-edited"}
	for _, name := range names {
		e.create(name, map[string]any{"message": "one"}, nil, nil)
		e.waitCondition(name, v1alpha1.ConditionReady, metav1.ConditionTrue, "")
		e.patch(name, `{"spec":{"message":"two"}}`)
	}
	for _, name := range names {
		e.waitFor(name+" at revision 2", func() (bool, string) {
			h := e.history(name)
			return len(h) == 2 && h[1].Status == helm.StatusDeployed, fmt.Sprint(len(h))
		})
	}
	plant := func(m string) string {
		return m + "\n---\napiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: planted\ndata:\n  by: tenant\n"
	}
	e.editRevision("older-edited", 1, plant)
	e.editRevision("newest-edited", 2, plant)
	for _, name := range names {
		if err := e.dyn.Resource(webappGVR).Namespace(e.ns).Delete(ctx, name, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
	}

	e.waitFor("older-edited gone with its records and objects", func() (bool, string) {
		_, err := e.dyn.Resource(webappGVR).Namespace(e.ns).Get(ctx, "older-edited", metav1.GetOptions{})
		_, cmErr := e.configMap("older-edited-config")
		h := e.history("older-edited")
		return isNotFound(err) && isNotFound(cmErr) && len(h) == 0, fmt.Sprintf("resource: %v, config: %v, %d records", err, cmErr, len(h))
	})
	e.waitEvent("newest-edited", "UninstallFailed", "was not written by chartpilot")
	if cm, err := e.configMap("newest-edited-config"); err != nil || cm.Data["message"] != "two" {
		t.Fatalf("the objects of a release whose newest record was edited: %v %v", cm, err)
	}
	if h := e.history("newest-edited"); len(h) != 2 {
		t.Fatalf("the records of a release whose newest record was edited: %d, want 2", len(h))
	}
	if _, err := e.configMap("planted"); !isNotFound(err) {
		t.Fatalf("an object of an edited record was created: %v", err)
	}
	// Let it go without its objects, as the event says.
	e.patch("newest-edited", `{"metadata":{"finalizers":null}}`)
}

// TestOversizedRecordRefused: a release record that inflates far beyond the
// limit (256 MiB of zeros in a 1 MiB Secret) is refused with a condition,
// without being decoded; the operator goes on serving other resources.
func TestOversizedRecordRefused(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	startOperator(t, cluster.Config, []watches.Watch{webappWatch(t)}, func(o *operator.Options) { o.MaxRecordSize = 1 << 20 })
	u := e.create("bomb", map[string]any{"message": "x"}, nil, nil)
	e.waitCondition("bomb", v1alpha1.ConditionReady, metav1.ConditionTrue, "")

	var gz bytes.Buffer
	zw, _ := gzip.NewWriterLevel(&gz, gzip.BestSpeed)
	zeros := make([]byte, 1<<20)
	for range 256 {
		if _, err := zw.Write(zeros); err != nil {
			t.Fatal(err)
		}
	}
	if err := zw.Close(); err != nil {
		t.Fatal(err)
	}
	bomb := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: "sh.helm.release.v1.bomb.v2", Labels: map[string]string{
			"owner": "helm", "name": "bomb", "version": "2", "status": "deployed", v1alpha1.LabelOwnerUID: string(u.GetUID()),
		}},
		Type: "helm.sh/release.v1",
		Data: map[string][]byte{"release": []byte(base64.StdEncoding.EncodeToString(gz.Bytes()))},
	}
	if _, err := e.cs.CoreV1().Secrets(e.ns).Create(ctx, bomb, metav1.CreateOptions{}); err != nil {
		t.Fatalf("creating a %d-byte record: %v", gz.Len(), err)
	}
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	// The record's creation alone wakes the resource: no reconcile request.
	got := e.waitCondition("bomb", v1alpha1.ConditionStalled, metav1.ConditionTrue, "ReleaseRecordTooLarge")
	runtime.ReadMemStats(&after)
	// Decoding the record whole would allocate its 256 MiB at least; the
	// operator runs in this process, so its allocations are counted here.
	if allocated := after.TotalAlloc - before.TotalAlloc; allocated > 128<<20 {
		t.Errorf("%d MiB allocated while the oversized record was refused: not bounded by the 1 MiB limit", allocated>>20)
	} else {
		t.Logf("%d MiB allocated by the whole process while the record was refused", allocated>>20)
	}
	if msg := condition(got, v1alpha1.ConditionStalled).Message; !strings.Contains(msg, bomb.Name) {
		t.Errorf("Stalled message %q does not name the record", msg)
	}
	e.create("after", map[string]any{"message": "y"}, nil, nil)
	e.waitCondition("after", v1alpha1.ConditionReady, metav1.ConditionTrue, "")
}

// TestRejectedValuesStayOutOfStatusEventsAndLogs: a value that fails the
// chart's schema and one the API server rejects may be secrets: neither
// reaches the resource's status, its events, the operator's log or its
// metrics, while the messages still name the field.
func TestRejectedValuesStayOutOfStatusEventsAndLogs(t *testing.T) {
	e := newEnv(t)
	startOperator(t, cluster.Config, []watches.Watch{webappWatch(t)})
	schemaSecret, apiSecret := "tok3n-"+e.ns+"-schema", "tok3n-"+e.ns+"-api"
	e.create("sch", map[string]any{"image": schemaSecret + " x"}, nil, nil)
	e.create("api", map[string]any{"nodeSelector": map[string]any{"disk": apiSecret + " !"}}, nil, nil)
	u := e.waitCondition("sch", v1alpha1.ConditionStalled, metav1.ConditionTrue, "RenderFailed")
	if msg := condition(u, v1alpha1.ConditionStalled).Message; !strings.Contains(msg, "/image") || !strings.Contains(msg, "<redacted>") {
		t.Errorf("Stalled message %q should name the field and redact the value", msg)
	}
	e.waitEvent("api", "InstallFailed", "nodeSelector")
	e.waitEvent("api", "InstallFailed", "<redacted>")

	var seen []string
	for _, name := range []string{"sch", "api"} {
		st, err := json.Marshal(e.get(name).Object["status"])
		if err != nil {
			t.Fatal(err)
		}
		seen = append(seen, "status of "+name+": "+string(st))
		for _, ev := range e.events(name) {
			seen = append(seen, "event of "+name+": "+ev)
		}
	}
	logs, err := os.ReadFile(operatorLog)
	if err != nil {
		t.Fatal(err)
	}
	seen = append(seen, "operator log: "+string(logs))
	families, err := ctrlmetrics.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	seen = append(seen, "metrics: "+fmt.Sprint(families))
	for _, s := range seen {
		for _, secret := range []string{schemaSecret, apiSecret} {
			if i := strings.Index(s, secret); i >= 0 {
				t.Errorf("%s reached %s", secret, s[:min(len(s), strings.Index(s, ":")+1)]+" ..."+s[max(0, i-80):min(len(s), i+40)])
			}
		}
	}
}

// TestReleaseTooLargeForItsRecord: a spec that would make the release
// record larger than the operator reads (--max-release-record-size) stalls
// the resource with ReleaseTooLarge before anything is stored or applied,
// and a spec that fits after installs.
func TestReleaseTooLargeForItsRecord(t *testing.T) {
	e := newEnv(t)
	startOperator(t, cluster.Config, []watches.Watch{webappWatch(t)}, func(o *operator.Options) { o.MaxRecordSize = 1 << 20 })
	// Random text hardly compresses: values and manifest each hold it once.
	buf := make([]byte, 600<<10)
	_, _ = rand.Read(buf)
	big := base64.StdEncoding.EncodeToString(buf)
	e.create("huge", map[string]any{"message": big}, nil, nil)
	u := e.waitCondition("huge", v1alpha1.ConditionStalled, metav1.ConditionTrue, "ReleaseTooLarge")
	if c := condition(u, v1alpha1.ConditionStalled); !strings.Contains(c.Message, "records are limited to 1024 KiB (--max-release-record-size)") || strings.Contains(c.Message, big[:64]) {
		t.Errorf("Stalled message %.300q: want the sizes and no value", c.Message)
	}
	if h, err := e.hc.History(e.ns, "huge"); err == nil && len(h) > 0 {
		t.Errorf("%d revisions stored for a release too large for its record", len(h))
	}
	if _, err := e.configMap("huge-config"); err == nil {
		t.Error("an object of a release too large for its record was applied")
	}
	e.patch("huge", `{"spec":{"message":"small"}}`)
	e.waitCondition("huge", v1alpha1.ConditionReady, metav1.ConditionTrue, "")
}
