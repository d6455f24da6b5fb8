package main

import (
	"bytes"
	"context"
	"os"
	"strings"
	"testing"

	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/yaml"
)

// TestIdentityCreate: `chartpilot identity create -n NS` makes a
// ServiceAccount that may deploy the charts in NS and nowhere else, is
// idempotent, and refuses (naming the fix) a missing ClusterRole or a
// RoleBinding of its name that binds something else.
func TestIdentityCreate(t *testing.T) {
	cluster.Skip(t)
	ctx := context.Background()
	cs, err := kubernetes.NewForConfig(cluster.Config)
	if err != nil {
		t.Fatal(err)
	}
	ns, other := cluster.Namespace(t), cluster.Namespace(t)
	run := func(args ...string) (string, error) {
		var out bytes.Buffer
		err := identityCommand(ctx, append([]string{"create", "--kubeconfig", cluster.KubeconfigPath}, args...), &out, &bytes.Buffer{})
		return out.String(), err
	}
	role := "identity-test-deployer"
	if _, err := run("-n", ns, "--cluster-role", role); err == nil || !strings.Contains(err.Error(), "ClusterRole "+role+" does not exist") {
		t.Fatalf("without the ClusterRole: %v, want it named", err)
	}
	raw, err := os.ReadFile("../../charts/chartpilot/files/deployer-rules.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var rules []rbacv1.PolicyRule
	if err := yaml.Unmarshal(raw, &rules); err != nil {
		t.Fatal(err)
	}
	if _, err := cs.RbacV1().ClusterRoles().Create(ctx, &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: role}, Rules: rules}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	out, err := run("-n", ns, "--cluster-role", role)
	if err != nil || !strings.Contains(out, "serviceaccount/chartpilot-deployer created in "+ns) || !strings.Contains(out, "rolebinding/chartpilot-deployer created") {
		t.Fatalf("identity create: %v\n%s", err, out)
	}
	if out, err := run("-n", ns, "--cluster-role", role); err != nil || strings.Count(out, "unchanged") != 2 {
		t.Fatalf("identity create again: %v\n%s", err, out)
	}
	sa, err := cs.CoreV1().ServiceAccounts(ns).Get(ctx, "chartpilot-deployer", metav1.GetOptions{})
	if err != nil || sa.AutomountServiceAccountToken == nil || *sa.AutomountServiceAccountToken {
		t.Errorf("the ServiceAccount mounts its token in pods: %v", err)
	}

	// The API server's own judgement: it may write in ns, not in other.
	cfg := rest.CopyConfig(cluster.Config)
	cfg.Impersonate = rest.ImpersonationConfig{UserName: "system:serviceaccount:" + ns + ":chartpilot-deployer"}
	as, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := as.AppsV1().StatefulSets(ns).List(ctx, metav1.ListOptions{}); err != nil {
		t.Errorf("the deployer may not list StatefulSets in its namespace: %v", err)
	}
	if _, err := as.CoreV1().Secrets(other).List(ctx, metav1.ListOptions{}); !apierrors.IsForbidden(err) {
		t.Errorf("the deployer lists Secrets of another namespace: %v", err)
	}
	if _, err := as.RbacV1().ClusterRoles().List(ctx, metav1.ListOptions{}); !apierrors.IsForbidden(err) {
		t.Errorf("the deployer lists ClusterRoles: %v", err)
	}

	// A RoleBinding of that name that binds something else is left alone.
	if _, err := cs.RbacV1().RoleBindings(other).Create(ctx, &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "chartpilot-deployer"},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "view"},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: "someone", Namespace: other}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := run("-n", other, "--cluster-role", role); err == nil || !strings.Contains(err.Error(), "delete it or choose another --service-account") {
		t.Errorf("a conflicting RoleBinding: %v, want a refusal naming the fix", err)
	}
	rb, err := cs.RbacV1().RoleBindings(other).Get(ctx, "chartpilot-deployer", metav1.GetOptions{})
	if err != nil || rb.RoleRef.Name != "view" {
		t.Errorf("the conflicting RoleBinding was changed: %v", err)
	}
}
