// Package rbac derives the manager's ClusterRole from what it runs: the
// watched kinds, every kind their charts can create, and what the manager
// itself reads and writes. Nothing is granted with "*".
package rbac

import (
	"bytes"
	"fmt"
	"maps"
	"slices"
	"sort"

	rbacv1 "k8s.io/api/rbac/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/yaml"

	"github.com/chartpilot/chartpilot/hooks/tenancy"
	"github.com/chartpilot/chartpilot/internal/helm"
	"github.com/chartpilot/chartpilot/internal/watches"
)

// Options say what the role is for.
type Options struct {
	Watches []watches.Watch
	// Impersonate are the ServiceAccount names Helm may run as (watches'
	// serviceAccountName, --default-service-account, Tenants'); each is
	// granted by name only.
	Impersonate []string
	// Deployer, when set, is the ServiceAccount every resource's writes run
	// as in its own namespace (--default-service-account): lockdown. The
	// manager then keeps only reads of the charts' kinds, writes Secrets
	// only in its own namespace, and the charts' writes move to the
	// deployer ClusterRole (DeployerRules), bound in each namespace.
	Deployer string
	// WebhookConfiguration is the ValidatingWebhookConfiguration whose
	// caBundle the manager keeps ("" for none).
	WebhookConfiguration string
	// KubeVersion is the Kubernetes version charts are rendered for.
	KubeVersion string
	// ServiceAccount is the manager's own (namespace/name), bound to the role.
	ServiceAccountNamespace, ServiceAccountName string
	// Plurals are the resource names of custom kinds, from their CRDs
	// (others follow the API's convention).
	Plurals map[schema.GroupKind]string
}

var (
	readWrite = []string{"get", "list", "watch", "create", "update", "patch", "delete"}
	read      = []string{"get", "list", "watch"}
)

// derived is what the watches and their charts need.
type derived struct {
	watchRules []rbacv1.PolicyRule
	// charted are the kinds the charts can create.
	charted map[schema.GroupKind]bool
	// chartRoles are the rules of the Roles the charts render (resource
	// names dropped): whoever creates those Roles must hold them.
	chartRoles  []rbacv1.PolicyRule
	tenancyUsed bool
}

func derive(o Options) (*derived, error) {
	d := &derived{charted: map[schema.GroupKind]bool{}}
	for _, w := range o.Watches {
		if w.Chart == "" {
			return nil, fmt.Errorf("watch %s: chart is remote: download it and point chart at the directory to derive the role", w)
		}
		ch, err := helm.LoadChart(w.Chart)
		if err != nil {
			return nil, fmt.Errorf("watch %s: %w", w, err)
		}
		gvks, err := helm.Kinds(ch, nil, o.KubeVersion)
		if err != nil {
			return nil, fmt.Errorf("watch %s: %w", w, err)
		}
		for _, gvk := range gvks {
			d.charted[gvk.GroupKind()] = true
		}
		roles, err := helm.RoleRules(ch, nil, o.KubeVersion)
		if err != nil {
			return nil, fmt.Errorf("watch %s: %w", w, err)
		}
		d.chartRoles = append(d.chartRoles, roles...)
		plural := o.resource(w.GVK.GroupKind())
		d.watchRules = append(d.watchRules, rbacv1.PolicyRule{APIGroups: []string{w.GVK.Group}, Resources: []string{plural, plural + "/status", plural + "/finalizers"}, Verbs: []string{"get", "list", "watch", "update", "patch"}})
		d.tenancyUsed = d.tenancyUsed || slices.Contains(w.Hooks, tenancy.Name)
	}
	return d, nil
}

// Rules are the ClusterRole rules the manager needs. Without a Deployer it
// writes the charts' kinds itself; with one, it only reads them.
func Rules(o Options) ([]rbacv1.PolicyRule, error) {
	d, err := derive(o)
	if err != nil {
		return nil, err
	}
	rules := slices.Clone(d.watchRules)
	if o.Deployer == "" {
		rules = append(rules, o.byGroup(d.charted, readWrite)...)
		rules = append(rules, d.chartRoles...)
	} else {
		rules = append(rules, o.byGroup(d.charted, read)...)
	}
	rules = append(rules, ownRules(o, d.tenancyUsed)...)
	return rules, nil
}

// DeployerRules are the rules of the ClusterRole a namespace's deployer is
// bound to (by a RoleBinding, so they hold in that namespace only): the
// charts' kinds, the rules of the Roles they render, release records, the
// Jobs of backups and restores, and claims (grown, or made for a major
// upgrade or a restore; never deleted).
func DeployerRules(o Options) ([]rbacv1.PolicyRule, error) {
	d, err := derive(o)
	if err != nil {
		return nil, err
	}
	kinds := maps.Clone(d.charted)
	kinds[schema.GroupKind{Kind: "Secret"}] = true // release records
	rules := o.byGroup(kinds, readWrite)
	rules = append(rules,
		rbacv1.PolicyRule{APIGroups: []string{"batch"}, Resources: []string{"jobs"}, Verbs: []string{"get", "create"}},
		// Claims: grown with their StatefulSet, made for a major upgrade or a restore; never deleted.
		rbacv1.PolicyRule{APIGroups: []string{""}, Resources: []string{"persistentvolumeclaims"}, Verbs: []string{"get", "list", "watch", "create", "update", "patch"}},
	)
	return append(rules, d.chartRoles...), nil
}

// NamespaceRules are what the manager writes in its own namespace besides
// leader election, when it runs locked down: the release records' signing
// key and the webhook's certificates.
func NamespaceRules() []rbacv1.PolicyRule {
	return []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"secrets"}, Verbs: readWrite}}
}

// ownRules are what the manager itself needs besides the charts' kinds.
func ownRules(o Options, tenancyUsed bool) []rbacv1.PolicyRule {
	locked := o.Deployer != ""
	secrets, claims, jobs := readWrite, []string{"get", "list", "patch", "create"}, []string{"get", "list", "watch", "create"}
	if locked {
		secrets, claims, jobs = read, []string{"get", "list", "patch"}, read
	}
	rules := []rbacv1.PolicyRule{
		// Release records, Backup stores' credentials; unless locked down, the records' signing key and webhook
		// certificates (NamespaceRules).
		{APIGroups: []string{""}, Resources: []string{"secrets"}, Verbs: secrets},
		{APIGroups: []string{""}, Resources: []string{"events"}, Verbs: []string{"create", "patch"}},
		// Maintenance windows and tenants' namespaces; the ServiceAccounts of lockdown.
		{APIGroups: []string{""}, Resources: []string{"namespaces", "serviceaccounts"}, Verbs: read},
		// Leader election, and the Leases of the holders of pending revisions.
		{APIGroups: []string{"coordination.k8s.io"}, Resources: []string{"leases"}, Verbs: readWrite},
		// Secure metrics (--metrics-secure): the API server judges each caller.
		{APIGroups: []string{"authentication.k8s.io"}, Resources: []string{"tokenreviews"}, Verbs: []string{"create"}},
		{APIGroups: []string{"authorization.k8s.io"}, Resources: []string{"subjectaccessreviews"}, Verbs: []string{"create"}},
		// Backup stores: checked, their status written; a volume store's claim read.
		{APIGroups: []string{"chartpilot.dev"}, Resources: []string{"backupstores", "backupstores/status", "clusterbackupstores", "clusterbackupstores/status"}, Verbs: []string{"get", "list", "watch", "update", "patch"}},
		// and storage growth: the claims of a StatefulSet whose volumes grow are listed and expanded, their
		// StorageClasses read (does the class expand volumes? which one is the default?); unless locked down, a
		// PostgreSQL major upgrade makes the claim its data moves to, a passthrough restore the claim of the first pod.
		{APIGroups: []string{""}, Resources: []string{"persistentvolumeclaims"}, Verbs: claims},
		{APIGroups: []string{"storage.k8s.io"}, Resources: []string{"storageclasses"}, Verbs: []string{"get", "list"}},
		// Automatic volume growth: each volume's use, from the kubelets' statistics through the API server's node proxy.
		{APIGroups: []string{""}, Resources: []string{"nodes/proxy"}, Verbs: []string{"get"}},
		// Backups: made by schedules and pruned by retention, run as Jobs (created by the manager unless locked
		// down; their pods' termination messages read), a ClusterBackupStore's namespaceSelector matched against
		// namespaces.
		{APIGroups: []string{"chartpilot.dev"}, Resources: []string{"backups", "backups/status"}, Verbs: []string{"get", "list", "watch", "create", "update", "patch", "delete"}},
		{APIGroups: []string{"batch"}, Resources: []string{"jobs"}, Verbs: jobs},
		{APIGroups: []string{""}, Resources: []string{"pods"}, Verbs: []string{"list"}},
		{APIGroups: []string{""}, Resources: []string{"namespaces"}, Verbs: []string{"get"}},
		// The monitoring hook sees the Prometheus Operator's CRDs come and go.
		{APIGroups: []string{"apiextensions.k8s.io"}, Resources: []string{"customresourcedefinitions"}, Verbs: []string{"get", "list", "watch"}},
	}
	names := slices.Clone(o.Impersonate)
	if locked {
		names = append(names, o.Deployer)
	}
	if len(names) > 0 {
		sort.Strings(names)
		rules = append(rules, rbacv1.PolicyRule{APIGroups: []string{""}, Resources: []string{"serviceaccounts"}, Verbs: []string{"impersonate"}, ResourceNames: slices.Compact(names)})
	}
	if tenancyUsed {
		rules = append(rules, rbacv1.PolicyRule{APIGroups: []string{"chartpilot.dev"}, Resources: []string{"tenants", "tenants/status"}, Verbs: []string{"get", "list", "watch", "update", "patch"}})
	}
	if o.WebhookConfiguration != "" {
		rules = append(rules, rbacv1.PolicyRule{APIGroups: []string{"admissionregistration.k8s.io"}, Resources: []string{"validatingwebhookconfigurations"}, Verbs: []string{"get", "patch"}, ResourceNames: []string{o.WebhookConfiguration}})
	}
	return rules
}

// byGroup grants verbs on the kinds, one rule per API group.
func (o Options) byGroup(kinds map[schema.GroupKind]bool, verbs []string) []rbacv1.PolicyRule {
	groups := map[string][]string{}
	for gk := range kinds {
		groups[gk.Group] = append(groups[gk.Group], o.resource(gk))
	}
	names := make([]string, 0, len(groups))
	for g := range groups {
		names = append(names, g)
	}
	sort.Strings(names)
	out := make([]rbacv1.PolicyRule, 0, len(names))
	for _, g := range names {
		res := groups[g]
		sort.Strings(res)
		out = append(out, rbacv1.PolicyRule{APIGroups: []string{g}, Resources: slices.Compact(res), Verbs: verbs})
	}
	return out
}

// resource is the plural resource name of a kind: its CRD's, else by the
// API's convention.
func (o Options) resource(gk schema.GroupKind) string {
	if p, ok := o.Plurals[gk]; ok {
		return p
	}
	plural, _ := meta.UnsafeGuessKindToResource(gk.WithVersion(""))
	return plural.Resource
}

// Plurals reads the kind and plural of every CustomResourceDefinition in
// the YAML documents given.
func Plurals(docs ...[]byte) (map[schema.GroupKind]string, error) {
	out := map[schema.GroupKind]string{}
	for _, doc := range docs {
		for _, part := range bytes.Split(doc, []byte("\n---")) {
			var crd apiextensionsv1.CustomResourceDefinition
			if err := yaml.Unmarshal(part, &crd); err != nil {
				return nil, err
			}
			if crd.Kind == "CustomResourceDefinition" && crd.Spec.Names.Plural != "" {
				out[schema.GroupKind{Group: crd.Spec.Group, Kind: crd.Spec.Names.Kind}] = crd.Spec.Names.Plural
			}
		}
	}
	return out, nil
}

// RenderRules prints the manager's rules alone, a YAML list, without the
// impersonation rule (the chart writes it from its values).
func RenderRules(o Options) ([]byte, error) {
	rules, err := Rules(o)
	if err != nil {
		return nil, err
	}
	rules = slices.DeleteFunc(rules, func(r rbacv1.PolicyRule) bool { return slices.Equal(r.Verbs, []string{"impersonate"}) })
	return renderList(rules, "--rules-only")
}

// RenderDeployerRules prints DeployerRules, a YAML list.
func RenderDeployerRules(o Options) ([]byte, error) {
	rules, err := DeployerRules(o)
	if err != nil {
		return nil, err
	}
	return renderList(rules, "--deployer-rules-only")
}

func renderList(rules []rbacv1.PolicyRule, flag string) ([]byte, error) {
	y, err := yaml.Marshal(rules)
	if err != nil {
		return nil, err
	}
	return append([]byte("# Generated by `chartpilot rbac "+flag+"` from watches.yaml. Do not edit; run `make manifests`.\n"), y...), nil
}

// Render prints the manager's ClusterRole and its binding to the manager's
// ServiceAccount; locked down (a Deployer), also the manager's Role in its
// own namespace and the deployer ClusterRole ("deployer", bound in each
// namespace by `chartpilot identity create`).
func Render(o Options) ([]byte, error) {
	rules, err := Rules(o)
	if err != nil {
		return nil, err
	}
	ref := func(kind, name string) rbacv1.RoleRef {
		return rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: kind, Name: name}
	}
	subjects := []rbacv1.Subject{{Kind: "ServiceAccount", Name: o.ServiceAccountName, Namespace: o.ServiceAccountNamespace}}
	objs := []any{
		rbacv1.ClusterRole{TypeMeta: typeMeta("ClusterRole"), ObjectMeta: metav1.ObjectMeta{Name: "manager"}, Rules: rules},
		rbacv1.ClusterRoleBinding{TypeMeta: typeMeta("ClusterRoleBinding"), ObjectMeta: metav1.ObjectMeta{Name: "manager"}, RoleRef: ref("ClusterRole", "manager"), Subjects: subjects},
	}
	if o.Deployer != "" {
		deployer, err := DeployerRules(o)
		if err != nil {
			return nil, err
		}
		own := metav1.ObjectMeta{Name: "manager", Namespace: o.ServiceAccountNamespace}
		objs = append(objs,
			rbacv1.Role{TypeMeta: typeMeta("Role"), ObjectMeta: own, Rules: NamespaceRules()},
			rbacv1.RoleBinding{TypeMeta: typeMeta("RoleBinding"), ObjectMeta: own, RoleRef: ref("Role", "manager"), Subjects: subjects},
			rbacv1.ClusterRole{TypeMeta: typeMeta("ClusterRole"), ObjectMeta: metav1.ObjectMeta{Name: "deployer"}, Rules: deployer},
		)
	}
	var b bytes.Buffer
	b.WriteString("# Generated by `chartpilot rbac` from watches.yaml: what the manager needs to run\n# the watched kinds and their charts. Do not edit; run `make manifests`.\n")
	for i, obj := range objs {
		y, err := yaml.Marshal(obj)
		if err != nil {
			return nil, err
		}
		if i > 0 {
			b.WriteString("---\n")
		}
		b.Write(bytes.ReplaceAll(y, []byte("  creationTimestamp: null\n"), nil))
	}
	return b.Bytes(), nil
}

func typeMeta(kind string) metav1.TypeMeta {
	return metav1.TypeMeta{APIVersion: rbacv1.SchemeGroupVersion.String(), Kind: kind}
}
