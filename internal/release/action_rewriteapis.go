package release

import (
	"context"
	"fmt"
	"regexp"
	"sort"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	ctrl "sigs.k8s.io/controller-runtime"

	"github.com/chartpilot/chartpilot/internal/api/v1alpha1"
	"github.com/chartpilot/chartpilot/internal/helm"
	"github.com/chartpilot/chartpilot/internal/kubeapis"
)

// rewriteAPIsStep is the RewriteAPIs action: the newest revision is
// deployed and its stored manifest names API versions the cluster no
// longer serves (a cluster upgrade removed them). Helm builds the objects
// of the stored manifest before an upgrade, a rollback or an uninstall,
// and fails on such a kind ("unable to build kubernetes objects from
// current release manifest"); the step stores the revision again with
// the served replacement of each, as planAPIRewrite found it safe.
type rewriteAPIsStep struct{}

var _ = registerStep(actRewriteAPIs, rewriteAPIsStep{})

func (rewriteAPIsStep) full(ctx context.Context, r *Reconciler, f *fullPass) (ctrl.Result, bool, error) {
	plan := f.c.apiRewrite
	rel, err := r.Helm.As(f.d.identity).Rewrite(f.p.key.Namespace, f.p.key.Name, f.o.Latest.Revision, plan.manifest, plan.description)
	if err != nil {
		msg := "rewriting the stored manifest's API versions: " + oneLine(err.Error())
		r.Recorder.Event(f.p.obj, corev1.EventTypeWarning, "StoredAPIsNotRewritten", msg)
		reporter{r}.recordHistory(f.p, f.o.Latest.Labels[v1alpha1.LabelDigest], actionRewriteAPIs, f.o.Latest, false, msg)
		return ctrl.Result{RequeueAfter: r.mem.retryAfter(f.p.key, actionRewriteAPIs)}, false, nil
	}
	r.mem.retried(f.p.key, actionRewriteAPIs)
	r.Recorder.Event(f.p.obj, corev1.EventTypeNormal, "StoredAPIsRewritten", plan.description)
	f.p.log.Info("Rewrote the stored manifest's API versions", "revision", rel.Revision, "rewritten", plan.description)
	reporter{r}.recordHistory(f.p, rel.Labels[v1alpha1.LabelDigest], actionRewriteAPIs, rel, true, plan.description)
	reporter{r}.setReleaseInfo(f.p, rel)
	// An action that failed on the unserved kinds is tried again at once,
	// not after its back-off.
	f.p.status.LastFailure = nil
	r.mem.with(f.p.key, func(m *memo) { m.failure = nil })
	// The next pass observes the new revision and acts on it.
	return ctrl.Result{Requeue: true}, false, nil
}

// actionRewriteAPIs names the action in status.history and its retries.
const actionRewriteAPIs = "RewriteAPIs"

// apiRewrite is a planned RewriteAPIs: the new manifest and what changed.
type apiRewrite struct {
	manifest, description string
}

// planAPIRewrite looks at the newest revision's stored manifest. For each
// object at a version the cluster does not serve, the replacement must be
// served, and the object as the API server returns it at the replacement
// (the server's own conversion of what is stored) must hold every field
// the stored object sets, with the same value: only then does the same
// document, with the new apiVersion, mean the same thing. nil and why not
// when there is nothing to rewrite or it is not safe ("" when nothing to
// rewrite).
func (r *Reconciler) planAPIRewrite(ctx context.Context, p *pass, d *desired, latest *helm.Release) (*apiRewrite, string) {
	if r.KeepStoredAPIs || latest == nil || latest.Unread || latest.Status != helm.StatusDeployed {
		return nil, ""
	}
	objs, err := parseManifest(latest.Manifest)
	if err != nil {
		return nil, ""
	}
	to := map[schema.GroupVersionKind]schema.GroupVersionKind{}
	var rewritten []*unstructured.Unstructured
	for _, o := range objs {
		gvk := o.GroupVersionKind()
		if r.Helm.Served(gvk) {
			continue
		}
		l, ok := kubeapis.Lookup(gvk)
		switch {
		case !ok:
			return nil, fmt.Sprintf("%s %s is not served, and Kubernetes names no replacement for it", gvk.GroupVersion(), gvk.Kind)
		case l.Replacement.Empty() || l.Replacement.Kind != gvk.Kind:
			return nil, fmt.Sprintf("%s %s is not served, and has no replacement of the same kind", gvk.GroupVersion(), gvk.Kind)
		case !r.Helm.Served(l.Replacement):
			return nil, fmt.Sprintf("%s %s is not served, nor is its replacement %s", gvk.GroupVersion(), gvk.Kind, l.Replacement.GroupVersion())
		}
		if why := r.sameAtReplacement(ctx, p, d, o, l.Replacement); why != "" {
			return nil, why
		}
		to[gvk] = l.Replacement
		rewritten = append(rewritten, o)
	}
	if len(rewritten) == 0 {
		return nil, ""
	}
	manifest, err := rewriteAPIVersions(latest.Manifest, to)
	if err != nil {
		return nil, err.Error()
	}
	return &apiRewrite{manifest: manifest, description: describeRewrite(latest.Revision, to, rewritten)}, ""
}

// sameAtReplacement reads o as the API server returns it at version to, as
// the release's identity, and names the first field o sets that the
// server's object does not hold ("" when none).
func (r *Reconciler) sameAtReplacement(ctx context.Context, p *pass, d *desired, o *unstructured.Unstructured, to schema.GroupVersionKind) string {
	what := fmt.Sprintf("%s %s %q", o.GetAPIVersion(), o.GetKind(), o.GetName())
	mapping, err := r.Helm.RESTMapper().RESTMapping(to.GroupKind(), to.Version)
	if err != nil {
		return fmt.Sprintf("%s: reading %s: %v", what, to.GroupVersion(), err)
	}
	dyn, err := r.Helm.As(d.identity).Dynamic()
	if err != nil {
		return fmt.Sprintf("%s: %v", what, err)
	}
	res := dyn.Resource(mapping.Resource)
	var live *unstructured.Unstructured
	if mapping.Scope.Name() == apimeta.RESTScopeNameNamespace {
		ns := o.GetNamespace()
		if ns == "" {
			ns = p.key.Namespace
		}
		live, err = res.Namespace(ns).Get(ctx, o.GetName(), metav1.GetOptions{})
	} else {
		live, err = res.Get(ctx, o.GetName(), metav1.GetOptions{})
	}
	if apierrors.IsNotFound(err) {
		return fmt.Sprintf("%s does not exist: without the server's own conversion of it, its fields cannot be shown to mean the same at %s", what, to.GroupVersion())
	}
	if err != nil {
		return fmt.Sprintf("%s: reading it at %s: %v", what, to.GroupVersion(), err)
	}
	stored := o.DeepCopy().Object
	delete(stored, "apiVersion")
	delete(stored, "kind")
	delete(stored, "status")
	if md, ok := stored["metadata"].(map[string]any); ok {
		for k := range md {
			if k != "name" && k != "namespace" && k != "labels" && k != "annotations" {
				delete(md, k)
			}
		}
	}
	if path, ok := holds(live.Object, stored); !ok {
		return fmt.Sprintf("%s: at %s the API server holds %s differently from the stored manifest (a field that changed meaning, or was changed since): not rewritten", what, to.GroupVersion(), path)
	}
	return ""
}

// holds reports whether have holds every field want sets, with the same
// value (the drift check's comparison: lists element by element, numbers
// and quantities by value); path is the first that differs.
func holds(have, want map[string]any) (string, bool) {
	path, differs := subsetDiffers(want, want, have, "")
	if path == "" && differs {
		path = "the object"
	}
	return strings.TrimPrefix(path, "."), !differs
}

// apiVersionLine is a document's top-level apiVersion line.
var apiVersionLine = regexp.MustCompile(`(?m)^apiVersion:[ \t]*["']?([^"'\s#]+)["']?[ \t]*$`)

// rewriteAPIVersions gives each document of manifest whose object's kind
// is a key of to the apiVersion of its value, and checks that the result
// holds the same objects but for those apiVersions.
func rewriteAPIVersions(manifest string, to map[schema.GroupVersionKind]schema.GroupVersionKind) (string, error) {
	docs := strings.Split(manifest, "\n---")
	for i, doc := range docs {
		objs, err := helm.ParseManifest(doc)
		if err != nil || len(objs) != 1 {
			continue
		}
		repl, ok := to[objs[0].GroupVersionKind()]
		if !ok {
			continue
		}
		if m := apiVersionLine.FindAllStringSubmatch(doc, -1); len(m) != 1 || m[0][1] != objs[0].GetAPIVersion() {
			return "", fmt.Errorf("%s %s %q: its document has no single top-level apiVersion line to rewrite", objs[0].GetAPIVersion(), objs[0].GetKind(), objs[0].GetName())
		}
		docs[i] = apiVersionLine.ReplaceAllLiteralString(doc, "apiVersion: "+repl.GroupVersion().String())
	}
	out := strings.Join(docs, "\n---")
	before, err := helm.ParseManifest(manifest)
	if err != nil {
		return "", err
	}
	after, err := helm.ParseManifest(out)
	if err != nil || len(after) != len(before) {
		return "", fmt.Errorf("the rewritten manifest does not hold the same objects: %v", err)
	}
	for i := range before {
		b := before[i].DeepCopy()
		if repl, ok := to[b.GroupVersionKind()]; ok {
			b.SetAPIVersion(repl.GroupVersion().String())
		}
		if !equalObjects(b.Object, after[i].Object) {
			return "", fmt.Errorf("the rewritten manifest changes %s %q beyond its apiVersion", b.GetKind(), b.GetName())
		}
	}
	return out, nil
}

func equalObjects(a, b map[string]any) bool {
	return equality.Semantic.DeepEqual(a, b)
}

// describeRewrite says what a rewrite changes, for the event and history.
func describeRewrite(revision int, to map[schema.GroupVersionKind]schema.GroupVersionKind, objs []*unstructured.Unstructured) string {
	count := map[schema.GroupVersionKind]int{}
	for _, o := range objs {
		count[o.GroupVersionKind()]++
	}
	var parts []string
	for from, n := range count {
		parts = append(parts, fmt.Sprintf("%s %s (%d object(s)) as %s", from.GroupVersion(), from.Kind, n, to[from].GroupVersion()))
	}
	sort.Strings(parts)
	return fmt.Sprintf("revision %d's stored manifest named API versions this cluster no longer serves; revision %d stores %s, as the API server holds them", revision, revision+1, strings.Join(parts, ", "))
}

// apiRewriteGate plans a RewriteAPIs for the newest revision; when one is
// needed but not safe, a Warning event says why, once per reason.
func (r *Reconciler) apiRewriteGate(ctx context.Context, p *pass, d *desired, latest *helm.Release) *apiRewrite {
	plan, why := r.planAPIRewrite(ctx, p, d, latest)
	var told string
	r.mem.with(p.key, func(m *memo) { told, m.apiRewriteNote = m.apiRewriteNote, why })
	if why != "" && why != told {
		msg := "the stored manifest cannot be rewritten to served API versions, so upgrades, rollbacks and uninstalls of this release fail until it is: " + why
		r.Recorder.Event(p.obj, corev1.EventTypeWarning, "StoredAPIsNotRewritten", msg)
		p.log.Info("Stored manifest not rewritten", "why", why)
	}
	return plan
}
