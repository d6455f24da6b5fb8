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
	if err := commit(ctx); err != nil {
		return ctrl.Result{}, false, err
	}
	rel, err := r.Helm.As(f.d.identity).Rewrite(f.p.key.Namespace, f.p.key.Name, f.o.Latest.Revision, plan.from, plan.manifest, plan.description)
	if err != nil {
		msg := "rewriting the stored manifest's API versions: " + oneLine(err.Error())
		r.event(f.p, corev1.EventTypeWarning, "StoredAPIsNotRewritten", msg)
		reporter{r}.recordHistory(f.p, f.o.Latest.Labels[v1alpha1.LabelDigest], actionRewriteAPIs, f.o.Latest, false, msg)
		return ctrl.Result{RequeueAfter: r.mem.retryAfter(f.p.key, actionRewriteAPIs)}, false, nil
	}
	r.mem.retried(f.p.key, actionRewriteAPIs)
	r.event(f.p, corev1.EventTypeNormal, "StoredAPIsRewritten", plan.description)
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

// apiRewrite is a planned RewriteAPIs: the manifest it was planned from,
// the new one and what changed.
type apiRewrite struct {
	from, manifest, description string
}

// planAPIRewrite looks at the newest revision's stored manifest. For each
// object at a version the cluster does not serve, the replacement must be
// served, and the object as the API server returns it at the replacement
// (the server's own conversion of what is stored) must hold every field
// the stored object sets, with the same value: only then does the same
// document, with the new apiVersion, mean the same thing. nil and why not
// when there is nothing to rewrite or it is not safe ("" when nothing to
// rewrite).
func (r *Reconciler) planAPIRewrite(ctx context.Context, p *pass, identity string, latest *helm.Release) (*apiRewrite, string) {
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
			// Not a version Kubernetes removed (a CRD's kind not installed
			// now): not a rewrite's to mend.
			continue
		case l.Replacement.Empty() || l.Replacement.Kind != gvk.Kind:
			return nil, fmt.Sprintf("%s %s is not served, and has no replacement of the same kind", gvk.GroupVersion(), gvk.Kind)
		case !r.Helm.Served(l.Replacement):
			return nil, fmt.Sprintf("%s %s is not served, nor is its replacement %s", gvk.GroupVersion(), gvk.Kind, l.Replacement.GroupVersion())
		}
		if why := r.sameAtReplacement(ctx, p, identity, o, l.Replacement); why != "" {
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
	return &apiRewrite{from: latest.Manifest, manifest: manifest, description: describeRewrite(latest.Revision, to, rewritten)}, ""
}

// sameAtReplacement names why o, rewritten to version to, would not mean
// what it means now ("" when it would mean the same), from what the API
// server itself says, as the release's identity and within its scope:
//   - o read at version to (the server's conversion of what it stores)
//     must hold every field o sets, with the same value;
//   - a server-side apply of the rewritten o, dry run, must leave the
//     object as it is (a field whose meaning changed between the versions,
//     such as an empty selector, would change it).
func (r *Reconciler) sameAtReplacement(ctx context.Context, p *pass, identity string, o *unstructured.Unstructured, to schema.GroupVersionKind) string {
	what := fmt.Sprintf("%s %s %q", o.GetAPIVersion(), o.GetKind(), o.GetName())
	rewritten := o.DeepCopy()
	rewritten.SetAPIVersion(to.GroupVersion().String())
	res, err := r.resourceFor(identity, p.key.Namespace, rewritten)
	if err != nil {
		return fmt.Sprintf("%s at %s: %v", what, to.GroupVersion(), err)
	}
	live, err := res.Get(ctx, o.GetName(), metav1.GetOptions{})
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
	rewritten.SetResourceVersion("")
	applied, err := res.Apply(ctx, o.GetName(), rewritten, metav1.ApplyOptions{FieldManager: "chartpilot-dry-run", Force: true, DryRun: []string{metav1.DryRunAll}})
	if err != nil {
		return fmt.Sprintf("%s: the API server's dry run of it at %s: %v", what, to.GroupVersion(), err)
	}
	if field := changedBy(live.Object, applied.Object); field != "" {
		return fmt.Sprintf("%s: applied at %s it would change %s (a field that changed meaning between the versions): not rewritten", what, to.GroupVersion(), field)
	}
	return ""
}

// changedBy names the first field of after, beside metadata other than
// labels and annotations, that differs from before ("" when none).
func changedBy(before, after map[string]any) string {
	keys := map[string]bool{}
	for k := range before {
		keys[k] = true
	}
	for k := range after {
		keys[k] = true
	}
	sorted := make([]string, 0, len(keys))
	for k := range keys {
		sorted = append(sorted, k)
	}
	sort.Strings(sorted)
	for _, k := range sorted {
		switch k {
		case "metadata":
			bm, _ := before[k].(map[string]any)
			am, _ := after[k].(map[string]any)
			for _, f := range []string{"labels", "annotations"} {
				if !equality.Semantic.DeepEqual(bm[f], am[f]) {
					return "metadata." + f
				}
			}
		case "status", "apiVersion", "kind":
		default:
			if !equality.Semantic.DeepEqual(before[k], after[k]) {
				return k
			}
		}
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
	return fmt.Sprintf("%srevision %d's stored manifest named API versions this cluster no longer serves; revision %d stores %s, as the API server holds them", rewritePrefix, revision, revision+1, strings.Join(parts, ", "))
}

// rewritePrefix starts the description of a rewritten revision.
const rewritePrefix = "Rewritten API versions: "

// rewriteForUninstall rewrites the newest revision before an uninstall,
// which Helm cannot carry out on a manifest naming unserved kinds either;
// an error says why it could not.
func (r *Reconciler) rewriteForUninstall(ctx context.Context, p *pass, identity string, latest *helm.Release) error {
	if latest == nil || latest.Status != helm.StatusDeployed {
		return nil
	}
	if latest.Unread {
		full, err := r.Helm.Revision(p.key.Namespace, p.key.Name, latest.Revision)
		if err != nil {
			return err
		}
		latest = full
	}
	plan, why := r.planAPIRewrite(ctx, p, identity, latest)
	if why != "" {
		return fmt.Errorf("the stored manifest names API versions this cluster does not serve, and cannot be rewritten: %s", why)
	}
	if plan == nil {
		return nil
	}
	if err := commit(ctx); err != nil {
		return err
	}
	if _, err := r.Helm.As(identity).Rewrite(p.key.Namespace, p.key.Name, latest.Revision, plan.from, plan.manifest, plan.description); err != nil {
		return err
	}
	r.event(p, corev1.EventTypeNormal, "StoredAPIsRewritten", plan.description)
	return nil
}

// apiRewriteGate plans a RewriteAPIs for the newest revision; when one is
// needed but not safe, a Warning event says why, once per reason. It also
// finishes a rewrite a crash cut between its two writes: the revision
// rewritten is marked superseded.
func (r *Reconciler) apiRewriteGate(ctx context.Context, p *pass, d *desired, latest *helm.Release, history []*helm.Release) *apiRewrite {
	if latest != nil && latest.Status == helm.StatusDeployed && strings.HasPrefix(latest.Description, rewritePrefix) {
		for _, h := range history {
			if h.Revision == latest.Revision-1 && h.Status == helm.StatusDeployed {
				if err := r.Helm.As(d.identity).MarkSuperseded(p.key.Namespace, p.key.Name, h.Revision); err != nil {
					p.log.Info("Rewritten revision not marked superseded", "revision", h.Revision, "error", err.Error())
				}
			}
		}
	}
	plan, why := r.planAPIRewrite(ctx, p, d.identity, latest)
	var told string
	r.mem.with(p.key, func(m *memo) { told, m.apiRewriteNote = m.apiRewriteNote, why })
	if why != "" && why != told {
		msg := "the stored manifest cannot be rewritten to served API versions, so upgrades, rollbacks and uninstalls of this release fail until it is: " + why
		r.event(p, corev1.EventTypeWarning, "StoredAPIsNotRewritten", msg)
		p.log.Info("Stored manifest not rewritten", "why", why)
	}
	return plan
}
