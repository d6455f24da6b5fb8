package helm

import (
	"bufio"
	"fmt"
	"sort"
	"strings"

	"helm.sh/helm/v3/pkg/action"
	"helm.sh/helm/v3/pkg/chartutil"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// Kinds lists the kinds of objects a chart can create: those it renders
// with vals (client-only, for Kubernetes kubeVersion), and those its
// templates name literally (apiVersion and kind lines of a document), so
// that kinds behind a condition the values leave off are counted too.
func Kinds(ch *Chart, vals map[string]any, kubeVersion string) ([]schema.GroupVersionKind, error) {
	seen := map[schema.GroupVersionKind]bool{}
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
	for _, m := range manifests {
		objs, err := ParseManifest(m)
		if err != nil {
			return nil, err
		}
		for _, o := range objs {
			seen[o.GroupVersionKind()] = true
		}
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
