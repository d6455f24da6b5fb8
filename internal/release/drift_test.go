package release

import (
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/yaml"
)

// chartStatefulSet is rendered the way widely used public charts render:
// helpers that print null, empty lists and maps, explicit false and empty
// strings, quantities not in canonical form.
const chartStatefulSet = `
apiVersion: apps/v1
kind: StatefulSet
metadata:
  name: db
  annotations: {}
  labels:
    app.kubernetes.io/name: db
spec:
  replicas: 1
  serviceName: db-hl
  selector:
    matchLabels:
      app.kubernetes.io/name: db
  updateStrategy:
    type: RollingUpdate
    rollingUpdate:
      partition: 0
  template:
    metadata:
      annotations: null
      labels:
        app.kubernetes.io/name: db
    spec:
      hostNetwork: false
      hostIPC: false
      schedulerName: ""
      priorityClassName: ""
      affinity:
        podAffinity: null
        nodeAffinity: null
      securityContext:
        fsGroup: 1001
        supplementalGroups: []
        sysctls: []
      initContainers: []
      tolerations: []
      nodeSelector: {}
      containers:
        - name: db
          image: registry.example/db:16.4
          command: []
          args: []
          env:
            - name: EMPTY
              value: ""
          resources:
            requests:
              cpu: 0.1
              memory: 1024Mi
            limits:
              memory: 2048Mi
          volumeMounts: []
  volumeClaimTemplates:
    - metadata:
        name: data
        annotations: null
      spec:
        accessModes: ["ReadWriteOnce"]
        resources:
          requests:
            storage: 8192Mi
`

// serverStatefulSet is chartStatefulSet as the API server keeps it: what
// it drops is gone, quantities are canonical, defaults are filled in.
const serverStatefulSet = `
apiVersion: apps/v1
kind: StatefulSet
metadata:
  name: db
  namespace: ns
  uid: 0a7e
  resourceVersion: "812"
  generation: 1
  labels:
    app.kubernetes.io/name: db
spec:
  replicas: 1
  serviceName: db-hl
  podManagementPolicy: OrderedReady
  revisionHistoryLimit: 10
  persistentVolumeClaimRetentionPolicy: {whenDeleted: Retain, whenScaled: Retain}
  selector:
    matchLabels:
      app.kubernetes.io/name: db
  updateStrategy:
    type: RollingUpdate
    rollingUpdate:
      partition: 0
  template:
    metadata:
      labels:
        app.kubernetes.io/name: db
    spec:
      affinity: {}
      securityContext:
        fsGroup: 1001
      containers:
        - name: db
          image: registry.example/db:16.4
          env:
            - name: EMPTY
          imagePullPolicy: IfNotPresent
          terminationMessagePath: /dev/termination-log
          terminationMessagePolicy: File
          resources:
            requests:
              cpu: 100m
              memory: 1Gi
            limits:
              memory: 2Gi
      dnsPolicy: ClusterFirst
      restartPolicy: Always
      schedulerName: default-scheduler
      terminationGracePeriodSeconds: 30
  volumeClaimTemplates:
    - apiVersion: v1
      kind: PersistentVolumeClaim
      metadata:
        name: data
      spec:
        accessModes: ["ReadWriteOnce"]
        volumeMode: Filesystem
        resources:
          requests:
            storage: 8Gi
      status:
        phase: Pending
status:
  replicas: 1
  readyReplicas: 1
`

func decodeYAML(t *testing.T, doc string) *unstructured.Unstructured {
	t.Helper()
	m := map[string]any{}
	if err := yaml.Unmarshal([]byte(doc), &m); err != nil {
		t.Fatal(err)
	}
	return &unstructured.Unstructured{Object: m}
}

// TestStoredFormComparesAsTheServerKeeps: what a chart renders and the
// server drops is no difference; a real change still is.
func TestStoredFormComparesAsTheServerKeeps(t *testing.T) {
	written := decodeYAML(t, chartStatefulSet)
	stored := asStored(written)
	if field, d := objectDiffers(written.Object, written.Object, decodeYAML(t, serverStatefulSet).Object); !d {
		t.Fatal("the rendering as written compares equal to the server's object: the test shows nothing")
	} else {
		t.Logf("as written, the first difference is %s", field)
	}
	podSpec := func(m map[string]any) map[string]any {
		return m["spec"].(map[string]any)["template"].(map[string]any)["spec"].(map[string]any)
	}
	container := func(m map[string]any) map[string]any {
		return podSpec(m)["containers"].([]any)[0].(map[string]any)
	}
	for _, tc := range []struct {
		name  string
		mut   func(m map[string]any)
		field string
	}{
		{name: "as kept"},
		{"image changed", func(m map[string]any) { container(m)["image"] = "registry.example/db:17.0" }, "spec.template.spec.containers[0].image"},
		{"replicas changed", func(m map[string]any) { m["spec"].(map[string]any)["replicas"] = int64(3) }, "spec.replicas"},
		{"hostNetwork turned on", func(m map[string]any) { podSpec(m)["hostNetwork"] = true }, "spec.template.spec.hostNetwork"},
		{"memory request changed", func(m map[string]any) {
			container(m)["resources"].(map[string]any)["requests"].(map[string]any)["memory"] = "2Gi"
		}, "spec.template.spec.containers[0].resources.requests.memory"},
		{"env variable added", func(m map[string]any) {
			container(m)["env"] = append(container(m)["env"].([]any), map[string]any{"name": "X", "value": "1"})
		}, "spec.template.spec.containers[0].env"},
		// An empty string the server drops may read back as a default it
		// fills in (schedulerName): not drift, whoever set it.
		{"dropped empty string reads back", func(m map[string]any) { podSpec(m)["priorityClassName"] = "high" }, ""},
		{"label removed", func(m map[string]any) {
			delete(m["metadata"].(map[string]any)["labels"].(map[string]any), "app.kubernetes.io/name")
		}, "metadata.labels.app.kubernetes.io/name"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			live := decodeYAML(t, serverStatefulSet)
			if tc.mut != nil {
				tc.mut(live.Object)
			}
			field, d := objectDiffers(written.Object, stored, live.Object)
			if d != (tc.field != "") || field != tc.field {
				t.Errorf("differs = %v at %q, want %q", d, field, tc.field)
			}
		})
	}
}

// TestStoredFormOfUnknownKinds: a custom resource is compared as written;
// a field of a built-in kind that does not parse leaves the object as
// written too (the server refuses such a write).
func TestStoredFormOfUnknownKinds(t *testing.T) {
	cr := decodeYAML(t, "apiVersion: example.com/v1\nkind: Widget\nmetadata: {name: w}\nspec: {enabled: false, items: []}\n")
	if got := asStored(cr); got["spec"].(map[string]any)["enabled"] != false {
		t.Errorf("a custom resource's false was dropped: %v", got)
	}
	bad := decodeYAML(t, "apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: d}\nspec: {replicas: many}\n")
	if got := asStored(bad); got["spec"].(map[string]any)["replicas"] != "many" {
		t.Errorf("a Deployment that does not decode was changed: %v", got)
	}
	wrongCase := decodeYAML(t, "apiVersion: v1\nkind: Service\nmetadata: {name: s}\nspec: {ClusterIP: None, type: ClusterIP}\n")
	if got := asStored(wrongCase); got["spec"].(map[string]any)["clusterIP"] != nil || got["spec"].(map[string]any)["ClusterIP"] != nil {
		t.Errorf("a key of another case was kept: %v", got["spec"])
	}
}
