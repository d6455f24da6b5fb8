package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/chartpilot/chartpilot/internal/api/v1alpha1"
	"github.com/chartpilot/chartpilot/internal/operator"
	"github.com/chartpilot/chartpilot/internal/watches"
)

// removableAPI is an API version that a minor of the matrix serves when
// asked to (--runtime-config) and that a later minor removes, as a chart
// written for an older cluster renders it, with its served replacement.
type removableAPI struct {
	runtimeConfig string
	// old is the resource at the removed version; kind its kind.
	old  schema.GroupVersionResource
	kind string
	// replacement is the apiVersion that replaces it; removedIn the minor
	// that stops serving old, and before the one before it.
	replacement, removedIn, before string
}

var (
	volumeAttributesClassV1beta1 = removableAPI{
		runtimeConfig: "storage.k8s.io/v1beta1=true",
		old:           schema.GroupVersionResource{Group: "storage.k8s.io", Version: "v1beta1", Resource: "volumeattributesclasses"},
		kind:          "VolumeAttributesClass", replacement: "storage.k8s.io/v1", removedIn: "1.37", before: "1.36",
	}
	removableAPIs = map[string]removableAPI{
		"1.35": volumeAttributesClassV1beta1,
		"1.36": volumeAttributesClassV1beta1,
		"1.37": {
			runtimeConfig: "resource.k8s.io/v1beta1=true",
			old:           schema.GroupVersionResource{Group: "resource.k8s.io", Version: "v1beta1", Resource: "deviceclasses"},
			kind:          "DeviceClass", replacement: "resource.k8s.io/v1", removedIn: "1.38", before: "1.37",
		},
	}
)

// TestRemovedAPIVersions follows a release through the upgrade of its
// cluster to a minor that removes an API version its chart renders:
// status, condition, event and `chartpilot preflight` name it before; once
// the API server no longer serves it, an upgrade fails with Helm's error
// while the operator leaves the stored manifest as it is, and succeeds
// after the operator rewrites the stored manifest to the replacement.
// Uninstalling works after the rewrite too.
func TestRemovedAPIVersions(t *testing.T) {
	api, ok := removableAPIs[cluster.Kubernetes()]
	if !ok {
		t.Fatalf("no removable API known for Kubernetes %s: add one to removableAPIs", cluster.Kubernetes())
	}
	oldAPIVersion := api.old.GroupVersion().String()
	watch := fmt.Sprintf("- {group: test.chartpilot.dev, version: v1alpha1, kind: Publicdb, chart: ../../test/charts/apiversions, healthTimeout: 1m, allowClusterScoped: [%s.%s]}\n", api.kind, api.old.Group)
	ws, err := watches.Parse([]byte(watch), ".", os.LookupEnv)
	if err != nil {
		t.Fatal(err)
	}
	only := func(o *operator.Options) { o.Watches = ws }
	e := setup(t, only)
	e.grantClusterKind(api.old.Group, api.old.Resource)
	cli := buildCLI(t)

	// r1 is upgraded after the cluster upgrade, r2 deleted.
	for _, name := range []string{"r1", "r2"} {
		r := &unstructured.Unstructured{Object: map[string]any{
			"apiVersion": "test.chartpilot.dev/v1alpha1", "kind": "Publicdb", "metadata": map[string]any{"name": name},
			"spec": map[string]any{"class": map[string]any{"kind": api.kind, "apiVersion": oldAPIVersion}, "message": "one"},
		}}
		if _, err := e.dyn.Resource(publicdbGVR).Namespace(e.ns).Create(context.Background(), r, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	for _, name := range []string{"r1", "r2"} {
		e.waitFor(name+" Ready", 3*time.Minute, func() (bool, string) { return ready(e.get(publicdbGVR, name)) })
	}
	st := releaseStatus(e.get(publicdbGVR, "r1"))
	want := v1alpha1.DeprecatedAPI{APIVersion: oldAPIVersion, Kind: api.kind, Objects: 1, RemovedIn: api.removedIn, Replacement: api.replacement, Served: true}
	if len(st.DeprecatedAPIs) != 1 || st.DeprecatedAPIs[0].DeprecatedIn == "" || func() bool { d := st.DeprecatedAPIs[0]; d.DeprecatedIn = ""; return d != want }() {
		t.Fatalf("status.deprecatedAPIs = %+v, want one %+v (with the minor that deprecates it)", st.DeprecatedAPIs, want)
	}
	if c := apimeta.FindStatusCondition(st.Conditions, v1alpha1.ConditionDeprecatedAPIs); c == nil || c.Status != metav1.ConditionTrue ||
		!strings.Contains(c.Message, api.kind) || !strings.Contains(c.Message, "removed in Kubernetes "+api.removedIn) || !strings.Contains(c.Message, "use "+api.replacement) {
		t.Errorf("DeprecatedAPIs condition: %+v, want True naming %s, the minor %s and %s", c, api.kind, api.removedIn, api.replacement)
	}
	e.waitEvent("r1", "DeprecatedAPIs", api.kind)

	out, err := runCLI(cli, "preflight", "publicdbs", "-n", e.ns, "--kubernetes-version", api.removedIn)
	if exit := exitCode(err); exit != 1 || !strings.Contains(out, "r1") || !strings.Contains(out, oldAPIVersion) || !strings.Contains(out, api.kind) || !strings.Contains(out, api.replacement) {
		t.Errorf("preflight for %s: exit %d, want 1 naming r1, %s %s and %s:\n%s", api.removedIn, exit, oldAPIVersion, api.kind, api.replacement, out)
	}
	if out, err := runCLI(cli, "preflight", "publicdbs", "-n", e.ns, "--kubernetes-version", api.before); exitCode(err) != 0 || !strings.Contains(out, "No release of 2") {
		t.Errorf("preflight for %s (which still serves it): exit %d, want 0:\n%s", api.before, exitCode(err), out)
	}

	// The cluster is upgraded: the API server no longer serves the version.
	e.stop()
	if err := cluster.RestartAPIServer(""); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := cluster.RestartAPIServer(api.runtimeConfig); err != nil {
			t.Errorf("serving %s again: %v", oldAPIVersion, err)
		}
	})
	e.waitFor(oldAPIVersion+" no longer served", time.Minute, func() (bool, string) {
		_, err := e.cs.Discovery().ServerResourcesForGroupVersion(oldAPIVersion)
		return apierrors.IsNotFound(err), fmt.Sprint(err)
	})

	// The chart is upgraded to render the replacement. Without the
	// rewrite, the upgrade fails with Helm's error on the stored manifest.
	e.startOperator(only, func(o *operator.Options) { o.KeepStoredAPIs = true })
	if err := e.patch(publicdbGVR, "r1", fmt.Sprintf(`{"spec":{"message":"two","class":{"apiVersion":%q}}}`, api.replacement)); err != nil {
		t.Fatal(err)
	}
	e.waitFor("the upgrade to fail on the stored manifest", 2*time.Minute, func() (bool, string) {
		raw, _ := json.Marshal(e.get(publicdbGVR, "r1").Object["status"])
		return strings.Contains(string(raw), "unable to build kubernetes objects from current release manifest"), string(raw)
	})
	st = releaseStatus(e.get(publicdbGVR, "r1"))
	if c := apimeta.FindStatusCondition(st.Conditions, v1alpha1.ConditionDeprecatedAPIs); c == nil || c.Reason != "APINotServed" || !strings.Contains(c.Message, "is not served by this cluster") {
		t.Errorf("DeprecatedAPIs condition once the version is not served: %+v", c)
	}
	if out, err := runCLI(cli, "preflight", "publicdbs", "-n", e.ns, "--kubernetes-version", api.before); exitCode(err) != 1 || !strings.Contains(out, "not served now") {
		t.Errorf("preflight with the version not served: exit %d, want 1 saying so:\n%s", exitCode(err), out)
	}
	e.stop()

	// The operator rewrites the stored manifest; the upgrade goes through,
	// and so does the uninstall of r2.
	e.startOperator(only)
	replacement := schema.GroupVersionResource{Group: api.old.Group, Version: strings.TrimPrefix(api.replacement, api.old.Group+"/"), Resource: api.old.Resource}
	e.deleteAndWait(publicdbGVR, "r2", replacement, e.ns+"-r2")
	e.waitEvent("r1", "StoredAPIsRewritten", api.replacement)
	e.waitFor("r1 Ready after the upgrade", 3*time.Minute, func() (bool, string) {
		cm, err := e.cs.CoreV1().ConfigMaps(e.ns).Get(context.Background(), "r1-message", metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		if cm.Data["message"] != "two" {
			return false, "message " + cm.Data["message"]
		}
		return ready(e.get(publicdbGVR, "r1"))
	})
	st = releaseStatus(e.get(publicdbGVR, "r1"))
	var actions []string
	for _, h := range st.History {
		actions = append(actions, fmt.Sprintf("%s@%d:%v", h.Action, h.Revision, h.Succeeded))
	}
	if got := strings.Join(actions, " "); !strings.HasPrefix(got, "Upgrade@3:true RewriteAPIs@2:true") {
		t.Errorf("history %s: want the rewrite as revision 2, then the upgrade as revision 3", got)
	}
	if len(st.DeprecatedAPIs) != 0 || apimeta.FindStatusCondition(st.Conditions, v1alpha1.ConditionDeprecatedAPIs) != nil {
		t.Errorf("after the rewrite: deprecatedAPIs %+v, conditions %+v: want neither", st.DeprecatedAPIs, st.Conditions)
	}
	if out, err := runCLI(cli, "preflight", "publicdbs", "-n", e.ns, "--kubernetes-version", api.removedIn); exitCode(err) != 0 {
		t.Errorf("preflight after the rewrite: exit %d, want 0:\n%s", exitCode(err), out)
	}
	e.deleteAndWait(publicdbGVR, "r1", replacement, e.ns+"-r1")
}

// deleteAndWait deletes a resource and waits until it is gone, and with it
// the cluster-scoped object of its release.
func (e *env) deleteAndWait(gvr schema.GroupVersionResource, name string, object schema.GroupVersionResource, objectName string) {
	e.t.Helper()
	if err := e.dyn.Resource(gvr).Namespace(e.ns).Delete(context.Background(), name, metav1.DeleteOptions{}); err != nil {
		e.t.Fatal(err)
	}
	e.waitFor(name+" and "+objectName+" gone", 2*time.Minute, func() (bool, string) {
		_, errR := e.dyn.Resource(gvr).Namespace(e.ns).Get(context.Background(), name, metav1.GetOptions{})
		_, errC := e.dyn.Resource(object).Get(context.Background(), objectName, metav1.GetOptions{})
		return apierrors.IsNotFound(errR) && apierrors.IsNotFound(errC), fmt.Sprintf("resource: %v; object: %v", errR, errC)
	})
}

// releaseStatus decodes a resource's status.
func releaseStatus(u interface{ UnstructuredContent() map[string]any }) *v1alpha1.ReleaseStatus {
	st := &v1alpha1.ReleaseStatus{}
	if raw, ok := u.UnstructuredContent()["status"].(map[string]any); ok {
		_ = runtime.DefaultUnstructuredConverter.FromUnstructured(raw, st)
	}
	return st
}

// grantClusterKind lets the namespace's deployer and the manager use a
// cluster-scoped resource, as an admin who allows a watch's charts a
// cluster-scoped kind does.
func (e *env) grantClusterKind(group, resource string) {
	e.t.Helper()
	ctx := context.Background()
	name := "chartpilot-e2e-" + e.ns
	role := &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: name},
		Rules: []rbacv1.PolicyRule{{APIGroups: []string{group}, Resources: []string{resource}, Verbs: []string{"*"}}}}
	if _, err := e.cs.RbacV1().ClusterRoles().Create(ctx, role, metav1.CreateOptions{}); err != nil {
		e.t.Fatal(err)
	}
	binding := &rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: name},
		RoleRef: rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: name},
		Subjects: []rbacv1.Subject{
			{Kind: rbacv1.ServiceAccountKind, Name: e.deployer, Namespace: e.ns},
			{Kind: rbacv1.ServiceAccountKind, Name: "manager", Namespace: managerNamespace},
		}}
	if _, err := e.cs.RbacV1().ClusterRoleBindings().Create(ctx, binding, metav1.CreateOptions{}); err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(func() {
		_ = e.cs.RbacV1().ClusterRoleBindings().Delete(context.Background(), name, metav1.DeleteOptions{})
		_ = e.cs.RbacV1().ClusterRoles().Delete(context.Background(), name, metav1.DeleteOptions{})
	})
}

// buildCLI builds the chartpilot command into a temporary directory.
func buildCLI(t *testing.T) string {
	t.Helper()
	out := filepath.Join(t.TempDir(), "chartpilot")
	cmd := exec.Command("go", "build", "-o", out, "../../cmd/chartpilot")
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("building chartpilot: %v\n%s", err, b)
	}
	return out
}

// runCLI runs the chartpilot command against the cluster: its output
// (stdout and stderr) and its error.
func runCLI(bin string, args ...string) (string, error) {
	cmd := exec.Command(bin, append(args, "--kubeconfig", cluster.KubeconfigPath)...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	return out.String(), err
}

// exitCode is a command's exit code (0 without an error, -1 when it did not run).
func exitCode(err error) int {
	var ee *exec.ExitError
	switch {
	case err == nil:
		return 0
	case errors.As(err, &ee):
		return ee.ExitCode()
	}
	return -1
}
