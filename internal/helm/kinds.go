package helm

import (
	"bufio"
	"fmt"
	"slices"
	"sort"
	"strings"

	"helm.sh/helm/v3/pkg/action"
	"helm.sh/helm/v3/pkg/chartutil"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/yaml"
)

// Kinds lists the kinds of objects a chart can create: those it renders
// with vals (client-only, for Kubernetes kubeVersion), and those its
// templates name literally (apiVersion and kind lines of a document), so
// that kinds behind a condition the values leave off are counted too.
func Kinds(ch *Chart, vals map[string]any, kubeVersion string) ([]schema.GroupVersionKind, error) {
	seen := map[schema.GroupVersionKind]bool{}
	objs, err := Render(ch, vals, kubeVersion)
	if err != nil {
		return nil, err
	}
	for _, o := range objs {
		seen[o.GroupVersionKind()] = true
	}
	for _, tpl := range templatesOf(ch) {
		for _, gvk := range literalKinds(tpl) {
			seen[gvk] = true
		}
	}
	out := make([]schema.GroupVersionKind, 0, len(seen))
	for gvk := range seen {
		out = append(out, gvk)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].String() < out[j].String() })
	return out, nil
}

// Render renders a chart with vals, client-only, for Kubernetes
// kubeVersion, as release "rbac" in namespace "default": the objects of its
// manifest, its hooks and its CRDs.
func Render(ch *Chart, vals map[string]any, kubeVersion string) ([]*unstructured.Unstructured, error) {
	cfg := new(action.Configuration)
	in := action.NewInstall(cfg)
	in.DryRun, in.ClientOnly, in.Replace, in.IncludeCRDs = true, true, true, true
	in.ReleaseName, in.Namespace = "rbac", "default"
	kv, err := chartutil.ParseKubeVersion(kubeVersion)
	if err != nil {
		return nil, fmt.Errorf("kube version %q: %w", kubeVersion, err)
	}
	in.KubeVersion = kv
	rel, err := in.Run(ch.chart, copyValues(vals))
	if err != nil {
		return nil, fmt.Errorf("rendering chart %s: %w", ch.Name, err)
	}
	manifests := []string{rel.Manifest}
	for _, h := range rel.Hooks {
		manifests = append(manifests, h.Manifest)
	}
	var out []*unstructured.Unstructured
	for _, m := range manifests {
		objs, err := ParseManifest(m)
		if err != nil {
			return nil, err
		}
		out = append(out, objs...)
	}
	return out, nil
}

// templatesOf are the templates of a chart and of its dependencies.
func templatesOf(ch *Chart) []string {
	var out []string
	for _, t := range ch.chart.Templates {
		out = append(out, string(t.Data))
	}
	for _, dep := range ch.chart.Dependencies() {
		for _, t := range dep.Templates {
			out = append(out, string(t.Data))
		}
	}
	return out
}

// literalKinds reads the apiVersion and kind lines at the top level of each
// document of a template; lines with template actions are skipped.
func literalKinds(tpl string) []schema.GroupVersionKind {
	var out []schema.GroupVersionKind
	apiVersion, kind := "", ""
	flush := func() {
		if apiVersion != "" && kind != "" {
			out = append(out, schema.FromAPIVersionAndKind(apiVersion, kind))
		}
		apiVersion, kind = "", ""
	}
	sc := bufio.NewScanner(strings.NewReader(tpl))
	for sc.Scan() {
		line := sc.Text()
		switch {
		case strings.HasPrefix(line, "---"):
			flush()
		case strings.HasPrefix(line, "apiVersion:"):
			apiVersion = literal(strings.TrimPrefix(line, "apiVersion:"))
		case strings.HasPrefix(line, "kind:"):
			kind = literal(strings.TrimPrefix(line, "kind:"))
		}
	}
	flush()
	return out
}

// literal is a YAML scalar without template actions ("" when it has some).
func literal(v string) string {
	v = strings.Trim(strings.TrimSpace(v), `"'`)
	if strings.Contains(v, "{{") || strings.ContainsAny(v, " #") {
		return ""
	}
	return v
}

// RoleRules are the rules of the Roles a chart can create, resource names
// dropped: those it renders with vals, and those its templates write
// literally (the lines of a Role's rules without template actions), so
// that Roles behind a condition the values leave off are counted too.
// Whoever creates those Roles must hold these rules.
func RoleRules(ch *Chart, vals map[string]any, kubeVersion string) ([]rbacv1.PolicyRule, error) {
	objs, err := Render(ch, vals, kubeVersion)
	if err != nil {
		return nil, err
	}
	var out []rbacv1.PolicyRule
	for _, obj := range objs {
		if obj.GetKind() != "Role" || obj.GroupVersionKind().Group != rbacv1.GroupName {
			continue
		}
		var role rbacv1.Role
		if err := runtime.DefaultUnstructuredConverter.FromUnstructured(obj.Object, &role); err != nil {
			return nil, fmt.Errorf("chart %s: Role %s: %w", ch.Name, obj.GetName(), err)
		}
		out = append(out, role.Rules...)
	}
	for _, tpl := range templatesOf(ch) {
		rules, err := literalRoleRules(tpl)
		if err != nil {
			return nil, fmt.Errorf("chart %s: %w", ch.Name, err)
		}
		out = append(out, rules...)
	}
	for i := range out {
		out[i].ResourceNames = nil
	}
	return out, nil
}

// literalRoleRules reads the rules of each Role document of a template,
// skipping lines with template actions.
func literalRoleRules(tpl string) ([]rbacv1.PolicyRule, error) {
	var out []rbacv1.PolicyRule
	for _, doc := range strings.Split(tpl, "\n---") {
		if !slices.Contains(literalKinds(doc), rbacv1.SchemeGroupVersion.WithKind("Role")) {
			continue
		}
		var kept []string
		in := false
		for _, line := range strings.Split(doc, "\n") {
			top := line != "" && line[0] != ' ' && line[0] != '-' && line[0] != '#'
			switch {
			case strings.HasPrefix(line, "rules:"):
				in = true
			case top:
				in = false
			case in && !strings.Contains(line, "{{"):
				kept = append(kept, line)
			}
		}
		var rules []rbacv1.PolicyRule
		if err := yaml.Unmarshal([]byte(strings.Join(kept, "\n")), &rules); err != nil {
			return nil, fmt.Errorf("the rules of a Role, read without template actions: %w", err)
		}
		out = append(out, rules...)
	}
	return out, nil
}
