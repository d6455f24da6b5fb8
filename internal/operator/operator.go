// Package operator assembles chartpilot's manager: one release reconciler per
// watches.yaml entry, the shared Helm client and metadata caches, probes,
// metrics and leader election. cmd/chartpilot and the tests both use it.
package operator

import (
	"fmt"
	"time"

	"github.com/go-logr/logr"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/healthz"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	"github.com/chartpilot/chartpilot/internal/api/v1alpha1"
	"github.com/chartpilot/chartpilot/internal/helm"
	"github.com/chartpilot/chartpilot/internal/kinds"
	"github.com/chartpilot/chartpilot/internal/release"
	"github.com/chartpilot/chartpilot/internal/watches"
)

// Options configure New.
type Options struct {
	Config  *rest.Config
	Watches []watches.Watch
	// MetricsAddr and ProbeAddr: "0" disables.
	MetricsAddr, ProbeAddr  string
	LeaderElection          bool
	LeaderElectionID        string
	LeaderElectionNamespace string
	LeaseDuration           time.Duration
	RenewDeadline           time.Duration
	RetryPeriod             time.Duration
	Log                     logr.Logger
	// Kinds are the typed kinds (translators); default kinds.Builtin().
	// A watched kind not listed is passthrough.
	Kinds map[schema.GroupVersionKind]release.Kind
	// SeveralInProcess allows more than one manager per process (tests):
	// controller names then need not be unique.
	SeveralInProcess bool
}

// New builds the manager. Every chart is loaded up front: a chart that does
// not load is a start-up error naming the watch.
func New(o Options) (manager.Manager, error) {
	scheme := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(scheme); err != nil {
		return nil, err
	}
	if err := v1alpha1.AddToScheme(scheme); err != nil {
		return nil, err
	}
	charts := make([]*helm.Chart, len(o.Watches))
	for i, w := range o.Watches {
		ch, err := helm.LoadChart(w.Chart)
		if err != nil {
			return nil, fmt.Errorf("watch %s: %w", w, err)
		}
		charts[i] = ch
	}
	if o.Kinds == nil {
		o.Kinds = kinds.Builtin()
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
	mgr, err := ctrl.NewManager(o.Config, ctrl.Options{
		Scheme:                        scheme,
		Logger:                        o.Log,
		Metrics:                       metricsserver.Options{BindAddress: o.MetricsAddr},
		HealthProbeBindAddress:        o.ProbeAddr,
		LeaderElection:                o.LeaderElection,
		LeaderElectionID:              o.LeaderElectionID,
		LeaderElectionNamespace:       o.LeaderElectionNamespace,
		LeaderElectionReleaseOnCancel: true,
		LeaseDuration:                 &o.LeaseDuration,
		RenewDeadline:                 &o.RenewDeadline,
		RetryPeriod:                   &o.RetryPeriod,
		Cache:                         cache.Options{ByObject: release.CacheByObject(o.Watches)},
		// The watched kinds are read as unstructured objects: serve those
		// reads from the informer cache too (controller-runtime's default
		// sends them to the API server).
		Client: client.Options{Cache: &client.CacheOptions{Unstructured: true}},
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
	if len(o.Watches) == 0 {
		return mgr, nil
	}
	shared, err := release.NewShared(mgr)
	if err != nil {
		return nil, err
	}
	shared.SkipNameValidation = o.SeveralInProcess
	for i, w := range o.Watches {
		r := &release.Reconciler{Watch: w, Chart: charts[i], Kind: o.Kinds[w.GVK]}
		if err := r.SetupWithManager(mgr, shared); err != nil {
			return nil, err
		}
	}
	return mgr, nil
}
