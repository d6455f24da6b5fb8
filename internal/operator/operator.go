// Package operator assembles chartpilot's manager: one release reconciler per
// watches.yaml entry, the shared Helm client and metadata caches, probes,
// metrics and leader election. cmd/chartpilot and the tests both use it.
package operator

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/kubernetes"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/leaderelection/resourcelock"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/healthz"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	"sigs.k8s.io/controller-runtime/pkg/metrics/filters"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
	"sigs.k8s.io/controller-runtime/pkg/webhook"

	"github.com/chartpilot/chartpilot/hooks/monitoring"
	"github.com/chartpilot/chartpilot/hooks/tenancy"
	"github.com/chartpilot/chartpilot/internal/admission"
	"github.com/chartpilot/chartpilot/internal/anomaly"
	"github.com/chartpilot/chartpilot/internal/api/v1alpha1"
	"github.com/chartpilot/chartpilot/internal/controller/anomalies"
	"github.com/chartpilot/chartpilot/internal/controller/backup"
	"github.com/chartpilot/chartpilot/internal/controller/storage"
	"github.com/chartpilot/chartpilot/internal/controller/tenant"
	"github.com/chartpilot/chartpilot/internal/helm"
	"github.com/chartpilot/chartpilot/internal/hooks"
	"github.com/chartpilot/chartpilot/internal/identity"
	"github.com/chartpilot/chartpilot/internal/kinds"
	"github.com/chartpilot/chartpilot/internal/kinds/postgres"
	"github.com/chartpilot/chartpilot/internal/release"
	"github.com/chartpilot/chartpilot/internal/source"
	"github.com/chartpilot/chartpilot/internal/watches"
)

// Options configure New.
type Options struct {
	Config  *rest.Config
	Watches []watches.Watch
	// MetricsAddr and ProbeAddr: "0" disables.
	MetricsAddr, ProbeAddr string
	// MetricsSecure serves metrics over HTTPS to callers the API server
	// authenticates (TokenReview) and authorizes (SubjectAccessReview for
	// get on the non-resource URL /metrics); the certificate comes from
	// MetricsCertDir (tls.crt, tls.key), else is self-signed in memory.
	MetricsSecure  bool
	MetricsCertDir string
	// PprofAddr serves Go's profiles (net/http/pprof) when set: for
	// measuring, on a loopback address only.
	PprofAddr               string
	LeaderElection          bool
	LeaderElectionID        string
	LeaderElectionNamespace string
	LeaseDuration           time.Duration
	RenewDeadline           time.Duration
	RetryPeriod             time.Duration
	Log                     logr.Logger
	// Kinds are the typed kinds (translators); default BuiltinKinds().
	// A watched kind not listed is passthrough.
	Kinds map[schema.GroupVersionKind]kinds.Kind
	// Hooks are registered next to the built-in ones (tenancy), for
	// watches.yaml to select by name.
	Hooks []*hooks.Hook
	// Webhook serves the validating admission webhook when set.
	Webhook *WebhookOptions
	// BackupStoreEndpoints are the URL prefixes a namespaced BackupStore's
	// S3 endpoint may start with (the operator connects to it).
	BackupStoreEndpoints []string
	// BackupImage is chartpilot's image, which backup, restore, drill and
	// major upgrade Jobs copy the agent from (their containers run the
	// database's own image).
	BackupImage string
	// PostgresImage is the repository of the PostgreSQL images that the
	// Jobs of a Postgres run (backups, restores, drills, major upgrades),
	// at the Postgres's spec.version; "postgres" when empty.
	PostgresImage string
	// StoreHelper is the binary the manager runs to reach a remote backup
	// store (checking a store, reading a backup's manifest): a chartpilot
	// built with the object stores' clients (`STORE_HELPER store`).
	// Default: chartpilot beside this executable, else on $PATH.
	StoreHelper string
	// ChartCacheDir holds remote charts and version lists (default: the
	// user cache directory).
	ChartCacheDir string
	// RecordKeySecret holds the key that signs release records (made at the
	// first start; default: chartpilot-release-records in the leader
	// election namespace, else in "default").
	RecordKeySecret types.NamespacedName
	// MaxRecordSize bounds a release record's decompressed size (default 16 MiB).
	MaxRecordSize int64
	// KeepStoredAPIs turns off the rewrite of a release's stored manifest
	// when it names API versions the cluster no longer serves.
	KeepStoredAPIs bool
	// MaxIndexSize and MaxArchiveSize bound a remote chart source's
	// downloads: the repository index; a chart archive, OCI manifest or
	// layer (0: the defaults, 32 MiB and 20 MiB).
	MaxIndexSize, MaxArchiveSize int64
	// MaxResourceSize bounds, at admission, a created or spec-changed
	// resource of a watched kind (0: admission.DefaultMaxObjectSize).
	MaxResourceSize int
	// DefaultServiceAccount is the ServiceAccount Helm runs as in a
	// resource's namespace when neither its Tenant nor its watch names one;
	// set, it also locks the operator down: nothing runs as the manager.
	DefaultServiceAccount string
	// SeveralInProcess allows more than one manager per process (tests):
	// controller names then need not be unique.
	SeveralInProcess bool
	// InstanceImage is the image the Postgres pods take the instance
	// manager from (the operator's own; "" keeps the chart's default).
	InstanceImage string
	// VolumeStatsInterval is how often the volumes of a resource that
	// asks for automatic growth are looked at (0: storage.DefaultInterval).
	VolumeStatsInterval time.Duration
}

// WebhookOptions configure the admission webhook server.
type WebhookOptions struct {
	Host    string
	Port    int
	CertDir string
	// SelfSigned, when set, makes and rotates the serving certificates
	// (otherwise they come from CertDir, e.g. mounted from cert-manager).
	SelfSigned *admission.SelfSigned
}

// New builds the manager. Every local chart is loaded up front: a chart that
// does not load is a start-up error naming the watch.
func New(o Options) (manager.Manager, error) {
	o.defaults()
	o.Config = withRetries(o.Config)
	scheme := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(scheme); err != nil {
		return nil, err
	}
	if err := v1alpha1.AddToScheme(scheme); err != nil {
		return nil, err
	}
	holder, lock, err := holderAndLock(o)
	if err != nil {
		return nil, err
	}
	mgr, err := newManager(o, scheme, lock)
	if err != nil || len(o.Watches) == 0 {
		return mgr, err
	}
	sources, err := openSources(o, mgr)
	if err != nil {
		return nil, err
	}
	reconcilers := map[schema.GroupVersionKind]*release.Reconciler{}
	admitted, identity, err := addReconcilers(o, mgr, scheme, sources, holder, reconcilers)
	if err != nil {
		return nil, err
	}
	if o.Webhook != nil {
		if err := addWebhook(o, mgr, scheme, admitted); err != nil {
			return nil, err
		}
	}
	if err := addBackupStores(o, mgr, &backup.Identity{Config: o.Config, Of: identity}); err != nil {
		return nil, err
	}
	if err := addAnomalyDetectors(o, mgr, scheme, reconcilers); err != nil {
		return nil, err
	}
	return mgr, nil
}

// addAnomalyDetectors scores the releases of each watch that asks for it
// (anomalies), from one cache of the pods of Helm releases.
func addAnomalyDetectors(o Options, mgr manager.Manager, scheme *runtime.Scheme, reconcilers map[schema.GroupVersionKind]*release.Reconciler) error {
	var pods cache.Cache
	for _, w := range o.Watches {
		if w.Anomalies == nil {
			continue
		}
		if pods == nil {
			c, err := anomalies.NewPodCache(mgr.GetConfig(), scheme)
			if err != nil {
				return err
			}
			if err := mgr.Add(c); err != nil {
				return err
			}
			pods = c
		}
		d := &anomalies.Detector{
			GVK: w.GVK, Settings: anomaly.Settings{Window: w.Anomalies.Window, History: w.Anomalies.History}, Acting: reconcilers[w.GVK].Acting,
			Client: mgr.GetClient(), Pods: pods, Recorder: mgr.GetEventRecorderFor("chartpilot-anomalies"),
			SeveralInProcess: o.SeveralInProcess,
		}
		if err := d.SetupWithManager(mgr); err != nil {
			return err
		}
	}
	return nil
}

// defaults fills what the caller left unset.
func (o *Options) defaults() {
	if o.Kinds == nil {
		o.Kinds = BuiltinKinds()
		if o.InstanceImage != "" {
			o.Kinds[postgres.GVK] = postgres.KindWith(o.InstanceImage)
		}
	}
	if o.LeaderElectionID == "" {
		o.LeaderElectionID = "chartpilot.chartpilot.dev"
	}
	if o.LeaseDuration == 0 {
		o.LeaseDuration = 15 * time.Second
	}
	if o.RenewDeadline == 0 {
		o.RenewDeadline = 10 * time.Second
	}
	if o.RetryPeriod == 0 {
		o.RetryPeriod = 2 * time.Second
	}
	if o.Log.GetSink() == nil {
		o.Log = ctrl.Log
	}
	if o.RecordKeySecret.Name == "" {
		o.RecordKeySecret.Name = "chartpilot-release-records"
	}
	if o.RecordKeySecret.Namespace == "" {
		o.RecordKeySecret.Namespace = o.LeaderElectionNamespace
	}
	if o.RecordKeySecret.Namespace == "" {
		o.RecordKeySecret.Namespace = "default"
	}
}

// newManager is the controller-runtime manager with probes.
func newManager(o Options, scheme *runtime.Scheme, lock resourcelock.Interface) (manager.Manager, error) {
	mgr, err := ctrl.NewManager(o.Config, ctrl.Options{
		Scheme:                        scheme,
		Logger:                        o.Log,
		Metrics:                       metricsOptions(o),
		HealthProbeBindAddress:        o.ProbeAddr,
		PprofBindAddress:              o.PprofAddr,
		LeaderElection:                o.LeaderElection,
		LeaderElectionID:              o.LeaderElectionID,
		LeaderElectionNamespace:       o.LeaderElectionNamespace,
		LeaderElectionReleaseOnCancel: true,
		// The same identity is written on the revisions this process starts.
		LeaderElectionResourceLockInterface: lock,
		LeaseDuration:                       &o.LeaseDuration,
		RenewDeadline:                       &o.RenewDeadline,
		RetryPeriod:                         &o.RetryPeriod,
		Cache:                               cache.Options{ByObject: release.CacheByObject(o.Watches)},
		// The watched kinds are read as unstructured objects: serve those
		// reads from the informer cache too (controller-runtime's default
		// sends them to the API server), through release.NewClient: the
		// cache keeps them compacted.
		Client:        client.Options{Cache: &client.CacheOptions{Unstructured: true}},
		NewClient:     release.NewClient,
		WebhookServer: webhookServer(o.Webhook),
		// Passes in flight finish before the manager stops and hands the
		// lease over (see release.PassTimeout).
		GracefulShutdownTimeout: ptr.To(gracefulShutdown(o.Watches)),
	})
	if err != nil {
		return nil, fmt.Errorf("creating manager: %w", err)
	}
	if err := mgr.AddHealthzCheck("ping", healthz.Ping); err != nil {
		return nil, err
	}
	if err := mgr.AddReadyzCheck("ping", healthz.Ping); err != nil {
		return nil, err
	}
	return mgr, nil
}

// metricsOptions serve /metrics in plain HTTP (local runs) or, secure,
// behind the API server's authentication and authorization.
func metricsOptions(o Options) metricsserver.Options {
	m := metricsserver.Options{BindAddress: o.MetricsAddr}
	if o.MetricsSecure {
		m.SecureServing = true
		m.CertDir = o.MetricsCertDir
		m.FilterProvider = filters.WithAuthenticationAndAuthorization
	}
	return m
}

// gracefulShutdown is how long a stopping manager waits for its passes:
// longer than the longest of them.
func gracefulShutdown(ws []watches.Watch) time.Duration {
	longest := release.PassTimeout(watches.Watch{})
	for _, w := range ws {
		longest = max(longest, release.PassTimeout(w))
	}
	return longest + 30*time.Second
}

// openSources opens every watch's chart source and reads a remote one once
// before reconciling starts, so that no resource has to wait for the first
// refresh. A source that is down is not fatal: releases keep what they have
// and the refresh loop tries again.
func openSources(o Options, mgr manager.Manager) ([]source.Source, error) {
	sources := make([]source.Source, len(o.Watches))
	for i, w := range o.Watches {
		src, err := newSource(w, o.ChartCacheDir, source.Options{MaxIndexSize: o.MaxIndexSize, MaxArchiveSize: o.MaxArchiveSize}, mgr.GetAPIReader())
		if err != nil {
			return nil, fmt.Errorf("watch %s: %w", w, err)
		}
		sources[i] = src
		if src.Interval() > 0 {
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			if _, err := src.Refresh(ctx); err != nil {
				o.Log.Info("Chart source not readable at start; releases keep what they have", "watch", w.String(), "error", err.Error())
			}
			cancel()
		}
	}
	return sources, nil
}

// addReconcilers adds one release reconciler per watch with the hooks it
// selects, and the Tenant status controller when a watch uses tenancy. It
// returns what admission needs of each kind.
func addReconcilers(o Options, mgr manager.Manager, scheme *runtime.Scheme, sources []source.Source, holder release.Holder, out map[schema.GroupVersionKind]*release.Reconciler) (map[schema.GroupVersionKind]admission.Kind, func(context.Context, *unstructured.Unstructured) (string, error), error) {
	shared, err := release.NewShared(mgr)
	if err != nil {
		return nil, nil, err
	}
	c, err := client.New(o.Config, client.Options{Scheme: scheme})
	if err != nil {
		return nil, nil, err
	}
	key, err := recordKey(context.Background(), c, o.RecordKeySecret)
	if err != nil {
		return nil, nil, err
	}
	shared.Helm.UseRecords(helm.Records{Key: key, MaxSize: o.MaxRecordSize})
	shared.SkipNameValidation = o.SeveralInProcess
	shared.DigestKey = key
	tn := &tenancy.Tenancy{Client: mgr.GetClient(), Resources: resourcesFunc(mgr.GetClient(), o.Watches, sources, o.Kinds), Claims: claimsFunc(mgr.GetAPIReader())}
	disc, err := discovery.NewDiscoveryClientForConfig(o.Config)
	if err != nil {
		return nil, nil, err
	}
	mon := &monitoring.Monitoring{Discovery: disc, Kinds: map[schema.GroupVersionKind]*watches.Monitoring{}}
	for _, w := range o.Watches {
		if w.Monitoring != nil {
			mon.Kinds[w.GVK] = w.Monitoring
		}
	}
	registry := hooks.NewRegistry()
	// Major upgrades act as the resource's identity (Of is set below, once
	// the hooks that decide it are selected).
	majorIdentity := &backup.Identity{Config: o.Config}
	major := &backup.Major{Client: mgr.GetClient(), Reader: mgr.GetAPIReader(), Recorder: mgr.GetEventRecorderFor("chartpilot-major-upgrade"),
		Identity: majorIdentity, AgentImage: o.BackupImage, PostgresImage: o.PostgresImage}
	restores := &backup.Restores{Client: mgr.GetClient(), Reader: mgr.GetAPIReader(), Identity: majorIdentity, AgentImage: o.BackupImage, Kinds: backup.KindsOf(o.Watches)}
	for _, h := range append([]*hooks.Hook{tn.Hook(), mon.Hook(), backup.Hook(mgr.GetClient(), major, restores, &backup.Archive{Client: mgr.GetClient(), Reader: mgr.GetAPIReader()})}, o.Hooks...) {
		if err := registry.Register(h); err != nil {
			return nil, nil, err
		}
	}
	var gvks []schema.GroupVersionKind
	selected := map[schema.GroupVersionKind][]*hooks.Hook{}
	admitted := map[schema.GroupVersionKind]admission.Kind{}
	tenancyUsed := false
	for i, w := range o.Watches {
		hs, err := registry.Select(w.Hooks)
		if err != nil {
			return nil, nil, fmt.Errorf("watch %s: field hooks: %w", w, err)
		}
		selected[w.GVK] = hs
		r := &release.Reconciler{Watch: w, Source: sources[i], Kind: o.Kinds[w.GVK], Hooks: hs, DefaultServiceAccount: o.DefaultServiceAccount, Holder: holder, KeepStoredAPIs: o.KeepStoredAPIs}
		if err := r.SetupWithManager(mgr, shared); err != nil {
			return nil, nil, err
		}
		out[w.GVK] = r
		gvks = append(gvks, w.GVK)
		admitted[w.GVK] = admission.Kind{Kind: o.Kinds[w.GVK], Hooks: hs, Chart: newestOf(w, sources[i])}
		if err := addAutoExpander(o, mgr, w, hs, newestOf(w, sources[i])); err != nil {
			return nil, nil, err
		}
		tenancyUsed = tenancyUsed || slices.Contains(w.Hooks, tenancy.Name)
	}
	// The Tenant kind (and its CRD) is needed only when a watch uses tenancy.
	if tenancyUsed {
		status := &tenant.StatusReconciler{Client: mgr.GetClient(), Tenancy: tn, Kinds: gvks}
		if err := status.SetupWithManager(mgr, o.SeveralInProcess); err != nil {
			return nil, nil, err
		}
	}
	// Who a resource's writes run as: the release reconciler's rule
	// (identity.Resolve) over the watch's hooks.
	identityOf := func(ctx context.Context, u *unstructured.Unstructured) (string, error) {
		for _, w := range o.Watches {
			if w.GVK != u.GroupVersionKind() {
				continue
			}
			var fromHooks []string
			for _, h := range selected[w.GVK] {
				if h.Identity == nil {
					continue
				}
				id, err := h.Identity(ctx, hooks.Object{Resource: u})
				if err != nil {
					return "", err
				}
				fromHooks = append(fromHooks, id)
			}
			user, _ := identity.Resolve(u.GetNamespace(), fromHooks, w.ServiceAccountName, o.DefaultServiceAccount)
			return user, nil
		}
		user, _ := identity.Resolve(u.GetNamespace(), nil, "", o.DefaultServiceAccount)
		return user, nil
	}
	majorIdentity.Of = identityOf
	return admitted, identityOf, nil
}

// addAutoExpander grows the volumes of a watch's resources that ask for
// it: typed kinds with a storage field, passthrough kinds whose watch names
// the size's value (storage.sizeValue).
func addAutoExpander(o Options, mgr manager.Manager, w watches.Watch, hs []*hooks.Hook, chart func() (string, string)) error {
	k := o.Kinds[w.GVK]
	st := k.Storage
	if st == nil && w.StorageSizeValue != nil {
		st = kinds.PassthroughStorage(w.StorageSizeValue)
	}
	if st == nil {
		return nil
	}
	cs, err := kubernetes.NewForConfig(mgr.GetConfig())
	if err != nil {
		return err
	}
	a := &storage.AutoExpander{
		GVK: w.GVK, Storage: st, Kind: k, Hooks: hs, Chart: chart,
		Client: mgr.GetClient(), APIReader: mgr.GetAPIReader(), Nodes: cs.CoreV1().RESTClient(),
		Recorder: mgr.GetEventRecorderFor("chartpilot-storage"), Interval: o.VolumeStatsInterval,
		SeveralInProcess: o.SeveralInProcess,
	}
	return a.SetupWithManager(mgr)
}

// addWebhook serves the validating webhook, with self-signed certificates
// made now (the server reads them when it starts) and rotated, when asked.
func addWebhook(o Options, mgr manager.Manager, scheme *runtime.Scheme, admitted map[schema.GroupVersionKind]admission.Kind) error {
	mgr.GetWebhookServer().Register(admission.Path, &webhook.Admission{Handler: &admission.Handler{Kinds: admitted, MaxObjectSize: o.MaxResourceSize, StorageClasses: mgr.GetAPIReader()}})
	// Ready only once the webhook serves: its failurePolicy is Fail.
	if err := mgr.AddReadyzCheck("webhook", mgr.GetWebhookServer().StartedChecker()); err != nil {
		return err
	}
	ss := o.Webhook.SelfSigned
	if ss == nil {
		return nil
	}
	c, err := client.New(o.Config, client.Options{Scheme: scheme})
	if err != nil {
		return err
	}
	ss.Client, ss.Dir, ss.Log = c, o.Webhook.CertDir, o.Log.WithName("webhook-certs")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := ss.Ensure(ctx); err != nil {
		return fmt.Errorf("webhook certificates: %w", err)
	}
	return mgr.Add(ss)
}

func webhookServer(o *WebhookOptions) webhook.Server {
	if o == nil {
		return nil
	}
	return webhook.NewServer(webhook.Options{Host: o.Host, Port: o.Port, CertDir: o.CertDir})
}

// resourcesFunc lists the managed resources of every watched kind in some
// namespaces, with their policy facts (for tenant-wide limits and status).
// claimsFunc lists a namespace's claims from the API server (read only for
// tenants with limits.maxTotalStorage: no cache of every claim).
func claimsFunc(r client.Reader) func(ctx context.Context, namespace string) ([]corev1.PersistentVolumeClaim, error) {
	return func(ctx context.Context, namespace string) ([]corev1.PersistentVolumeClaim, error) {
		list := &corev1.PersistentVolumeClaimList{}
		if err := r.List(ctx, list, client.InNamespace(namespace)); err != nil {
			return nil, err
		}
		return list.Items, nil
	}
}

func resourcesFunc(c client.Reader, ws []watches.Watch, sources []source.Source, typed map[schema.GroupVersionKind]kinds.Kind) tenancy.ResourcesFunc {
	return func(ctx context.Context, namespaces []string) ([]hooks.Object, error) {
		var out []hooks.Object
		for i, w := range ws {
			chartName, chartVersion := newestOf(w, sources[i])()
			k := typed[w.GVK]
			for _, ns := range namespaces {
				list := &unstructured.UnstructuredList{}
				list.SetGroupVersionKind(w.GVK.GroupVersion().WithKind(w.GVK.Kind + "List"))
				if err := c.List(ctx, list, client.InNamespace(ns)); err != nil {
					return nil, fmt.Errorf("listing %s in %s: %w", w.GVK.Kind, ns, err)
				}
				for j := range list.Items {
					u := &list.Items[j]
					hobj, _, err := k.Object(u, chartName, chartVersion)
					if err != nil {
						continue // its own reconcile reports the bad spec
					}
					out = append(out, hobj)
				}
			}
		}
		return out, nil
	}
}

// BuiltinKinds returns chartpilot's typed kinds by GVK.
func BuiltinKinds() map[schema.GroupVersionKind]kinds.Kind {
	return map[schema.GroupVersionKind]kinds.Kind{
		postgres.GVK: postgres.Kind(),
	}
}
