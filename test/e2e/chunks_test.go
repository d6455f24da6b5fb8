package e2e

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"testing"
	"time"

	admissionv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/chartpilot/chartpilot/internal/api/v1alpha1"
	"github.com/chartpilot/chartpilot/internal/helm"
	"github.com/chartpilot/chartpilot/internal/operator"
	"github.com/chartpilot/chartpilot/internal/watches"
)

// bigChart writes test/charts/webapp with four ConfigMaps of 800 KiB of
// random text each, from files the chart carries: the chart and the
// rendered manifest each hold the text, and its release record is over
// 5 MiB compressed.
func bigChart(t *testing.T) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "bigapp")
	if err := os.CopyFS(dir, os.DirFS(filepath.Join("..", "charts", "webapp"))); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Join(dir, "blobs"), 0o755); err != nil {
		t.Fatal(err)
	}
	for i := range 4 {
		buf := make([]byte, 600<<10)
		if _, err := rand.Read(buf); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, "blobs", fmt.Sprintf("blob-%d", i)), []byte(base64.StdEncoding.EncodeToString(buf)), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	tpl := `{{- range $path, $_ := .Files.Glob "blobs/*" }}
---
apiVersion: v1
kind: ConfigMap
metadata:
  name: {{ $.Release.Name }}-{{ base $path }}
data:
  blob: {{ $.Files.Get $path | quote }}
{{- end }}
`
	if err := os.WriteFile(filepath.Join(dir, "templates", "blobs.yaml"), []byte(tpl), 0o644); err != nil {
		t.Fatal(err)
	}
	return dir
}

// recordSecrets lists the records (owner=helm) or the chunks of release name.
func (e *env) recordSecrets(name, owner string) []corev1.Secret {
	e.t.Helper()
	list, err := e.cs.CoreV1().Secrets(e.ns).List(context.Background(), metav1.ListOptions{
		LabelSelector: helm.StorageLabelOwner + "=" + owner + "," + helm.StorageLabelName + "=" + name,
	})
	if err != nil {
		e.t.Fatal(err)
	}
	sort.Slice(list.Items, func(i, j int) bool { return list.Items[i].Name < list.Items[j].Name })
	return list.Items
}

// orphanedChunks names the chunks of release name that no record names.
func (e *env) orphanedChunks(name string) []string {
	named := map[string]bool{}
	for _, s := range e.recordSecrets(name, helm.StorageOwnerHelm) {
		named[s.Labels[helm.StorageLabelVersion]+"/"+s.Labels[v1alpha1.LabelRecordDigest]] = true
	}
	var out []string
	for _, c := range e.recordSecrets(name, helm.StorageOwnerChunk) {
		if !named[c.Labels[helm.StorageLabelVersion]+"/"+c.Labels[v1alpha1.LabelRecordDigest]] {
			out = append(out, c.Name)
		}
	}
	return out
}

// chunksOfRevision returns the chunks the record of a revision names.
func (e *env) chunksOfRevision(name string, revision int) []corev1.Secret {
	e.t.Helper()
	head, err := e.cs.CoreV1().Secrets(e.ns).Get(context.Background(), fmt.Sprintf("sh.helm.release.v1.%s.v%d", name, revision), metav1.GetOptions{})
	if err != nil {
		e.t.Fatal(err)
	}
	if head.Labels[v1alpha1.LabelRecordChunks] == "" {
		e.t.Fatalf("the record of revision %d is not chunked: labels %v", revision, head.Labels)
	}
	var out []corev1.Secret
	for _, c := range e.recordSecrets(name, helm.StorageOwnerChunk) {
		if c.Labels[helm.StorageLabelVersion] == fmt.Sprint(revision) && c.Labels[v1alpha1.LabelRecordDigest] == head.Labels[v1alpha1.LabelRecordDigest] {
			out = append(out, c)
		}
	}
	if fmt.Sprint(len(out)) != head.Labels[v1alpha1.LabelRecordChunks] {
		e.t.Fatalf("revision %d: %d chunks, its record names %s", revision, len(out), head.Labels[v1alpha1.LabelRecordChunks])
	}
	return out
}

// waitMessage waits until the release is Ready at revision with its
// ConfigMap holding message.
func (e *env) waitMessage(name, message string, revision int64) {
	e.t.Helper()
	e.waitFor(fmt.Sprintf("%s Ready at revision %d with %q", name, revision, message), 4*time.Minute, func() (bool, string) {
		u := e.get(publicdbGVR, name)
		ok, obs := ready(u)
		cm, err := e.cs.CoreV1().ConfigMaps(e.ns).Get(context.Background(), name+"-config", metav1.GetOptions{})
		if err != nil {
			return false, obs + "; " + err.Error()
		}
		return ok && cm.Data["message"] == message && revisionOf(u) == revision, fmt.Sprintf("%s; message %q; revision %d", obs, cm.Data["message"], revisionOf(u))
	})
}

// waitStalledOn waits until the resource is Stalled with reason, its
// message containing each of says.
func (e *env) waitStalledOn(name, reason string, says ...string) {
	e.t.Helper()
	e.waitFor(name+" Stalled "+reason, 3*time.Minute, func() (bool, string) {
		c := condition(e.get(publicdbGVR, name), v1alpha1.ConditionStalled)
		if c == nil || c.Status != metav1.ConditionTrue || c.Reason != reason {
			return false, fmt.Sprint(c)
		}
		for _, s := range says {
			if !strings.Contains(c.Message, s) {
				return false, c.Message
			}
		}
		return true, ""
	})
}

// TestChunkedReleaseRecords: a chart whose release record is over 5 MiB
// compressed installs, upgrades, rolls back and uninstalls, its records
// stored in chunks. An operator SIGKILLed between the chunk writes of an
// upgrade leaves a release the next operator finishes, with no chunk left
// that no record names. A chunk changed or deleted is refused as an
// untrusted record, naming the chunk; put back, the release goes on.
func TestChunkedReleaseRecords(t *testing.T) {
	chart := bigChart(t)
	watch := fmt.Sprintf("- {group: test.chartpilot.dev, version: v1alpha1, kind: Publicdb, chart: %s, healthTimeout: 2m}\n", chart)
	ws, err := watches.Parse([]byte(watch), ".", os.LookupEnv)
	if err != nil {
		t.Fatal(err)
	}
	e := setup(t, func(o *operator.Options) { o.Watches = ws })
	e.stop() // this test runs its operators as processes
	withChart := operatorWatchesEnv + "=" + watch
	op := e.startOperatorProcess(withChart)
	ctx := context.Background()

	r := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "test.chartpilot.dev/v1alpha1", "kind": "Publicdb", "metadata": map[string]any{"name": "big"},
		"spec": map[string]any{"message": "one"},
	}}
	if _, err := e.dyn.Resource(publicdbGVR).Namespace(e.ns).Create(ctx, r, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	e.waitMessage("big", "one", 1)
	size := 0
	chunks := e.chunksOfRevision("big", 1)
	for _, c := range chunks {
		size += len(c.Data["chunk"])
	}
	t.Logf("the record of revision 1: %d chunks, %.2f MiB compressed", len(chunks), float64(size)/(1<<20))
	if size < 5<<20 {
		t.Fatalf("the record of revision 1 holds %d bytes compressed: the test wants over 5 MiB", size)
	}

	// An upgrade, and a failed one rolled back.
	if err := e.patch(publicdbGVR, "big", `{"spec":{"message":"two"}}`); err != nil {
		t.Fatal(err)
	}
	e.waitMessage("big", "two", 2)
	if err := e.patch(publicdbGVR, "big", `{"spec":{"message":"bad","port":70000}}`); err != nil {
		t.Fatal(err)
	}
	e.waitFor("the failed upgrade rolled back", 4*time.Minute, func() (bool, string) {
		u := e.get(publicdbGVR, "big")
		c := condition(u, v1alpha1.ConditionReleased)
		return c != nil && strings.Contains(c.Message, "rolled back to revision 2") && revisionOf(u) == 4, fmt.Sprintf("%v; revision %d", c, revisionOf(u))
	})
	if cm, err := e.cs.CoreV1().ConfigMaps(e.ns).Get(ctx, "big-config", metav1.GetOptions{}); err != nil || cm.Data["message"] != "two" {
		t.Fatalf("after the rollback: %v, %v", cm.Data, err)
	}
	e.chunksOfRevision("big", 4)

	// The third chunk of the next record is refused by the API server; the
	// operator is killed with the first two written.
	e.holdChunk("2")
	if err := e.patch(publicdbGVR, "big", `{"spec":{"message":"three","port":8080}}`); err != nil {
		t.Fatal(err)
	}
	e.waitFor("the upgrade held at the third chunk", 3*time.Minute, func() (bool, string) {
		raw, _ := json.Marshal(e.get(publicdbGVR, "big").Object["status"])
		return strings.Contains(string(raw), "held by the test"), string(raw)
	})
	if err := op.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = op.Wait()
	partial := e.orphanedChunks("big")
	if len(partial) < 2 {
		t.Fatalf("chunks no record names after the kill: %v, want the two written", partial)
	}
	if _, err := e.cs.CoreV1().Secrets(e.ns).Get(ctx, "sh.helm.release.v1.big.v5", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Fatalf("the record of revision 5 after the kill: %v, want none", err)
	}
	e.releaseChunks()
	// The spec changes meanwhile: the chunks written are of no record now.
	if err := e.patch(publicdbGVR, "big", `{"spec":{"message":"four"}}`); err != nil {
		t.Fatal(err)
	}
	op = e.startOperatorProcess(withChart)
	e.waitMessage("big", "four", 5)
	e.waitFor("no chunk that no record names", 2*time.Minute, func() (bool, string) {
		left := e.orphanedChunks("big")
		return len(left) == 0, fmt.Sprint(left)
	})
	for _, name := range partial {
		if _, err := e.cs.CoreV1().Secrets(e.ns).Get(ctx, name, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
			t.Errorf("chunk %s written before the kill: %v, want it deleted", name, err)
		}
	}

	// A changed chunk, then a missing one: refused naming it (an operator
	// started afresh reads the chunks; the running one remembers bodies it
	// checked). Put back, the release is Ready again.
	target := e.chunksOfRevision("big", 5)[1]
	restart := func() {
		_ = op.Process.Signal(syscall.SIGKILL)
		_ = op.Wait()
	}
	restart()
	forged := target.DeepCopy()
	forged.Data["chunk"] = append([]byte(nil), target.Data["chunk"]...)
	forged.Data["chunk"][100] ^= 1
	if _, err := e.cs.CoreV1().Secrets(e.ns).Update(ctx, forged, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	op = e.startOperatorProcess(withChart)
	e.waitStalledOn("big", "UntrustedReleaseRecord", target.Name, "no valid MAC")
	putBack, err := e.cs.CoreV1().Secrets(e.ns).Get(ctx, target.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	putBack.Data = target.Data
	if _, err := e.cs.CoreV1().Secrets(e.ns).Update(ctx, putBack, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	e.waitMessage("big", "four", 5)
	restart()
	if err := e.cs.CoreV1().Secrets(e.ns).Delete(ctx, target.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	op = e.startOperatorProcess(withChart)
	e.waitStalledOn("big", "UntrustedReleaseRecord", target.Name, "missing")
	again := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: target.Name, Labels: target.Labels}, Type: target.Type, Data: target.Data}
	if _, err := e.cs.CoreV1().Secrets(e.ns).Create(ctx, again, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	e.waitMessage("big", "four", 5)

	// Uninstalled: objects, records and chunks gone.
	if err := e.dyn.Resource(publicdbGVR).Namespace(e.ns).Delete(ctx, "big", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	e.waitFor("big, its objects, records and chunks gone", 3*time.Minute, func() (bool, string) {
		_, errR := e.dyn.Resource(publicdbGVR).Namespace(e.ns).Get(ctx, "big", metav1.GetOptions{})
		_, errC := e.cs.CoreV1().ConfigMaps(e.ns).Get(ctx, "big-blob-0", metav1.GetOptions{})
		heads, chunks := e.recordSecrets("big", helm.StorageOwnerHelm), e.recordSecrets("big", helm.StorageOwnerChunk)
		return apierrors.IsNotFound(errR) && apierrors.IsNotFound(errC) && len(heads) == 0 && len(chunks) == 0,
			fmt.Sprintf("resource: %v; ConfigMap: %v; %d records, %d chunks", errR, errC, len(heads), len(chunks))
	})
}

// holdChunk makes the API server refuse, in the test's namespace, the
// creation of a chunk Secret of this index (a ValidatingAdmissionPolicy),
// and waits until it does.
func (e *env) holdChunk(index string) {
	e.t.Helper()
	ctx := context.Background()
	name := "hold-chunks-" + e.ns
	fail := admissionv1.Fail
	policy := &admissionv1.ValidatingAdmissionPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: admissionv1.ValidatingAdmissionPolicySpec{
			FailurePolicy: &fail,
			MatchConstraints: &admissionv1.MatchResources{ResourceRules: []admissionv1.NamedRuleWithOperations{{
				RuleWithOperations: admissionv1.RuleWithOperations{
					Operations: []admissionv1.OperationType{admissionv1.Create},
					Rule:       admissionv1.Rule{APIGroups: []string{""}, APIVersions: []string{"v1"}, Resources: []string{"secrets"}},
				},
			}}},
			Validations: []admissionv1.Validation{{
				Expression: fmt.Sprintf("!has(object.metadata.labels) || !(%q in object.metadata.labels) || object.metadata.labels[%q] != %q",
					v1alpha1.LabelRecordChunk, v1alpha1.LabelRecordChunk, index),
				Message: "held by the test",
			}},
		},
	}
	binding := &admissionv1.ValidatingAdmissionPolicyBinding{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: admissionv1.ValidatingAdmissionPolicyBindingSpec{
			PolicyName:        name,
			ValidationActions: []admissionv1.ValidationAction{admissionv1.Deny},
			MatchResources: &admissionv1.MatchResources{NamespaceSelector: &metav1.LabelSelector{
				MatchLabels: map[string]string{"kubernetes.io/metadata.name": e.ns},
			}},
		},
	}
	ar := e.cs.AdmissionregistrationV1()
	if _, err := ar.ValidatingAdmissionPolicies().Create(ctx, policy, metav1.CreateOptions{}); err != nil {
		e.t.Fatal(err)
	}
	if _, err := ar.ValidatingAdmissionPolicyBindings().Create(ctx, binding, metav1.CreateOptions{}); err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(e.releaseChunks)
	e.waitFor("the API server refusing the chunk", time.Minute, func() (bool, string) {
		err := e.probeChunk(index)
		return err != nil && strings.Contains(err.Error(), "held by the test"), fmt.Sprint(err)
	})
}

// releaseChunks removes holdChunk's policy and waits until chunks are
// created again.
func (e *env) releaseChunks() {
	ctx := context.Background()
	name := "hold-chunks-" + e.ns
	ar := e.cs.AdmissionregistrationV1()
	if err := ar.ValidatingAdmissionPolicyBindings().Delete(ctx, name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
		e.t.Error(err)
	}
	if err := ar.ValidatingAdmissionPolicies().Delete(ctx, name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
		e.t.Error(err)
	}
	e.waitFor("the API server accepting chunks again", time.Minute, func() (bool, string) {
		err := e.probeChunk("2")
		return err == nil, fmt.Sprint(err)
	})
}

// probeChunk creates and deletes a Secret labelled as chunk index (of no
// release).
func (e *env) probeChunk(index string) error {
	ctx := context.Background()
	probe := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "probe-chunk", Labels: map[string]string{v1alpha1.LabelRecordChunk: index}}}
	_, err := e.cs.CoreV1().Secrets(e.ns).Create(ctx, probe, metav1.CreateOptions{})
	if err == nil {
		_ = e.cs.CoreV1().Secrets(e.ns).Delete(ctx, probe.Name, metav1.DeleteOptions{})
	}
	return err
}
