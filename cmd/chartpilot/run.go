package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net"
	"os"
	"runtime/debug"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/types"

	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/rest"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"

	"github.com/chartpilot/chartpilot/internal/admission"
	data "github.com/chartpilot/chartpilot/internal/backup"
	"github.com/chartpilot/chartpilot/internal/cliutil"
	"github.com/chartpilot/chartpilot/internal/controller/storage"
	"github.com/chartpilot/chartpilot/internal/operator"
	"github.com/chartpilot/chartpilot/internal/source"
	"github.com/chartpilot/chartpilot/internal/watches"
)

// runOptions are the flags of `chartpilot run`.
type runOptions struct {
	kubeconfig              string
	watchesFile             string
	metricsAddr             string
	metricsSecure           bool
	metricsCertDir          string
	pprofAddr               string
	probeAddr               string
	leaderElect             bool
	leaderElectionID        string
	leaderElectionNamespace string
	leaseDuration           time.Duration
	renewDeadline           time.Duration
	retryPeriod             time.Duration
	webhookPort             int
	webhookCertDir          string
	webhookCerts            string
	webhookService          string
	webhookConfig           string
	chartCacheDir           string
	backupStoreEndpoints    []string
	backupImage             string
	postgresImage           string
	storeHelper             string
	gcPercent               int
	defaultServiceAccount   string
	recordKeySecret         string
	maxRecordSize           int64
	rewriteStoredAPIs       bool
	maxIndexSize            int64
	maxResourceSize         int
	maxArchiveSize          int64
	volumeStatsInterval     time.Duration
	instanceImage           string
	qps                     float64
	burst                   int
	zap                     zap.Options
}

// defaultGCPercent is the manager's GOGC: Go's default (100) lets the heap
// grow to twice what is live between collections. The live heap of the
// manager is mostly its caches, kept compact, so collecting more often
// costs little; see docs/benchmarks.md.
const defaultGCPercent = 30

func parseRunFlags(args []string) (*runOptions, error) {
	o := &runOptions{}
	fs := flag.NewFlagSet("chartpilot run", flag.ContinueOnError)
	fs.StringVar(&o.kubeconfig, "kubeconfig", "", "path to a kubeconfig; default $KUBECONFIG, ~/.kube/config, then in-cluster")
	fs.StringVar(&o.watchesFile, "watches", "watches.yaml", "path to watches.yaml: which kinds map to which charts")
	fs.StringVar(&o.metricsAddr, "metrics-bind-address", ":8080", "address of the Prometheus metrics endpoint; 0 disables it")
	fs.BoolVar(&o.metricsSecure, "metrics-secure", false, "serve metrics over HTTPS, only to callers the API server authenticates and authorizes for get on /metrics (config/ turns it on; plain HTTP is for local runs)")
	fs.StringVar(&o.metricsCertDir, "metrics-cert-dir", "", "directory of tls.crt and tls.key for --metrics-secure (default: a self-signed certificate made at start)")
	fs.StringVar(&o.pprofAddr, "pprof-bind-address", "", "loopback address to serve Go's profiles on (net/http/pprof), for measuring; empty disables it")
	fs.StringVar(&o.probeAddr, "health-probe-bind-address", ":8081", "address of the /healthz and /readyz endpoints")
	fs.BoolVar(&o.leaderElect, "leader-elect", false, "elect a leader among replicas so only one reconciles at a time")
	fs.StringVar(&o.leaderElectionID, "leader-election-id", "chartpilot.chartpilot.dev", "name of the Lease used for leader election")
	fs.StringVar(&o.leaderElectionNamespace, "leader-election-namespace", "", "namespace of the Lease; default: the pod's namespace")
	fs.DurationVar(&o.leaseDuration, "leader-elect-lease-duration", 15*time.Second, "how long a non-leader waits before taking over an unrenewed lease")
	fs.DurationVar(&o.renewDeadline, "leader-elect-renew-deadline", 10*time.Second, "how long the leader retries renewing before it gives up leadership")
	fs.DurationVar(&o.retryPeriod, "leader-elect-retry-period", 2*time.Second, "how often leader election clients retry")
	fs.StringVar(&o.defaultServiceAccount, "default-service-account", "", "ServiceAccount (in each resource's namespace) that Helm runs as when neither a Tenant nor the watch names one; set, nothing ever runs as the manager (lockdown)")
	fs.StringVar(&o.recordKeySecret, "release-record-key-secret", "", "namespace/name of the Secret holding the key that signs release records, made at the first start (default: chartpilot-release-records in the pod's namespace, else in the leader election namespace, else in default)")
	fs.Int64Var(&o.maxRecordSize, "max-release-record-size", 16<<20, "largest decompressed size of a release record, in bytes; a larger record is refused, not decoded")
	fs.BoolVar(&o.rewriteStoredAPIs, "rewrite-stored-apis", true, "store a release's deployed revision again with the served replacement of each API version its manifest names that the cluster no longer serves (after a cluster upgrade), when the API server holds the objects the same at the replacement; false leaves such releases for a manual repair")
	fs.Int64Var(&o.maxIndexSize, "max-index-size", source.DefaultMaxIndexSize, "largest repository index (index.yaml) a remote chart source downloads, in bytes; a larger one is cut off and refused")
	fs.Int64Var(&o.maxArchiveSize, "max-chart-size", source.DefaultMaxArchiveSize, "largest chart archive, OCI manifest or OCI layer a remote chart source downloads, in bytes; a larger one is cut off and refused")
	fs.StringVar(&o.instanceImage, "instance-image", "ghcr.io/chartpilot/chartpilot:"+version, "image the Postgres pods copy chartpilot's instance manager from (failover); this operator's own image")
	fs.DurationVar(&o.volumeStatsInterval, "volume-stats-interval", storage.DefaultInterval, "how often the volumes of a resource that asks for automatic growth are looked at (one read of each node's kubelet statistics through the API server)")
	fs.IntVar(&o.maxResourceSize, "max-resource-size", admission.DefaultMaxObjectSize, "largest resource of a watched kind the admission webhook lets be created or have its spec changed, in bytes of JSON")
	fs.StringVar(&o.chartCacheDir, "chart-cache-dir", "", "directory for remote charts and their version lists (default: the user cache directory, e.g. ~/.cache/chartpilot/charts)")
	fs.IntVar(&o.webhookPort, "webhook-port", 0, "port of the validating admission webhook; 0 disables it (config/manager uses 9443)")
	fs.StringVar(&o.webhookCertDir, "webhook-cert-dir", "/tmp/k8s-webhook-server/serving-certs", "directory of the webhook's tls.crt and tls.key")
	fs.StringVar(&o.webhookCerts, "webhook-certs", "self-signed", "self-signed: chartpilot makes, shares (Secret <service>-certs) and rotates a CA and certificate; files: use --webhook-cert-dir as mounted (e.g. from cert-manager)")
	fs.StringVar(&o.webhookService, "webhook-service", "chartpilot-system/chartpilot-webhook", "namespace/name of the webhook's Service (names in the self-signed certificate)")
	fs.StringVar(&o.backupImage, "backup-image", "ghcr.io/chartpilot/chartpilot:"+version, "chartpilot's image, which backup, restore, drill and major upgrade Jobs copy the agent from (their containers run the database's own image, e.g. postgres:<version>); this operator's own image")
	fs.StringVar(&o.postgresImage, "postgres-image", "postgres", "repository of the PostgreSQL images that the Jobs of a Postgres run (backups, restores, drills, major upgrades) at its spec.version: the images its pods run, e.g. a mirror of postgres")
	fs.StringVar(&o.storeHelper, "store-helper", "", "the binary run (as STORE_HELPER store) to check a remote backup store and read a backup's manifest: a chartpilot with the object stores' clients (default: chartpilot beside this executable, else on $PATH)")
	fs.IntVar(&o.gcPercent, "gc-percent", defaultGCPercent, "the Go collector's target heap growth between collections, in percent of the live heap (GOGC; Go's default is 100): lower holds less memory and spends more CPU collecting; the GOGC environment variable, when set, wins")
	fs.Func("backup-store-endpoints", "comma-separated URLs a namespaced BackupStore's endpoint (and a GCS key's token_uri) must lie within, compared as parsed scheme, host, port and path (a port of * allows any port of the host); the operator connects to them; empty: namespaced stores may use the clouds' own endpoints only", func(v string) error {
		for _, p := range strings.Split(v, ",") {
			p = strings.TrimSpace(p)
			if p == "" {
				continue
			}
			if _, err := data.ParseAllowedEndpoint(p); err != nil {
				return fmt.Errorf("an endpoint: %w", err)
			}
			o.backupStoreEndpoints = append(o.backupStoreEndpoints, p)
		}
		return nil
	})
	fs.StringVar(&o.webhookConfig, "webhook-configuration", "chartpilot-validating", "ValidatingWebhookConfiguration whose caBundle the self-signed mode keeps")
	fs.Float64Var(&o.qps, "kube-api-qps", 100, "client-side limit of requests per second to the API server (the server's priority and fairness still applies)")
	fs.IntVar(&o.burst, "kube-api-burst", 200, "client-side burst of requests to the API server")
	o.zap.Development = false
	o.zap.BindFlags(fs)
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("unexpected arguments %v: chartpilot run takes flags only", fs.Args())
	}
	if err := o.check(); err != nil {
		return nil, err
	}
	return o, nil
}

// check refuses flag values the manager cannot run with, naming the flag.
func (o *runOptions) check() error {
	if o.webhookCerts != "self-signed" && o.webhookCerts != "files" {
		return fmt.Errorf("--webhook-certs %q: use self-signed or files", o.webhookCerts)
	}
	if ns, name, ok := strings.Cut(o.webhookService, "/"); !ok || ns == "" || name == "" {
		return fmt.Errorf("--webhook-service %q: write namespace/name", o.webhookService)
	}
	if sa := o.defaultServiceAccount; sa != "" && len(validation.IsDNS1123Subdomain(sa)) > 0 {
		return fmt.Errorf("--default-service-account %q: not a ServiceAccount name (lower case letters, digits, '-' and '.')", sa)
	}
	if o.recordKeySecret != "" {
		if ns, name, ok := strings.Cut(o.recordKeySecret, "/"); !ok || ns == "" || name == "" {
			return fmt.Errorf("--release-record-key-secret %q: write namespace/name", o.recordKeySecret)
		}
	}
	if o.maxRecordSize < 1<<20 {
		return fmt.Errorf("--max-release-record-size %d: at least 1048576 (1 MiB, a Secret's own limit)", o.maxRecordSize)
	}
	if o.maxIndexSize < 64<<10 {
		return fmt.Errorf("--max-index-size %d: at least 65536 (64 KiB)", o.maxIndexSize)
	}
	if o.maxArchiveSize < 64<<10 {
		return fmt.Errorf("--max-chart-size %d: at least 65536 (64 KiB)", o.maxArchiveSize)
	}
	if o.volumeStatsInterval < time.Second {
		return fmt.Errorf("--volume-stats-interval %s: at least 1s", o.volumeStatsInterval)
	}
	if o.maxResourceSize < 4<<10 {
		return fmt.Errorf("--max-resource-size %d: at least 4096", o.maxResourceSize)
	}
	if o.pprofAddr != "" {
		host, _, err := net.SplitHostPort(o.pprofAddr)
		if ip := net.ParseIP(host); err != nil || ip == nil || !ip.IsLoopback() {
			return fmt.Errorf("--pprof-bind-address %q: profiles may show secrets in memory; give a loopback address such as 127.0.0.1:6060", o.pprofAddr)
		}
	}
	if o.gcPercent < 10 {
		return fmt.Errorf("--gc-percent %d: at least 10 (Go's default is 100)", o.gcPercent)
	}
	if o.leaderElect && o.leaderElectionNamespace == "" && !inCluster() {
		return errors.New("--leader-elect outside a cluster needs --leader-election-namespace")
	}
	return nil
}

// recordKeySecret is the flag's namespace/name, or by default the Secret
// in the pod's own namespace (empty outside a cluster: the operator's
// default then applies).
func recordKeySecret(flag string) types.NamespacedName {
	if ns, name, ok := strings.Cut(flag, "/"); ok {
		return types.NamespacedName{Namespace: ns, Name: name}
	}
	if b, err := os.ReadFile("/var/run/secrets/kubernetes.io/serviceaccount/namespace"); err == nil {
		return types.NamespacedName{Namespace: strings.TrimSpace(string(b))}
	}
	return types.NamespacedName{}
}

func inCluster() bool {
	_, err := rest.InClusterConfig()
	return err == nil
}

// run starts the manager and blocks until ctx is done.
func run(ctx context.Context, args []string) error {
	o, err := parseRunFlags(args)
	if err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil
		}
		return err
	}
	ctrl.SetLogger(zap.New(zap.UseFlagOptions(&o.zap)))
	log := ctrl.Log.WithName("setup")
	if os.Getenv("GOGC") == "" {
		debug.SetGCPercent(o.gcPercent)
	}

	if err := cliutil.CheckFileReadable(o.watchesFile, "--watches"); err != nil {
		return err
	}
	cfg, err := cliutil.LoadKubeconfig(o.kubeconfig)
	if err != nil {
		return err
	}
	cfg.QPS, cfg.Burst = float32(o.qps), o.burst
	if err := checkReachable(cfg); err != nil {
		return err
	}
	if err := cliutil.CheckPortFree(o.metricsAddr, "--metrics-bind-address"); err != nil {
		return err
	}
	if err := cliutil.CheckPortFree(o.probeAddr, "--health-probe-bind-address"); err != nil {
		return err
	}

	ws, err := watches.Load(o.watchesFile)
	if err != nil {
		return err
	}
	wh, err := webhookOptions(o)
	if err != nil {
		return err
	}
	mgr, err := operator.New(operator.Options{
		Webhook:                 wh,
		Config:                  cfg,
		Watches:                 ws,
		MetricsAddr:             o.metricsAddr,
		MetricsSecure:           o.metricsSecure,
		MetricsCertDir:          o.metricsCertDir,
		PprofAddr:               o.pprofAddr,
		ProbeAddr:               o.probeAddr,
		LeaderElection:          o.leaderElect,
		LeaderElectionID:        o.leaderElectionID,
		LeaderElectionNamespace: o.leaderElectionNamespace,
		LeaseDuration:           o.leaseDuration,
		RenewDeadline:           o.renewDeadline,
		RetryPeriod:             o.retryPeriod,
		Log:                     ctrl.Log,
		ChartCacheDir:           o.chartCacheDir,
		BackupStoreEndpoints:    o.backupStoreEndpoints,
		BackupImage:             o.backupImage,
		PostgresImage:           o.postgresImage,
		StoreHelper:             o.storeHelper,
		DefaultServiceAccount:   o.defaultServiceAccount,
		RecordKeySecret:         recordKeySecret(o.recordKeySecret),
		MaxRecordSize:           o.maxRecordSize,
		KeepStoredAPIs:          !o.rewriteStoredAPIs,
		MaxIndexSize:            o.maxIndexSize,
		MaxArchiveSize:          o.maxArchiveSize,
		MaxResourceSize:         o.maxResourceSize,
		VolumeStatsInterval:     o.volumeStatsInterval,
		InstanceImage:           o.instanceImage,
	})
	if err != nil {
		return err
	}
	log.Info("Starting manager", "version", version, "watches", o.watchesFile, "kinds", len(ws), "apiServer", cfg.Host,
		"metrics", o.metricsAddr, "metricsSecure", o.metricsSecure, "probes", o.probeAddr, "leaderElection", o.leaderElect)
	if err := mgr.Start(ctx); err != nil {
		return fmt.Errorf("running manager: %w", err)
	}
	log.Info("Stopped manager")
	return nil
}

// webhookOptions are the admission webhook's settings from the flags (nil
// when --webhook-port is 0).
func webhookOptions(o *runOptions) (*operator.WebhookOptions, error) {
	if o.webhookPort == 0 {
		return nil, nil
	}
	if err := cliutil.CheckPortFree(fmt.Sprintf(":%d", o.webhookPort), "--webhook-port"); err != nil {
		return nil, err
	}
	wh := &operator.WebhookOptions{Port: o.webhookPort, CertDir: o.webhookCertDir}
	if o.webhookCerts == "self-signed" {
		ns, name, _ := strings.Cut(o.webhookService, "/")
		wh.SelfSigned = &admission.SelfSigned{
			DNSNames: []string{name + "." + ns + ".svc", name + "." + ns + ".svc.cluster.local", name + "." + ns},
			Config:   o.webhookConfig,
			Secret:   types.NamespacedName{Namespace: ns, Name: name + "-certs"},
		}
	}
	return wh, nil
}

// checkReachable fails fast, with the address, when the API server does not
// answer, instead of letting informers retry silently.
func checkReachable(cfg *rest.Config) error {
	c := rest.CopyConfig(cfg)
	c.Timeout = 15 * time.Second
	dc, err := discovery.NewDiscoveryClientForConfig(c)
	if err != nil {
		return fmt.Errorf("building a client for %s: %w", cfg.Host, err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	done := make(chan error, 1)
	go func() {
		_, err := dc.ServerVersion()
		done <- err
	}()
	select {
	case err := <-done:
		if err != nil {
			return fmt.Errorf("cannot reach the API server at %s: %w: check --kubeconfig and that the cluster is running", cfg.Host, err)
		}
		return nil
	case <-ctx.Done():
		return fmt.Errorf("the API server at %s did not answer within 20s: check --kubeconfig and that the cluster is running", cfg.Host)
	}
}
