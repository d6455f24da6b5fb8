// Package helm is the only package of chartpilot that imports the Helm SDK
// (helm.sh/helm/v3). Everything else speaks in this package's types, so a
// move to Helm 4 is a change of one package.
//
// A Client shares one discovery client, one REST mapper and one cached set of
// cluster capabilities between all actions: Helm would otherwise rediscover
// the whole API surface for every install and upgrade.
package helm

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"helm.sh/helm/v3/pkg/action"
	"helm.sh/helm/v3/pkg/chartutil"
	"helm.sh/helm/v3/pkg/release"
	"helm.sh/helm/v3/pkg/storage"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/cli-runtime/pkg/genericclioptions"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/restmapper"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"

	"github.com/chartpilot/chartpilot/internal/api/v1alpha1"
	"github.com/chartpilot/chartpilot/internal/kubeapis"
)

// capabilitiesTTL bounds how stale the cached API versions may be; a chart
// that needs a CRD installed a moment ago gets a refresh on NoKindMatch anyway.
const capabilitiesTTL = 5 * time.Minute

// Client runs Helm actions against one cluster.
type Client struct {
	config *rest.Config
	disc   discovery.CachedDiscoveryInterface
	mapper meta.ResettableRESTMapper
	log    logr.Logger

	capsMu sync.Mutex
	caps   *chartutil.Capabilities
	capsAt time.Time

	// parent is the Client this one impersonates from (capabilities are its).
	parent *Client
	asMu   sync.Mutex
	as     map[string]*Client

	dynOnce sync.Once
	dyn     dynamic.Interface
	dynErr  error

	// recordOpts say how release records are signed and read (set with
	// UseRecords on the root Client, shared by its impersonating ones).
	recordOpts Records
	csOnce     sync.Once
	cs         kubernetes.Interface
	csErr      error
	// recordIndex and recordStore serve history reads from a cache
	// (UseRecordIndex on the root Client).
	recordIndex RecordIndex
	recordStore *recordStore
	// objectCache serves Helm's reads of single objects (UseObjectCache on
	// the root Client).
	objectCache ObjectCache
	// hadObjects holds the releases ("namespace/name") whose records this
	// process deleted or whose first install found an object there: their
	// installs check for existing objects first.
	hadObjects sync.Map
	// offline replaces the cluster (NewOffline).
	offline *offline
}

// root is the Client this one impersonates from, or itself.
func (c *Client) root() *Client {
	if c.parent != nil {
		return c.parent
	}
	return c
}

// UseRecords sets how release records are signed and read. Call it before
// the first action.
func (c *Client) UseRecords(o Records) { c.recordOpts = o }

// records is the record driver of namespace, with this Client's identity.
func (c *Client) records(namespace string) (*recordDriver, error) {
	c.csOnce.Do(func() { c.cs, c.csErr = kubernetes.NewForConfig(c.config) })
	if c.csErr != nil {
		return nil, c.csErr
	}
	root := c
	if c.parent != nil {
		root = c.parent
	}
	return &recordDriver{secrets: c.cs.CoreV1().Secrets(namespace), namespace: namespace, opts: root.recordOpts,
		index: root.recordIndex, store: root.recordStore}, nil
}

// Dynamic is a dynamic client with this Client's identity, made once.
func (c *Client) Dynamic() (dynamic.Interface, error) {
	c.dynOnce.Do(func() { c.dyn, c.dynErr = dynamic.NewForConfig(c.config) })
	return c.dyn, c.dynErr
}

// NewClient builds a Client for cfg.
func NewClient(cfg *rest.Config, log logr.Logger) (*Client, error) {
	cfg = rest.CopyConfig(cfg)
	dc, err := discovery.NewDiscoveryClientForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("building discovery client: %w", err)
	}
	cached := memory.NewMemCacheClient(dc)
	return &Client{
		config: cfg,
		disc:   cached,
		mapper: &rediscoveringMapper{ResettableRESTMapper: restmapper.NewDeferredDiscoveryRESTMapper(cached), disc: cached},
		log:    log,
	}, nil
}

// As returns a Client whose actions run as user (impersonation), sharing
// this Client's discovery, mapper and capabilities. Empty user: c itself.
func (c *Client) As(user string) *Client {
	if user == "" {
		return c
	}
	c.asMu.Lock()
	defer c.asMu.Unlock()
	if c.as == nil {
		c.as = map[string]*Client{}
	}
	if cl, ok := c.as[user]; ok {
		return cl
	}
	cfg := rest.CopyConfig(c.config)
	cfg.Impersonate = rest.ImpersonationConfig{UserName: user}
	cl := &Client{config: cfg, disc: c.disc, mapper: c.mapper, log: c.log.WithValues("as", user), parent: c}
	if c.offline != nil {
		// Offline, every identity shares the test's records and objects.
		cl.offline, cl.cs = c.offline, c.cs
		cl.csOnce.Do(func() {})
	}
	c.as[user] = cl
	return cl
}

// RESTMapper is the mapper shared by all actions.
func (c *Client) RESTMapper() meta.RESTMapper { return c.mapper }

// IsNamespaced reports whether gvk is a namespaced kind.
func (c *Client) IsNamespaced(gvk schema.GroupVersionKind) (bool, error) {
	m, err := c.mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
	if err != nil {
		return false, err
	}
	return m.Scope.Name() == meta.RESTScopeNameNamespace, nil
}

// Served reports whether the cluster serves gvk's version (discovery,
// read again when it does not know the kind, at most once per
// rediscoverEvery). An error other than "no such kind" counts as served:
// discovery that cannot be read says nothing is gone.
func (c *Client) Served(gvk schema.GroupVersionKind) bool {
	_, err := c.mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
	return err == nil || !meta.IsNoMatchError(err)
}

// KubeMinor is the cluster's Kubernetes minor (zero when it cannot be read).
func (c *Client) KubeMinor() kubeapis.Minor {
	caps, err := c.capabilities()
	if err != nil {
		return 0
	}
	m, err := kubeapis.FromServer(caps.KubeVersion.Major, caps.KubeVersion.Minor)
	if err != nil {
		return 0
	}
	return m
}

// capabilities returns the cluster's version and API versions, cached.
func (c *Client) capabilities() (*chartutil.Capabilities, error) {
	if c.parent != nil {
		return c.parent.capabilities()
	}
	c.capsMu.Lock()
	defer c.capsMu.Unlock()
	if c.caps != nil && (c.offline != nil || time.Since(c.capsAt) < capabilitiesTTL) {
		return c.caps, nil
	}
	c.disc.Invalidate()
	c.mapper.Reset()
	sv, err := c.disc.ServerVersion()
	if err != nil {
		return nil, fmt.Errorf("reading the Kubernetes version: %w", err)
	}
	apiVersions, err := action.GetVersionSet(c.disc)
	if err != nil {
		return nil, fmt.Errorf("reading the API versions: %w", err)
	}
	caps := chartutil.DefaultCapabilities.Copy()
	caps.KubeVersion = chartutil.KubeVersion{Version: sv.GitVersion, Major: sv.Major, Minor: sv.Minor}
	caps.APIVersions = apiVersions
	c.caps, c.capsAt = caps, time.Now()
	return caps, nil
}

// actionConfig builds Helm's configuration for the actions of one release:
// its namespace, and every manifest checked against scope. It is cheap:
// discovery, mapper and capabilities are shared.
func (c *Client) actionConfig(scope Scope) (*action.Configuration, error) {
	return c.actionConfigFor(scope, nil, false)
}

// actionConfigFor is actionConfig for an install attempt that skips
// existence checks (first, nil for any other action), or for a purge.
func (c *Client) actionConfigFor(scope Scope, first *firstInstall, purge bool) (*action.Configuration, error) {
	namespace := scope.Namespace
	caps, err := c.capabilities()
	if err != nil {
		return nil, err
	}
	cfg := new(action.Configuration)
	getter := &restGetter{client: c, namespace: namespace, first: first}
	log := c.log.WithValues("namespace", namespace)
	if err := cfg.Init(getter, namespace, "secret", func(format string, v ...any) {
		log.V(2).Info(fmt.Sprintf(format, v...))
	}); err != nil {
		return nil, fmt.Errorf("initialising helm: %w", err)
	}
	cfg.Capabilities = caps
	if c.offline != nil {
		cfg.KubeClient = c.offline.objects
	}
	cfg.KubeClient = guardedKube{Interface: cfg.KubeClient, scope: scope}
	d, err := c.records(namespace)
	if err != nil {
		return nil, err
	}
	d.first, d.purge = first, purge
	cfg.Releases = storage.Init(d)
	return cfg, nil
}

// restGetter gives Helm the shared clients of a Client.
type restGetter struct {
	client    *Client
	namespace string
	first     *firstInstall
}

var _ genericclioptions.RESTClientGetter = (*restGetter)(nil)

func (g *restGetter) ToRESTConfig() (*rest.Config, error) {
	cfg := rest.CopyConfig(g.client.config)
	cfg.Wrap(func(rt http.RoundTripper) http.RoundTripper {
		return &cachedGets{next: rt, client: g.client, first: g.first}
	})
	return cfg, nil
}

func (g *restGetter) ToDiscoveryClient() (discovery.CachedDiscoveryInterface, error) {
	return g.client.disc, nil
}

func (g *restGetter) ToRESTMapper() (meta.RESTMapper, error) { return g.client.mapper, nil }

func (g *restGetter) ToRawKubeConfigLoader() clientcmd.ClientConfig {
	cfg := clientcmdapi.NewConfig()
	cfg.Contexts["chartpilot"] = &clientcmdapi.Context{Namespace: g.namespace}
	cfg.CurrentContext = "chartpilot"
	return clientcmd.NewDefaultClientConfig(*cfg, &clientcmd.ConfigOverrides{Context: clientcmdapi.Context{Namespace: g.namespace}})
}

// Status is a release's status, as Helm stores it.
type Status string

// Statuses of a release revision.
const (
	StatusDeployed        Status = Status(release.StatusDeployed)
	StatusFailed          Status = Status(release.StatusFailed)
	StatusSuperseded      Status = Status(release.StatusSuperseded)
	StatusUninstalling    Status = Status(release.StatusUninstalling)
	StatusPendingInstall  Status = Status(release.StatusPendingInstall)
	StatusPendingUpgrade  Status = Status(release.StatusPendingUpgrade)
	StatusPendingRollback Status = Status(release.StatusPendingRollback)
)

// IsPending reports whether s is a pending-* status: an action holds (or held) the release.
func (s Status) IsPending() bool {
	return s == StatusPendingInstall || s == StatusPendingUpgrade || s == StatusPendingRollback
}

// Release is one revision of a release.
type Release struct {
	Name, Namespace string
	Revision        int
	Status          Status
	Description     string
	ChartName       string
	ChartVersion    string
	AppVersion      string
	Labels          map[string]string
	Manifest        string
	FirstDeployed   time.Time
	LastDeployed    time.Time
	// Trusted: the record carries a valid MAC (always, when the Client
	// has no key). Record is the storage Secret's name.
	Trusted bool
	Record  string
	// Distrust says why a record is not trusted when it is not for its
	// MAC: a chunk of it missing or changed (chunks.go). Such a revision
	// carries its labels only.
	Distrust string
	// Unread: only the record's labels were read (NewestOfHistory): the
	// revision, status and labels are set, nothing else, and Trusted
	// says nothing.
	Unread bool
}

func fromHelm(r *release.Release) *Release {
	if r == nil {
		return nil
	}
	out := &Release{
		Name:      r.Name,
		Namespace: r.Namespace,
		Revision:  r.Version,
		Labels:    r.Labels,
		Manifest:  r.Manifest,
	}
	if r.Info != nil {
		out.Status = Status(r.Info.Status)
		out.Description = r.Info.Description
		out.FirstDeployed = r.Info.FirstDeployed.Time
		out.LastDeployed = r.Info.LastDeployed.Time
	}
	if r.Chart != nil && r.Chart.Metadata != nil {
		out.ChartName = r.Chart.Metadata.Name
		out.ChartVersion = r.Chart.Metadata.Version
		out.AppVersion = r.Chart.Metadata.AppVersion
	}
	return out
}

// Revision returns one trusted revision of a release (from the cache of
// release records when there is one); an untrusted or oversized record is
// an error. The same version of a record is decoded once.
func (c *Client) Revision(namespace, name string, revision int) (*Release, error) {
	d, err := c.records(namespace)
	if err != nil {
		return nil, err
	}
	key := fmt.Sprintf("sh.helm.release.v1.%s.v%d", name, revision)
	s, err := d.read(key)
	if err != nil {
		return nil, err
	}
	memo := ""
	if d.store != nil && d.store.revisions != nil && s.ResourceVersion != "" {
		memo = namespace + "/" + key + "@" + s.ResourceVersion
		if v, ok := d.store.revisions.Get(memo); ok {
			out := *v.(*Release)
			return &out, nil
		}
	}
	rel, err := d.checked(s)
	if err != nil {
		return nil, err
	}
	out := fromHelm(rel)
	out.Trusted = true
	if memo != "" && len(out.Manifest) <= maxRememberedManifest {
		kept := *out
		d.store.revisions.Add(memo, &kept)
	}
	return out, nil
}

// History returns every stored revision of a release, oldest first, each
// saying whether its record is trusted; an absent release has none. A
// record over the size limit is a *RecordError: nothing of it is decoded.
func (c *Client) History(namespace, name string) ([]*Release, error) {
	return c.history(namespace, name, false)
}

// NewestOfHistory is History with only the newest record read whole: the
// older revisions come from their records' labels (Unread set: revision
// and status only). It is what a purge needs, which deletes the newest
// revision's objects and the older records unread.
func (c *Client) NewestOfHistory(namespace, name string) ([]*Release, error) {
	return c.history(namespace, name, true)
}

func (c *Client) history(namespace, name string, newestOnly bool) ([]*Release, error) {
	d, err := c.records(namespace)
	if err != nil {
		return nil, err
	}
	items, newest, err := d.listNewest(labels.Set{StorageLabelOwner: StorageOwnerHelm, StorageLabelName: name}, newestOnly)
	if err != nil {
		return nil, fmt.Errorf("reading history of release %s/%s: %w", namespace, name, err)
	}
	out := make([]*Release, 0, len(items))
	for _, s := range items {
		if newest != "" && s.Name != newest {
			r := fromHelm(d.unread(s))
			r.Unread, r.Record = true, s.Name
			out = append(out, r)
			continue
		}
		rel, trusted, err := d.decode(s)
		if re := (*RecordError)(nil); errors.As(err, &re) && re.ofChunk() {
			// Like a record without a valid MAC: never acted on, and
			// chartpilot.dev/adopt installs afresh.
			r := fromHelm(d.unread(s))
			r.Record, r.Distrust = s.Name, re.Error()
			out = append(out, r)
			continue
		}
		if err != nil {
			return nil, err
		}
		rel.Labels = s.Labels
		r := fromHelm(rel)
		r.Trusted, r.Record = trusted, s.Name
		out = append(out, r)
	}
	sortByRevision(out)
	return out, nil
}

// DeleteRecords deletes every release record of a release and nothing
// else: the objects stay, for a fresh install to take over.
func (c *Client) DeleteRecords(namespace, name string) error {
	d, err := c.records(namespace)
	if err != nil {
		return err
	}
	c.root().hadObjects.Store(namespace+"/"+name, true)
	items, err := d.list(labels.Set{StorageLabelOwner: StorageOwnerHelm, StorageLabelName: name})
	if err != nil {
		return fmt.Errorf("listing the release records of %s/%s: %w", namespace, name, err)
	}
	chunked := false
	for _, s := range items {
		if err := d.secrets.Delete(context.Background(), s.Name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
			return fmt.Errorf("deleting release record %s/%s: %w", namespace, s.Name, err)
		}
		if d.store != nil {
			d.store.forget(namespace, s.Name)
		}
		chunked = chunked || s.Labels[v1alpha1.LabelRecordChunks] != ""
	}
	d.sweepChunks(name, chunked)
	return nil
}

// DeleteRevision deletes the record of one revision of a release and
// nothing else: its objects stay, owned by the release, for the next
// action of the same revision number to take over. A record already gone
// is no error.
func (c *Client) DeleteRevision(namespace, name string, revision int) error {
	d, err := c.records(namespace)
	if err != nil {
		return err
	}
	c.root().hadObjects.Store(namespace+"/"+name, true)
	key := fmt.Sprintf("sh.helm.release.v1.%s.v%d", name, revision)
	if err := d.secrets.Delete(context.Background(), key, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("deleting release record %s/%s: %w", namespace, key, err)
	}
	if d.store != nil {
		d.store.forget(namespace, key)
	}
	d.sweepChunks(name, true)
	return nil
}

func sortByRevision(rs []*Release) {
	for i := 1; i < len(rs); i++ {
		for j := i; j > 0 && rs[j].Revision < rs[j-1].Revision; j-- {
			rs[j], rs[j-1] = rs[j-1], rs[j]
		}
	}
}

// ActionOptions are the inputs shared by install and upgrade.
type ActionOptions struct {
	Namespace, Name string
	Values          map[string]any
	// Labels are stored on the release records (Helm's storage Secrets).
	Labels map[string]string
	// Decorate is applied to every rendered object (see Decorator).
	Decorate Decorator
	Timeout  time.Duration
	// MaxHistory caps the revisions kept.
	MaxHistory  int
	Description string
	// Force replaces objects that cannot be patched.
	Force bool
	// ClusterKinds are the cluster-scoped kinds the release may hold (see Scope).
	ClusterKinds []string
}

// Install installs chart as a new release. The first install of a release
// in this process skips Helm's existence checks (see firstInstall); when
// one of its creates finds an object there, the attempt is undone and
// the install runs again with them.
func (c *Client) Install(ctx context.Context, ch *Chart, o ActionOptions) (*Release, error) {
	key := o.Namespace + "/" + o.Name
	if _, before := c.root().hadObjects.Load(key); before {
		return c.install(ctx, ch, o, nil)
	}
	first := &firstInstall{}
	rel, err := c.install(ctx, ch, o, first)
	if err == nil || !first.hadConflict() {
		return rel, err
	}
	c.root().hadObjects.Store(key, true)
	dyn, derr := c.Dynamic()
	if derr != nil {
		return rel, errors.Join(err, derr)
	}
	if uerr := first.undo(ctx, dyn); uerr != nil {
		// The attempt's record stays pending-install: the next pass drops
		// it (nothing is uninstalled) and installs again with the checks.
		return rel, errors.Join(err, fmt.Errorf("undoing an install that found an object there: %w", uerr))
	}
	if rel != nil && rel.Revision > 0 {
		if derr := c.DeleteRevision(o.Namespace, o.Name, rel.Revision); derr != nil {
			return rel, errors.Join(err, derr)
		}
	}
	return c.install(ctx, ch, o, nil)
}

func (c *Client) install(ctx context.Context, ch *Chart, o ActionOptions, first *firstInstall) (*Release, error) {
	cfg, err := c.actionConfigFor(Scope{Namespace: o.Namespace, ClusterKinds: o.ClusterKinds}, first, false)
	if err != nil {
		return nil, err
	}
	in := action.NewInstall(cfg)
	in.ReleaseName = o.Name
	in.Namespace = o.Namespace
	in.Labels = o.Labels
	in.Timeout = o.Timeout
	in.Description = o.Description
	in.PostRenderer = &postRenderer{decorate: o.Decorate, first: first, namespace: o.Namespace}
	// The API server validates every object anyway; client-side OpenAPI
	// validation would download the cluster's schemas on every action.
	in.DisableOpenAPIValidation = true
	rel, err := in.RunWithContext(ctx, ch.chart, copyValues(o.Values))
	return fromHelm(rel), err
}

// Upgrade upgrades a release to chart with exactly o.Values (no reuse of
// earlier values: the CR is the source of truth).
func (c *Client) Upgrade(ctx context.Context, ch *Chart, o ActionOptions) (*Release, error) {
	cfg, err := c.actionConfig(Scope{Namespace: o.Namespace, ClusterKinds: o.ClusterKinds})
	if err != nil {
		return nil, err
	}
	up := action.NewUpgrade(cfg)
	up.Namespace = o.Namespace
	up.Labels = o.Labels
	up.Timeout = o.Timeout
	up.MaxHistory = o.MaxHistory
	up.Description = o.Description
	up.ResetValues = true
	up.Force = o.Force
	up.PostRenderer = &postRenderer{decorate: o.Decorate}
	up.DisableOpenAPIValidation = true
	rel, err := up.RunWithContext(ctx, o.Name, ch.chart, copyValues(o.Values))
	return fromHelm(rel), err
}

// RenderUpgrade renders the manifest an Upgrade with the same chart and
// options would apply, without applying or storing anything (Helm's
// client-side dry run: lookups see nothing, so objects a chart fills from
// the cluster may differ; workload specs do not).
func (c *Client) RenderUpgrade(ctx context.Context, ch *Chart, o ActionOptions) (string, error) {
	cfg, err := c.actionConfig(Scope{Namespace: o.Namespace, ClusterKinds: o.ClusterKinds})
	if err != nil {
		return "", err
	}
	up := action.NewUpgrade(cfg)
	up.Namespace = o.Namespace
	up.ResetValues = true
	up.DryRun = true
	up.PostRenderer = &postRenderer{decorate: o.Decorate}
	up.DisableOpenAPIValidation = true
	rel, err := up.RunWithContext(ctx, o.Name, ch.chart, copyValues(o.Values))
	if err != nil {
		return "", err
	}
	return rel.Manifest, nil
}

// Rollback rolls a release back to revision (0: the previous one).
func (c *Client) Rollback(scope Scope, name string, revision int, timeout time.Duration, maxHistory int) error {
	cfg, err := c.actionConfig(scope)
	if err != nil {
		return err
	}
	rb := action.NewRollback(cfg)
	rb.Version = revision
	rb.Timeout = timeout
	rb.MaxHistory = maxHistory
	rb.CleanupOnFail = false
	return rb.Run(name)
}

// Uninstall removes a release and its objects, except objects annotated
// helm.sh/resource-policy: keep (data volumes). An absent release is no error.
func (c *Client) Uninstall(scope Scope, name string, timeout time.Duration) error {
	return c.uninstall(scope, name, timeout, false)
}

// Purge uninstalls the release of a resource that is going away. Every
// record is deleted at its end, so two writes Uninstall makes are left
// out: the "uninstalling" mark is not stored (a purge broken off leaves
// the release as it was, and the resource's finalizer runs the purge
// again), and of the records only the newest is read, the one whose
// objects are deleted; the older ones are deleted unread.
func (c *Client) Purge(scope Scope, name string, timeout time.Duration) error {
	return c.uninstall(scope, name, timeout, true)
}

func (c *Client) uninstall(scope Scope, name string, timeout time.Duration, purge bool) error {
	cfg, err := c.actionConfigFor(scope, nil, purge)
	if err != nil {
		return err
	}
	un := action.NewUninstall(cfg)
	un.Timeout = timeout
	un.IgnoreNotFound = true
	un.DeletionPropagation = "background"
	_, err = un.Run(name)
	return err
}

// MarkFailed sets the status of a pending or deployed revision to failed,
// with reason as its description. It is how a release left pending-* by a
// process that died mid-action is unlocked, and how a deployed revision
// whose workloads never became ready is condemned before its rollback.
func (c *Client) MarkFailed(namespace, name string, revision int, reason string) error {
	return c.setRevisionStatus(namespace, name, revision, release.StatusFailed, func(rel *release.Release) (string, error) {
		if !rel.Info.Status.IsPending() && rel.Info.Status != release.StatusDeployed {
			return "", fmt.Errorf("release %s/%s revision %d is %s, neither pending nor deployed", namespace, name, revision, rel.Info.Status)
		}
		return reason, nil
	})
}

// setRevisionStatus reads a revision and stores it with status to and the
// description check returns; check's error stops it, as does an empty
// description with no error (nothing to do).
func (c *Client) setRevisionStatus(namespace, name string, revision int, to release.Status, check func(*release.Release) (string, error)) error {
	cfg, err := c.actionConfig(Scope{Namespace: namespace})
	if err != nil {
		return err
	}
	rel, err := cfg.Releases.Get(name, revision)
	if err != nil {
		return fmt.Errorf("reading release %s/%s revision %d: %w", namespace, name, revision, err)
	}
	if rel.Info == nil {
		return fmt.Errorf("release %s/%s revision %d has no status", namespace, name, revision)
	}
	description, err := check(rel)
	if err != nil || description == "" {
		return err
	}
	rel.SetStatus(to, description)
	if err := cfg.Releases.Update(rel); err != nil {
		return fmt.Errorf("marking release %s/%s revision %d %s: %w", namespace, name, revision, to, err)
	}
	return nil
}

// copyValues returns a deep copy: Helm coalesces chart defaults into the map
// it is given, and the caller's layers must stay as they were.
func copyValues(v map[string]any) map[string]any {
	if v == nil {
		return map[string]any{}
	}
	return deepCopy(v).(map[string]any)
}

func deepCopy(v any) any {
	switch t := v.(type) {
	case map[string]any:
		out := make(map[string]any, len(t))
		for k, e := range t {
			out[k] = deepCopy(e)
		}
		return out
	case []any:
		out := make([]any, len(t))
		for i, e := range t {
			out[i] = deepCopy(e)
		}
		return out
	default:
		return v
	}
}

// StorageSecretLabels are the labels Helm puts on every release Secret; a
// metadata-only informer selecting "owner=helm" sees each revision's name,
// status and version without reading the (large) release content.
const (
	StorageLabelOwner   = "owner"
	StorageOwnerHelm    = "helm"
	StorageLabelName    = "name"
	StorageLabelStatus  = "status"
	StorageLabelVersion = "version"
)
