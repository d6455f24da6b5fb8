package helm

import (
	"fmt"
	"strings"

	"helm.sh/helm/v3/pkg/action"
	"helm.sh/helm/v3/pkg/chartutil"
)

// Template renders a chart as `helm template` does: client-only, with the
// given Kubernetes version, no cluster needed. It returns the manifest (with
// hook and test objects) or Helm's error.
func Template(ch *Chart, name, namespace string, vals map[string]any, kubeVersion string) (string, error) {
	cfg := new(action.Configuration)
	in := action.NewInstall(cfg)
	in.DryRun = true
	in.ClientOnly = true
	in.Replace = true
	in.ReleaseName = name
	in.Namespace = namespace
	in.IncludeCRDs = true
	in.DisableHooks = false
	if kubeVersion != "" {
		kv, err := chartutil.ParseKubeVersion(kubeVersion)
		if err != nil {
			return "", fmt.Errorf("kube version %q: %w", kubeVersion, err)
		}
		in.KubeVersion = kv
	}
	rel, err := in.Run(ch.chart, copyValues(vals))
	if err != nil {
		return "", err
	}
	var b strings.Builder
	b.WriteString(rel.Manifest)
	for _, h := range rel.Hooks {
		b.WriteString("\n---\n")
		b.WriteString(h.Manifest)
	}
	return b.String(), nil
}
