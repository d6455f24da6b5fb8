package release

import (
	"testing"

	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	toolscache "k8s.io/client-go/tools/cache"
	"sigs.k8s.io/yaml"

	"github.com/chartpilot/chartpilot/internal/api/v1alpha1"
)

const compactSample = `
apiVersion: apps/v1
kind: Deployment
metadata:
  name: web
  namespace: team-a
  generation: 3
  labels: {chartpilot.dev/release: web, app: web}
  annotations: {chartpilot.dev/owner: WebApp/team-a/web, note: "<b>&</b>"}
  managedFields:
  - {manager: helm, operation: Update}
spec:
  replicas: 2
  paused: false
  progressDeadlineSeconds: 600
  template:
    spec:
      containers:
      - name: web
        image: nginx:1.27
        ports: [{containerPort: 8080, protocol: TCP}]
        resources: {limits: {cpu: 500m}}
        env: [{name: RATIO, value: "0.5"}, {name: EMPTY}]
      tolerations: null
  strategy: {rollingUpdate: {maxSurge: 25%, maxUnavailable: 0}}
status:
  observedGeneration: 3
  readyReplicas: 2
  replicas: 2
  availableReplicas: 2
  updatedReplicas: 2
  weight: 0.25
  conditions:
  - {type: Available, status: "True"}
`

func sampleObject(t *testing.T) *unstructured.Unstructured {
	t.Helper()
	u := &unstructured.Unstructured{}
	if err := yaml.Unmarshal([]byte(compactSample), &u.Object); err != nil {
		t.Fatal(err)
	}
	// Decoded as the API server's answers are: whole numbers as int64.
	b, err := u.MarshalJSON()
	if err != nil {
		t.Fatal(err)
	}
	out := &unstructured.Unstructured{}
	if err := out.UnmarshalJSON(b); err != nil {
		t.Fatal(err)
	}
	return out
}

func TestCompactedObjectReadsWhole(t *testing.T) {
	want := sampleObject(t)
	want.SetManagedFields(nil)

	got, err := compactObject(sampleObject(t))
	if err != nil {
		t.Fatal(err)
	}
	c := got.(*unstructured.Unstructured)
	if _, ok := c.Object[compactField]; !ok {
		t.Fatalf("not compacted: %v", c.Object)
	}
	if _, ok := c.Object["spec"]; ok {
		t.Error("the compacted object still holds its spec decoded")
	}
	// What event handlers and the cache's indexes read stays decoded.
	if c.GetName() != "web" || c.GetNamespace() != "team-a" || c.GetGeneration() != 3 ||
		c.GetLabels()[v1alpha1.LabelRelease] != "web" || c.GetAnnotations()[v1alpha1.AnnotationOwner] != "WebApp/team-a/web" {
		t.Errorf("metadata lost: %v", c.Object["metadata"])
	}
	if len(c.GetManagedFields()) != 0 {
		t.Error("managed fields kept")
	}
	// Compacting twice (an informer's streamed initial list is
	// transformed twice) changes nothing.
	again, _ := compactObject(c)
	if !equality.Semantic.DeepEqual(again.(*unstructured.Unstructured).Object, c.Object) {
		t.Error("compacting twice changed the object")
	}

	// An object holding a field of that name beside others reads back as
	// it is.
	forged := sampleObject(t)
	forged.SetManagedFields(nil)
	forged.Object[compactField] = `{"status":{"readyReplicas":9}}`
	fc, _ := compactObject(forged.DeepCopy())
	back := fc.(*unstructured.Unstructured).DeepCopy()
	if err := expand(back); err != nil {
		t.Fatal(err)
	}
	if !equality.Semantic.DeepEqual(back.Object, forged.Object) {
		t.Errorf("an object with a field named %s read back as\n%v", compactField, back.Object)
	}
	// One with nothing else reads as compacted, but its string cannot
	// change its metadata.
	bare := &unstructured.Unstructured{Object: map[string]any{"apiVersion": "x/v1", "kind": "Open",
		"metadata":   map[string]any{"name": "mine", "namespace": "team-a"},
		compactField: `{"metadata":{"name":"theirs","namespace":"kube-system"},"kind":"Secret","spec":{"a":1}}`}}
	if err := expand(bare); err != nil {
		t.Fatal(err)
	}
	if bare.GetName() != "mine" || bare.GetNamespace() != "team-a" || bare.GetKind() != "Open" || bare.Object["spec"] == nil {
		t.Errorf("a bare field of that name read as %v", bare.Object)
	}

	// An event handler's view: whole, the cached object untouched.
	view, err := expanded(c)
	if err != nil {
		t.Fatal(err)
	}
	if !equality.Semantic.DeepEqual(view.Object, want.Object) {
		t.Errorf("expanded object differs:\n got %v\nwant %v", view.Object, want.Object)
	}
	if _, ok := c.Object["status"]; ok {
		t.Error("expanding for a handler changed the cached object")
	}
	if n, ok := view.Object["status"].(map[string]any)["readyReplicas"].(int64); !ok || n != 2 {
		t.Errorf("readyReplicas = %#v, want int64 2", view.Object["status"].(map[string]any)["readyReplicas"])
	}

	// A read's copy, expanded in place.
	cp := c.DeepCopy()
	if err := expand(cp); err != nil {
		t.Fatal(err)
	}
	if !equality.Semantic.DeepEqual(cp.Object, want.Object) {
		t.Errorf("expanded copy differs:\n got %v\nwant %v", cp.Object, want.Object)
	}
	if f, _ := objectDiffers(sampleObject(t).Object, sampleObject(t).Object, cp.Object); f != "" {
		t.Errorf("an object read back from the cache drifts at %s", f)
	}
}

func TestCompactLeavesOthersAlone(t *testing.T) {
	meta := &unstructured.Unstructured{Object: map[string]any{"apiVersion": "v1", "kind": "Namespace", "metadata": map[string]any{"name": "a"}}}
	out, err := compactObject(meta)
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := out.(*unstructured.Unstructured).Object[compactField]; ok {
		t.Error("an object with nothing but metadata was compacted")
	}
	tomb := toolscache.DeletedFinalStateUnknown{Key: "a/b", Obj: sampleObject(t)}
	if out, err := compactObject(tomb); err != nil || out.(toolscache.DeletedFinalStateUnknown).Key != "a/b" {
		t.Errorf("tombstone: %v, %v", out, err)
	}
	var bad unstructured.Unstructured
	bad.Object = map[string]any{"kind": "X", "metadata": map[string]any{"name": "x"}, compactField: "{not json"}
	if err := expand(&bad); err == nil {
		t.Error("a broken compacted body expanded without error")
	}
}
