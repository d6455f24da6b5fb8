package release

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net/http"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"helm.sh/helm/v3/pkg/chart"
	"helm.sh/helm/v3/pkg/chart/loader"
	"helm.sh/helm/v3/pkg/kube"
	kubefake "helm.sh/helm/v3/pkg/kube/fake"
	helmrelease "helm.sh/helm/v3/pkg/release"
	"helm.sh/helm/v3/pkg/storage"
	"helm.sh/helm/v3/pkg/storage/driver"
	helmtime "helm.sh/helm/v3/pkg/time"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/cli-runtime/pkg/resource"
	dynamicfake "k8s.io/client-go/dynamic/fake"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/kubernetes/scheme"
	restfake "k8s.io/client-go/rest/fake"
	"k8s.io/client-go/tools/record"
	ctrlfake "sigs.k8s.io/controller-runtime/pkg/client/fake"

	"github.com/chartpilot/chartpilot/internal/api/v1alpha1"
	"github.com/chartpilot/chartpilot/internal/helm"
	"github.com/chartpilot/chartpilot/internal/watches"
)

// The actions are tested here one by one without a cluster: each test
// seeds the release records and the reconciler's memory, calls one action
// as a pass would, and looks at what it left: the records, the resource's
// status and events, memory and the result. Helm's actions are real
// (helm.NewOffline): the records are stored in a fake clientset, the
// objects of each action go to Helm's fake kube client, which fails on
// demand; drift is corrected on a fake dynamic client.

var offlineGVK = schema.GroupVersionKind{Group: "test.chartpilot.dev", Version: "v1alpha1", Kind: "Webapp"}

const offlineNS, offlineName, offlineUID = "shop", "web", "uid-web"

const webappChart = "../../test/charts/webapp"

type actionEnv struct {
	t       *testing.T
	r       *Reconciler
	records *fake.Clientset
	objects *objectStore
	dyn     *dynamicfake.FakeDynamicClient
	events  *record.FakeRecorder
	chart   *helm.Chart
	raw     *chart.Chart
	obj     *unstructured.Unstructured
	now     time.Time
}

func newActionEnv(t *testing.T) *actionEnv {
	t.Helper()
	ch, err := helm.LoadChart(webappChart)
	if err != nil {
		t.Fatal(err)
	}
	raw, err := loader.Load(webappChart)
	if err != nil {
		t.Fatal(err)
	}
	e := &actionEnv{
		t:       t,
		records: fake.NewSimpleClientset(),
		objects: newObjectStore(),
		dyn:     dynamicfake.NewSimpleDynamicClient(scheme.Scheme),
		events:  record.NewFakeRecorder(100),
		chart:   ch,
		raw:     raw,
		now:     time.Now().UTC().Truncate(time.Second),
	}
	e.r = &Reconciler{
		Watch: watches.Watch{
			GVK: offlineGVK, Timeout: time.Minute, HealthTimeout: time.Minute, ReconcilePeriod: 10 * time.Minute,
			MaxHistory: 10, MaxConcurrentUpgrades: 2, WatchDependentResources: true,
		},
		Helm:     helm.NewOffline(e.records, e.objects, logr.Discard()),
		Dynamic:  e.dyn,
		Recorder: e.events,
		Log:      logr.Discard(),
		Now:      func() time.Time { return e.now },
	}
	e.r.initOnce.Do(wiring{e.r}.init)
	e.obj = &unstructured.Unstructured{}
	e.obj.SetGroupVersionKind(offlineGVK)
	e.obj.SetNamespace(offlineNS)
	e.obj.SetName(offlineName)
	e.obj.SetUID(offlineUID)
	e.obj.SetGeneration(1)
	e.obj.SetFinalizers([]string{v1alpha1.Finalizer})
	return e
}

func (e *actionEnv) key() types.NamespacedName {
	return types.NamespacedName{Namespace: offlineNS, Name: offlineName}
}

// pass starts a pass over the resource as it is now.
func (e *actionEnv) pass() *pass { return e.r.newPass(e.key(), e.obj.DeepCopy()) }

// desired is what the resource asks for: the test chart with message.
func (e *actionEnv) desired(message string) *desired {
	return &desired{chart: e.chart, vals: map[string]any{"message": message}, digest: "digest-" + message}
}

// history reads the release's records, oldest first.
func (e *actionEnv) history() []*helm.Release {
	e.t.Helper()
	h, err := e.r.Helm.History(offlineNS, offlineName)
	if err != nil {
		e.t.Fatal(err)
	}
	return h
}

// observe is what a pass would observe of the release for d.
func (e *actionEnv) observe(d *desired) Observation {
	return observe(e.history(), offlineUID, d.digest, false)
}

// statuses lists the records' revisions and statuses, oldest first.
func (e *actionEnv) statuses() string {
	var out []string
	for _, h := range e.history() {
		out = append(out, strconv.Itoa(h.Revision)+" "+string(h.Status))
	}
	return strings.Join(out, ", ")
}

// installed installs message as a pass would and sees it healthy.
func (e *actionEnv) installed(message string) *desired {
	e.t.Helper()
	d := e.desired(message)
	if _, err := (installStep{}).run(context.Background(), e.r, e.pass(), d); err != nil {
		e.t.Fatal(err)
	}
	h := e.history()
	healthGate{e.r}.seenHealthy(e.pass(), h[len(h)-1].Revision)
	e.drainEvents()
	return d
}

// seed stores a revision in Helm's own record format, as another process
// (or one that died mid-action) left it.
func (e *actionEnv) seed(revision int, status helmrelease.Status, d *desired, description string) {
	e.t.Helper()
	s := storage.Init(driver.NewSecrets(e.records.CoreV1().Secrets(offlineNS)))
	rel := &helmrelease.Release{
		Name: offlineName, Namespace: offlineNS, Version: revision,
		Info: &helmrelease.Info{Status: status, Description: description,
			FirstDeployed: helmtime.Time{Time: e.now}, LastDeployed: helmtime.Time{Time: e.now}},
		Manifest: "---\napiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: web-config\ndata:\n  message: seeded\n",
		Labels:   map[string]string{v1alpha1.LabelOwnerUID: offlineUID, v1alpha1.LabelOwnerKind: e.r.ownerKind(), v1alpha1.LabelDigest: d.digest},
		Chart:    e.raw,
		Config:   d.vals,
	}
	if err := s.Create(rel); err != nil {
		e.t.Fatal(err)
	}
}

// events read so far, each "Type Reason message".
func (e *actionEnv) drainEvents() []string {
	var out []string
	for {
		select {
		case ev := <-e.events.Events:
			out = append(out, ev)
		default:
			return out
		}
	}
}

// event fails the test unless one of the events so far has reason and
// says each of says.
func (e *actionEnv) event(reason string, says ...string) {
	e.t.Helper()
	evs := e.drainEvents()
	for _, ev := range evs {
		if strings.Contains(ev, " "+reason+" ") && containsAll(ev, says...) {
			return
		}
	}
	e.t.Errorf("no event %s saying %q among %q", reason, says, evs)
}

// condition fails the test unless p's status has typ at want with reason.
func condition(t *testing.T, p *pass, typ string, want metav1.ConditionStatus, reason string) *metav1.Condition {
	t.Helper()
	c := apimeta.FindStatusCondition(p.status.Conditions, typ)
	if c == nil || c.Status != want || (reason != "" && c.Reason != reason) {
		t.Errorf("%s = %+v, want %s %s", typ, c, want, reason)
	}
	return c
}

func containsAll(s string, subs ...string) bool {
	for _, sub := range subs {
		if !strings.Contains(s, sub) {
			return false
		}
	}
	return true
}

// errAPI is a request to the API server that failed for a while only.
var errAPI = apierrors.NewServiceUnavailable("the server is currently unable to handle the request")

// errChart is an error of the chart's objects that no retry mends.
var errChart = errors.New(`Deployment.apps "web" is invalid: spec.replicas: Invalid value: -1`)

// objectStore is the cluster as Helm's actions see it offline: Build
// parses a manifest into objects with their mappings, Create, Update and
// Delete keep them (or fail with the error the test set), and Helm's read
// of an object before it creates it is answered from the store.
type objectStore struct {
	kubefake.PrintingKubeClient
	mapper                          apimeta.RESTMapper
	createErr, updateErr, deleteErr error

	mu      sync.Mutex
	objects map[string]*unstructured.Unstructured // by "Kind/name"
}

func newObjectStore() *objectStore {
	return &objectStore{
		PrintingKubeClient: kubefake.PrintingKubeClient{Out: io.Discard},
		mapper:             helm.NewOffline(fake.NewSimpleClientset(), nil, logr.Discard()).RESTMapper(),
		objects:            map[string]*unstructured.Unstructured{},
	}
}

func objectKey(u *unstructured.Unstructured) string { return u.GetKind() + "/" + u.GetName() }

// names lists the stored objects, sorted.
func (s *objectStore) names() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]string, 0, len(s.objects))
	for k := range s.objects {
		out = append(out, k)
	}
	sort.Strings(out)
	return strings.Join(out, ", ")
}

func (s *objectStore) get(kind, name string) *unstructured.Unstructured {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.objects[kind+"/"+name]
}

func (s *objectStore) Build(r io.Reader, _ bool) (kube.ResourceList, error) {
	data, err := io.ReadAll(r)
	if err != nil {
		return nil, err
	}
	objs, err := helm.ParseManifest(string(data))
	if err != nil {
		return nil, err
	}
	var list kube.ResourceList
	for _, o := range objs {
		gvk := o.GroupVersionKind()
		m, err := s.mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
		if err != nil {
			return nil, err
		}
		if o.GetNamespace() == "" && m.Scope.Name() == apimeta.RESTScopeNameNamespace {
			o.SetNamespace(offlineNS)
		}
		list = append(list, &resource.Info{Name: o.GetName(), Namespace: o.GetNamespace(), Object: o, Mapping: m, Client: s.restClient()})
	}
	return list, nil
}

func (s *objectStore) keep(list kube.ResourceList) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, info := range list {
		u := info.Object.(*unstructured.Unstructured)
		s.objects[objectKey(u)] = u.DeepCopy()
	}
}

func (s *objectStore) drop(list kube.ResourceList) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, info := range list {
		delete(s.objects, objectKey(info.Object.(*unstructured.Unstructured)))
	}
}

func (s *objectStore) Create(list kube.ResourceList) (*kube.Result, error) {
	if s.createErr != nil {
		return &kube.Result{}, s.createErr // as the real client: what it did, and why it stopped
	}
	s.keep(list)
	return &kube.Result{Created: list}, nil
}

func (s *objectStore) Update(original, target kube.ResourceList, _ bool) (*kube.Result, error) {
	if s.updateErr != nil {
		return &kube.Result{}, s.updateErr
	}
	gone := original.Difference(target)
	s.keep(target)
	s.drop(gone)
	return &kube.Result{Updated: target, Deleted: gone}, nil
}

func (s *objectStore) Delete(list kube.ResourceList) (*kube.Result, []error) {
	if s.deleteErr != nil {
		return &kube.Result{}, []error{s.deleteErr}
	}
	s.drop(list)
	return &kube.Result{Deleted: list}, nil
}

func (s *objectStore) DeleteWithPropagationPolicy(list kube.ResourceList, _ metav1.DeletionPropagation) (*kube.Result, []error) {
	return s.Delete(list)
}

// restClient answers Helm's reads of single objects from the store.
func (s *objectStore) restClient() *restfake.RESTClient {
	return &restfake.RESTClient{
		NegotiatedSerializer: scheme.Codecs.WithoutConversion(),
		Client: restfake.CreateHTTPClient(func(req *http.Request) (*http.Response, error) {
			parts := strings.Split(strings.Trim(req.URL.Path, "/"), "/")
			name := parts[len(parts)-1]
			s.mu.Lock()
			var found *unstructured.Unstructured
			for _, u := range s.objects {
				if u.GetName() == name && strings.EqualFold(u.GetKind()+"s", parts[len(parts)-2]) {
					found = u
				}
			}
			s.mu.Unlock()
			header := http.Header{"Content-Type": []string{"application/json"}}
			if found == nil {
				body := `{"kind":"Status","apiVersion":"v1","status":"Failure","reason":"NotFound","code":404}`
				return &http.Response{StatusCode: http.StatusNotFound, Header: header, Body: io.NopCloser(strings.NewReader(body))}, nil
			}
			body, err := found.MarshalJSON()
			if err != nil {
				return nil, err
			}
			return &http.Response{StatusCode: http.StatusOK, Header: header, Body: io.NopCloser(bytes.NewReader(body))}, nil
		}),
	}
}

// deleting marks the resource deleted, as the API server shows a resource
// with a finalizer, and keeps it in the reconciler's client.
func (e *actionEnv) deleting() {
	e.t.Helper()
	now := metav1.NewTime(e.now)
	e.obj.SetDeletionTimestamp(&now)
	e.r.Client = ctrlfake.NewClientBuilder().WithObjects(e.obj.DeepCopy()).Build()
	e.obj = e.stored()
}

// stored is the resource as the reconciler's client keeps it.
func (e *actionEnv) stored() *unstructured.Unstructured {
	e.t.Helper()
	u := &unstructured.Unstructured{}
	u.SetGroupVersionKind(offlineGVK)
	if err := e.r.Client.Get(context.Background(), e.key(), u); err != nil {
		if apierrors.IsNotFound(err) {
			return u // gone with its last finalizer
		}
		e.t.Fatal(err)
	}
	return u
}

// applied copies the objects Helm applied into the dynamic client that
// drift is read from, as the cluster would hold them.
func (e *actionEnv) applied() {
	e.t.Helper()
	e.objects.mu.Lock()
	defer e.objects.mu.Unlock()
	for _, u := range e.objects.objects {
		gvk := u.GroupVersionKind()
		m, err := e.objects.mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
		if err != nil {
			e.t.Fatal(err)
		}
		if _, err := e.dyn.Resource(m.Resource).Namespace(u.GetNamespace()).Create(context.Background(), u.DeepCopy(), metav1.CreateOptions{}); err != nil {
			e.t.Fatal(err)
		}
	}
}

// deploymentReady gives the release's Deployment the status of one that
// rolled out all its replicas.
func (e *actionEnv) deploymentReady() {
	e.t.Helper()
	ri := e.dyn.Resource(schema.GroupVersionResource{Group: "apps", Version: "v1", Resource: "deployments"}).Namespace(offlineNS)
	u, err := ri.Get(context.Background(), "web", metav1.GetOptions{})
	if err != nil {
		e.t.Fatal(err)
	}
	u.Object["status"] = map[string]any{
		"observedGeneration": u.GetGeneration(), "replicas": int64(1), "updatedReplicas": int64(1),
		"readyReplicas": int64(1), "availableReplicas": int64(1),
		"conditions": []any{map[string]any{"type": "Available", "status": "True"},
			map[string]any{"type": "Progressing", "status": "True", "reason": "NewReplicaSetAvailable"}},
	}
	if _, err := ri.Update(context.Background(), u, metav1.UpdateOptions{}); err != nil {
		e.t.Fatal(err)
	}
}
