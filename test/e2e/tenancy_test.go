package e2e

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"

	"github.com/chartpilot/chartpilot/internal/api/v1alpha1"
)

var tenantGVR = schema.GroupVersionResource{Group: "chartpilot.dev", Version: "v1alpha1", Resource: "tenants"}

// tenant creates a cluster-scoped Tenant for the test and deletes it after.
func (e *env) tenant(name string, spec map[string]any) {
	e.t.Helper()
	u := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "chartpilot.dev/v1alpha1", "kind": "Tenant",
		"metadata": map[string]any{"name": name},
		"spec":     spec,
	}}
	if _, err := e.dyn.Resource(tenantGVR).Create(context.Background(), u, metav1.CreateOptions{}); err != nil {
		e.t.Fatalf("creating tenant %s: %v", name, err)
	}
	e.t.Cleanup(func() { _ = e.dyn.Resource(tenantGVR).Delete(context.Background(), name, metav1.DeleteOptions{}) })
}

func (e *env) patchTenant(name, body string) {
	e.t.Helper()
	if _, err := e.dyn.Resource(tenantGVR).Patch(context.Background(), name, "application/merge-patch+json", []byte(body), metav1.PatchOptions{}); err != nil {
		e.t.Fatal(err)
	}
}

// in returns a copy of e working in another namespace of the test.
// newNamespace is e in a namespace of its own, with its deployer.
func (e *env) newNamespace() *env {
	c := *e
	c.ns = cluster.Namespace(e.t)
	createIdentity(e.t, c.ns)
	return &c
}

func condition(u *unstructured.Unstructured, typ string) *metav1.Condition {
	st := &v1alpha1.ReleaseStatus{}
	if raw, ok := u.Object["status"].(map[string]any); ok {
		_ = runtime.DefaultUnstructuredConverter.FromUnstructured(raw, st)
	}
	return apimeta.FindStatusCondition(st.Conditions, typ)
}

func (e *env) waitCondition(gvr schema.GroupVersionResource, name, typ string, want metav1.ConditionStatus, reason string) *unstructured.Unstructured {
	e.t.Helper()
	var u *unstructured.Unstructured
	e.waitFor(fmt.Sprintf("%s %s=%s %s", name, typ, want, reason), 2*time.Minute, func() (bool, string) {
		u = e.get(gvr, name)
		c := condition(u, typ)
		if c == nil {
			return false, fmt.Sprintf("no %s condition", typ)
		}
		return c.Status == want && (reason == "" || c.Reason == reason), fmt.Sprintf("%s=%s %s: %s", typ, c.Status, c.Reason, c.Message)
	})
	return u
}

func (e *env) deploymentImage(name string) string {
	d, err := e.cs.AppsV1().Deployments(e.ns).Get(context.Background(), name, metav1.GetOptions{})
	if err != nil {
		return err.Error()
	}
	return d.Spec.Template.Spec.Containers[0].Image
}

// TestTenantValuesPerTenant: two tenants give the same kind different values;
// removing a tenant's override rolls the value back to the resource's own.
func TestTenantValuesPerTenant(t *testing.T) {
	a := setup(t)
	b := a.newNamespace()
	if _, err := a.cs.CoreV1().Namespaces().Patch(context.Background(), b.ns, "application/merge-patch+json", []byte(`{"metadata":{"labels":{"team":"b-`+b.ns+`"}}}`), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	a.tenant("ta-"+a.ns, map[string]any{
		"namespaces": []any{a.ns},
		"values":     []any{map[string]any{"kind": "Redis", "values": map[string]any{"image": map[string]any{"tag": "7.2-tenant-a"}}}},
	})
	b.tenant("tb-"+b.ns, map[string]any{
		"namespaceSelector": map[string]any{"matchLabels": map[string]any{"team": "b-" + b.ns}},
		"values":            []any{map[string]any{"kind": "chartpilot.dev/Redis", "values": map[string]any{"image": map[string]any{"tag": "7.4-tenant-b"}}}},
	})
	a.apply(redisGVR, "Redis", "cache", map[string]any{"image": map[string]any{"tag": "7.0-own"}})
	b.apply(redisGVR, "Redis", "cache", map[string]any{"image": map[string]any{"tag": "7.0-own"}})
	a.waitFor("tenant a's image", 2*time.Minute, func() (bool, string) {
		img := a.deploymentImage("cache")
		return img == "redis:7.2-tenant-a", img
	})
	b.waitFor("tenant b's image", 2*time.Minute, func() (bool, string) {
		img := b.deploymentImage("cache")
		return img == "redis:7.4-tenant-b", img
	})
	a.waitCondition(redisGVR, "cache", "TenantPolicy", metav1.ConditionTrue, "Passed")
	a.waitFor("cache Ready", 2*time.Minute, func() (bool, string) { return ready(a.get(redisGVR, "cache")) })
	// Removing tenant a's override rolls the value back to the resource's.
	a.patchTenant("ta-"+a.ns, `{"spec":{"values":null}}`)
	a.waitFor("the resource's own image back", 2*time.Minute, func() (bool, string) {
		img := a.deploymentImage("cache")
		return img == "redis:7.0-own", img
	})
}

// TestTenantLimitTightened: a limit tightened under existing resources marks
// them TenantPolicy=False and leaves their releases exactly as they were.
func TestTenantLimitTightened(t *testing.T) {
	e := setup(t)
	e.tenant("tl-"+e.ns, map[string]any{
		"namespaces": []any{e.ns},
		"limits":     map[string]any{"maxReplicas": 5, "maxStorage": "10Gi"},
	})
	e.apply(postgresGVR, "Postgres", "db", map[string]any{"version": "17", "replicas": 3, "storage": map[string]any{"size": "1Gi"}})
	e.waitFor("db Ready", 3*time.Minute, func() (bool, string) { return ready(e.get(postgresGVR, "db")) })
	before, _, _ := unstructured.NestedInt64(e.get(postgresGVR, "db").Object, "status", "release", "revision")

	e.patchTenant("tl-"+e.ns, `{"spec":{"limits":{"maxReplicas":2}}}`)
	u := e.waitCondition(postgresGVR, "db", "TenantPolicy", metav1.ConditionFalse, "MaxReplicasExceeded")
	if msg := condition(u, "TenantPolicy").Message; !strings.Contains(msg, "replicas 3") || !strings.Contains(msg, "maxReplicas 2") {
		t.Errorf("TenantPolicy message = %q", msg)
	}
	if c := condition(u, v1alpha1.ConditionReady); c.Status != metav1.ConditionFalse || c.Reason != "MaxReplicasExceeded" {
		t.Errorf("Ready = %+v", c)
	}
	// Nothing is touched: same revision, StatefulSet still at 3.
	if ok, seen := e.holds(2*time.Second, func() (bool, string) {
		after, _, _ := unstructured.NestedInt64(e.get(postgresGVR, "db").Object, "status", "release", "revision")
		sts, err := e.cs.AppsV1().StatefulSets(e.ns).Get(context.Background(), "db", metav1.GetOptions{})
		if err != nil {
			return false, fmt.Sprintf("statefulset %v", err)
		}
		return before == after && *sts.Spec.Replicas == 3, fmt.Sprintf("revision %d -> %d, statefulset replicas %d", before, after, *sts.Spec.Replicas)
	}); !ok {
		t.Errorf("release touched: %s", seen)
	}
	// A new spec that still breaks the limit is refused at admission.
	if err := e.patch(postgresGVR, "db", `{"spec":{"parameters":{"work_mem":"8MB"}}}`); err == nil || !strings.Contains(err.Error(), "maxReplicas 2") {
		t.Errorf("a spec change over the limit: want a refusal, got %v", err)
	}
	// The tenant reports the violation.
	e.waitFor("tenant status lists the violation", time.Minute, func() (bool, string) {
		tn, err := e.dyn.Resource(tenantGVR).Get(context.Background(), "tl-"+e.ns, metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		v, _, _ := unstructured.NestedStringSlice(tn.Object, "status", "violations")
		used, _, _ := unstructured.NestedString(tn.Object, "status", "storageUsed")
		n, _, _ := unstructured.NestedInt64(tn.Object, "status", "resources")
		return len(v) == 1 && strings.Contains(v[0], "db") && used == "3Gi" && n == 1, fmt.Sprintf("violations %v used %s resources %d", v, used, n)
	})
	// Loosening it again makes the resource Ready; and changes flow again.
	e.patchTenant("tl-"+e.ns, `{"spec":{"limits":{"maxReplicas":3}}}`)
	e.waitCondition(postgresGVR, "db", "TenantPolicy", metav1.ConditionTrue, "Passed")
	if err := e.patch(postgresGVR, "db", `{"spec":{"parameters":{"work_mem":"8MB"}}}`); err != nil {
		t.Fatal(err)
	}
	e.waitFor("upgrade applied", 2*time.Minute, func() (bool, string) {
		u := e.get(postgresGVR, "db")
		ok, obs := ready(u)
		rev, _, _ := unstructured.NestedInt64(u.Object, "status", "release", "revision")
		return ok && rev == before+1, fmt.Sprintf("%s revision %d", obs, rev)
	})
}

// TestTenantServiceAccountImpersonated: with serviceAccountName, Helm acts as
// that ServiceAccount; without RBAC for Services the install fails with a
// clear Forbidden message.
func TestTenantServiceAccountImpersonated(t *testing.T) {
	e := setup(t)
	ctx := context.Background()
	if _, err := e.cs.CoreV1().ServiceAccounts(e.ns).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "deployer"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	role := &rbacv1.Role{
		ObjectMeta: metav1.ObjectMeta{Name: "deployer"},
		Rules: []rbacv1.PolicyRule{
			{APIGroups: []string{""}, Resources: []string{"secrets", "configmaps"}, Verbs: []string{"*"}},
			{APIGroups: []string{"apps"}, Resources: []string{"deployments", "statefulsets"}, Verbs: []string{"*"}},
			// no Services
		},
	}
	if _, err := e.cs.RbacV1().Roles(e.ns).Create(ctx, role, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	binding := &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "deployer"},
		RoleRef:    rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "Role", Name: "deployer"},
		Subjects:   []rbacv1.Subject{{Kind: "ServiceAccount", Name: "deployer", Namespace: e.ns}},
	}
	if _, err := e.cs.RbacV1().RoleBindings(e.ns).Create(ctx, binding, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	e.tenant("ts-"+e.ns, map[string]any{"namespaces": []any{e.ns}, "serviceAccountName": "deployer"})
	e.apply(redisGVR, "Redis", "cache", map[string]any{})
	u := e.waitCondition(redisGVR, "cache", v1alpha1.ConditionReleased, metav1.ConditionFalse, "InstallFailed")
	msg := condition(u, v1alpha1.ConditionReleased).Message
	for _, want := range []string{"forbidden", "system:serviceaccount:" + e.ns + ":deployer", "services"} {
		if !strings.Contains(msg, want) {
			t.Errorf("Released message %q does not mention %q", msg, want)
		}
	}
	// Granting Services lets the next attempt through.
	role.Rules = append(role.Rules, rbacv1.PolicyRule{APIGroups: []string{""}, Resources: []string{"services"}, Verbs: []string{"*"}})
	if _, err := e.cs.RbacV1().Roles(e.ns).Update(ctx, role, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := e.patch(redisGVR, "cache", `{"metadata":{"annotations":{"chartpilot.dev/reconcile-requested-at":"rbac-fixed"}}}`); err != nil {
		t.Fatal(err)
	}
	e.waitFor("installed as the ServiceAccount", 2*time.Minute, func() (bool, string) { return ready(e.get(redisGVR, "cache")) })
}

// TestOverlappingTenants: a namespace claimed by two tenants is reported on
// both, and resources there are not reconciled.
func TestOverlappingTenants(t *testing.T) {
	e := setup(t)
	if _, err := e.cs.CoreV1().Namespaces().Patch(context.Background(), e.ns, "application/merge-patch+json", []byte(`{"metadata":{"labels":{"overlap":"`+e.ns+`"}}}`), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	e.tenant("tx-"+e.ns, map[string]any{"namespaces": []any{e.ns}})
	e.apply(redisGVR, "Redis", "cache", map[string]any{})
	e.waitFor("cache Ready under one tenant", 2*time.Minute, func() (bool, string) { return ready(e.get(redisGVR, "cache")) })
	revision := func() int64 {
		r, _, _ := unstructured.NestedInt64(e.get(redisGVR, "cache").Object, "status", "release", "revision")
		return r
	}
	before := revision()
	// A second tenant claims the namespace too.
	e.tenant("ty-"+e.ns, map[string]any{"namespaceSelector": map[string]any{"matchLabels": map[string]any{"overlap": e.ns}}})
	u := e.waitCondition(redisGVR, "cache", "TenantPolicy", metav1.ConditionFalse, "TenantOverlap")
	msg := condition(u, "TenantPolicy").Message
	if !strings.Contains(msg, "tx-"+e.ns) || !strings.Contains(msg, "ty-"+e.ns) {
		t.Errorf("message does not name both tenants: %q", msg)
	}
	if after := revision(); after != before {
		t.Errorf("the release changed under overlapping tenants: revision %d -> %d", before, after)
	}
	// New resources there are refused at admission.
	if err := e.tryCreate(redisGVR, "Redis", "other", map[string]any{}); err == nil || !strings.Contains(err.Error(), "TenantOverlap") {
		t.Errorf("a new resource in an overlapped namespace: want a refusal, got %v", err)
	}
	for _, name := range []string{"tx-" + e.ns, "ty-" + e.ns} {
		e.waitFor("tenant "+name+" reports the overlap", time.Minute, func() (bool, string) {
			tn, err := e.dyn.Resource(tenantGVR).Get(context.Background(), name, metav1.GetOptions{})
			if err != nil {
				return false, err.Error()
			}
			c := condition(tn, "Ready")
			if c == nil {
				return false, "no Ready condition"
			}
			return c.Status == metav1.ConditionFalse && c.Reason == "Overlap" && strings.Contains(c.Message, e.ns), c.Message
		})
	}
}

// TestAdmissionRejectsOverTenantLimit: the webhook, registered with the real
// API server, refuses a resource over its tenant's maxReplicas with a message
// naming the limit and the value; metadata changes are never refused.
func TestAdmissionRejectsOverTenantLimit(t *testing.T) {
	e := setup(t)
	e.tenant("tw-"+e.ns, map[string]any{"namespaces": []any{e.ns}, "limits": map[string]any{"maxReplicas": 2}})
	e.waitFor("webhook serving", time.Minute, func() (bool, string) {
		err := e.tryCreate(postgresGVR, "Postgres", "probe", map[string]any{"version": "17", "replicas": 9, "storage": map[string]any{"size": "1Gi"}})
		return err != nil && strings.Contains(err.Error(), "maxReplicas"), fmt.Sprint(err)
	})
	err := e.tryCreate(postgresGVR, "Postgres", "big", map[string]any{"version": "17", "replicas": 3, "storage": map[string]any{"size": "1Gi"}})
	if err == nil {
		t.Fatal("a Postgres over maxReplicas was admitted")
	}
	for _, want := range []string{"denied", "replicas 3 exceeds tenant tw-" + e.ns, "limits.maxReplicas 2"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("refusal %q does not mention %q", err, want)
		}
	}
	e.apply(postgresGVR, "Postgres", "small", map[string]any{"version": "17", "replicas": 2, "storage": map[string]any{"size": "1Gi"}})
	if err := e.patch(postgresGVR, "small", `{"spec":{"replicas":3}}`); err == nil || !strings.Contains(err.Error(), "maxReplicas 2") {
		t.Errorf("scaling over the limit: want a refusal, got %v", err)
	}
	if err := e.patch(postgresGVR, "small", `{"metadata":{"annotations":{"chartpilot.dev/pause":"true"}}}`); err != nil {
		t.Errorf("a metadata change was refused: %v", err)
	}
}

// TestAdmissionLimitsScheduling: a tenant's resources cannot ask for a
// priority class, a toleration or a node placement its Tenant does not
// allow, through the Postgres kind's fields or through spec.values.
func TestAdmissionLimitsScheduling(t *testing.T) {
	e := setup(t)
	e.tenant("tp-"+e.ns, map[string]any{"namespaces": []any{e.ns}, "limits": map[string]any{
		"allowedPriorityClasses": []any{"batch"}, "allowedTolerationKeys": []any{"team"}, "denyNodePlacement": true}})
	base := func() map[string]any {
		return map[string]any{"version": "17", "storage": map[string]any{"size": "1Gi"}}
	}
	e.waitFor("webhook refusing", time.Minute, func() (bool, string) {
		spec := base()
		spec["priorityClassName"] = "system-cluster-critical"
		err := e.tryCreate(postgresGVR, "Postgres", "probe", spec)
		return err != nil && strings.Contains(err.Error(), "allowedPriorityClasses"), fmt.Sprint(err)
	})
	for _, tc := range []struct {
		name string
		set  func(map[string]any)
		want string
	}{
		{"keyless toleration", func(s map[string]any) { s["tolerations"] = []any{map[string]any{"operator": "Exists"}} }, "toleration without a key"},
		{"foreign toleration key", func(s map[string]any) {
			s["values"] = map[string]any{"tolerations": []any{map[string]any{"key": "dedicated", "operator": "Exists"}}}
		}, "toleration key dedicated"},
		{"node selector", func(s map[string]any) { s["nodeSelector"] = map[string]any{"pool": "payments"} }, "nodeSelector is set"},
		{"affinity through values", func(s map[string]any) {
			s["values"] = map[string]any{"affinity": map[string]any{"nodeAffinity": map[string]any{}}}
		}, "affinity is set"},
	} {
		spec := base()
		tc.set(spec)
		if err := e.tryCreate(postgresGVR, "Postgres", "probe", spec); err == nil || !strings.Contains(err.Error(), "denied") || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want a denial naming %q", tc.name, err, tc.want)
		}
	}
	spec := base()
	spec["priorityClassName"], spec["tolerations"] = "batch", []any{map[string]any{"key": "team", "operator": "Exists"}}
	allowed := &unstructured.Unstructured{Object: map[string]any{"apiVersion": "chartpilot.dev/v1alpha1", "kind": "Postgres",
		"metadata": map[string]any{"name": "allowed", "namespace": e.ns}, "spec": spec}}
	if _, err := e.dyn.Resource(postgresGVR).Namespace(e.ns).Create(context.Background(), allowed, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}}); err != nil {
		t.Errorf("an allowed priority class and toleration were refused: %v", err)
	}
}

// TestAdmissionReadsRenderedResources: a CPU limit cannot be passed through
// a Postgres's spec.values: tenant limits read the values the kind renders.
func TestAdmissionReadsRenderedResources(t *testing.T) {
	e := setup(t)
	e.tenant("tc-"+e.ns, map[string]any{"namespaces": []any{e.ns}, "limits": map[string]any{"maxCPU": "1"}})
	spec := map[string]any{"version": "17", "storage": map[string]any{"size": "1Gi"},
		"values": map[string]any{"resources": map[string]any{"limits": map[string]any{"cpu": "8"}}}}
	var err error
	e.waitFor("webhook refusing", time.Minute, func() (bool, string) {
		err = e.tryCreate(postgresGVR, "Postgres", "sneaky", spec)
		return err != nil && strings.Contains(err.Error(), "maxCPU"), fmt.Sprint(err)
	})
	if !strings.Contains(err.Error(), "denied") {
		t.Errorf("refusal %q is not an admission denial", err)
	}
}

func (e *env) tryCreate(gvr schema.GroupVersionResource, kind, name string, spec map[string]any) error {
	u := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "chartpilot.dev/v1alpha1", "kind": kind,
		"metadata": map[string]any{"name": name, "namespace": e.ns},
		"spec":     spec,
	}}
	_, err := e.dyn.Resource(gvr).Namespace(e.ns).Create(context.Background(), u, metav1.CreateOptions{})
	return err
}

// TestNothingButSpecChangesWaitsOnTheWebhook: with no replica serving the
// webhook (failurePolicy Fail), a spec change is refused, but metadata
// changes and the removal of the finalizer of a resource being deleted go
// through: resources and namespaces can always finish deleting.
func TestNothingButSpecChangesWaitsOnTheWebhook(t *testing.T) {
	e := setup(t)
	ctx := context.Background()
	e.apply(redisGVR, "Redis", "w", map[string]any{})
	e.waitFor("Ready", 2*time.Minute, func() (bool, string) { return ready(e.get(redisGVR, "w")) })
	e.stop()

	if err := e.patch(redisGVR, "w", `{"spec":{"replicas":2}}`); err == nil {
		t.Fatal("a spec change was admitted with no webhook serving: the test proves nothing")
	}
	if err := e.patch(redisGVR, "w", `{"metadata":{"labels":{"team":"a"}}}`); err != nil {
		t.Fatalf("a metadata change needed the webhook: %v", err)
	}
	if err := e.dyn.Resource(redisGVR).Namespace(e.ns).Delete(ctx, "w", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := e.patch(redisGVR, "w", `{"metadata":{"finalizers":null}}`); err != nil {
		t.Fatalf("removing the finalizer of a resource being deleted needed the webhook: %v", err)
	}
	e.waitFor("resource gone", time.Minute, func() (bool, string) {
		_, err := e.dyn.Resource(redisGVR).Namespace(e.ns).Get(ctx, "w", metav1.GetOptions{})
		return err != nil && strings.Contains(err.Error(), "not found"), fmt.Sprint(err)
	})
}

// TestCRDsRefuseInjection: strings that would add fields to a pod are
// refused by the API server itself, from the CRDs' schemas, before any
// webhook or chart sees them.
func TestCRDsRefuseInjection(t *testing.T) {
	e := &env{t: t, ns: cluster.Namespace(t)}
	var err error
	if e.dyn, err = dynamic.NewForConfig(cluster.Config); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		gvr       schema.GroupVersionResource
		kind      string
		spec      map[string]any
		fieldPath string
	}{
		{redisGVR, "Redis", map[string]any{"image": map[string]any{"pullPolicy": "IfNotPresent\nhostPID: true"}}, "spec.image.pullPolicy"},
		{redisGVR, "Redis", map[string]any{"persistence": map[string]any{"storageClass": "fast\nhostNetwork: true"}}, "spec.persistence.storageClass"},
		{postgresGVR, "Postgres", map[string]any{"version": "17", "storage": map[string]any{"size": "1Gi"}, "priorityClassName": "x\nhostPID: true"}, "spec.priorityClassName"},
		{postgresGVR, "Postgres", map[string]any{"version": "17", "storage": map[string]any{"size": "1Gi", "storageClass": "a b"}}, "spec.storage.storageClass"},
	} {
		err := e.tryCreate(tc.gvr, tc.kind, "injected", tc.spec)
		if err == nil || !strings.Contains(err.Error(), tc.fieldPath) || strings.Contains(err.Error(), "webhook") {
			t.Errorf("%s %v: want a schema refusal naming %s, got %v", tc.kind, tc.spec, tc.fieldPath, err)
		}
	}
}
