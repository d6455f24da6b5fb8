// Package watches parses and validates watches.yaml: which custom resource
// kinds become Helm releases of which charts, with what overrides, hooks and
// reconcile settings.
//
// Every error names the entry (index and GVK) and the field, and says how to
// fix it: a bad watches.yaml stops the operator at start-up, before it touches
// any release.
package watches

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/validation"
	"sigs.k8s.io/yaml"
)

// Defaults of the optional fields.
const (
	DefaultReconcilePeriod         = 10 * time.Hour
	DefaultMaxConcurrentReconciles = 4
	DefaultMaxHistory              = 5
	DefaultTimeout                 = 5 * time.Minute
	DefaultHealthTimeout           = 10 * time.Minute
	DefaultMaxConcurrentUpgrades   = 5
	DefaultAnomalyWindow           = 2 * time.Minute
	DefaultAnomalyHistory          = time.Hour
	DefaultCanarySoak              = 5 * time.Minute
	DefaultChartInterval           = 5 * time.Minute
)

// entry is the file format of one watch. Field names are the YAML keys.
type entry struct {
	Group                   string                `json:"group"`
	Version                 string                `json:"version"`
	Kind                    string                `json:"kind"`
	Chart                   chartField            `json:"chart"`
	OverrideValues          map[string]any        `json:"overrideValues,omitempty"`
	Hooks                   []string              `json:"hooks,omitempty"`
	ReconcilePeriod         string                `json:"reconcilePeriod,omitempty"`
	MaxConcurrentReconciles *int                  `json:"maxConcurrentReconciles,omitempty"`
	WatchDependentResources *bool                 `json:"watchDependentResources,omitempty"`
	Selector                *metav1.LabelSelector `json:"selector,omitempty"`
	MaxHistory              *int                  `json:"maxHistory,omitempty"`
	Timeout                 string                `json:"timeout,omitempty"`
	HealthTimeout           string                `json:"healthTimeout,omitempty"`
	MaxConcurrentUpgrades   *int                  `json:"maxConcurrentUpgrades,omitempty"`
	CanarySoak              string                `json:"canarySoak,omitempty"`
	ServiceAccountName      string                `json:"serviceAccountName,omitempty"`
	AllowClusterScoped      []string              `json:"allowClusterScoped,omitempty"`
	Monitoring              *Monitoring           `json:"monitoring,omitempty"`
	Backup                  *Backup               `json:"backup,omitempty"`
	Storage                 *storageEntry         `json:"storage,omitempty"`
	Anomalies               *anomaliesEntry       `json:"anomalies,omitempty"`
}

// anomaliesEntry is `anomalies`: whether the kind's releases are scored
// against their own history, and over what spans.
type anomaliesEntry struct {
	Window  string `json:"window,omitempty"`
	History string `json:"history,omitempty"`
}

// Anomalies is how a kind's releases are scored for anomalies (package
// anomaly): the span of one count and how far back the normal reaches.
type Anomalies struct {
	Window, History time.Duration
}

// storageEntry is `storage`: where a passthrough kind's values set the
// size of its data volumes, for automatic growth.
type storageEntry struct {
	SizeValue string `json:"sizeValue"`
}

// Backup is how a resource of a kind without typed backups is backed up:
// a Job runs Command in Image, and chartpilot's agent (copied into the
// pod) stores its standard output like any backup. In Command and Args,
// $(CHARTPILOT_TARGET_NAME) is the resource's name (the release's name,
// and its Services'); Env gives it keys of Secrets of the namespace,
// "{name}" in a Secret's name standing for the resource's name.
type Backup struct {
	Image   string      `json:"image"`
	Command []string    `json:"command"`
	Env     []BackupEnv `json:"env,omitempty"`
	// NodeSelectorValue and TolerationsValue are the values paths of the
	// release pods' node selector and tolerations (e.g. nodeSelector,
	// tolerations): the backup and restore Jobs are placed as they are,
	// so that they run where the release's pods may, also on nodes
	// tainted for them alone. Unset: the Jobs are placed anywhere.
	NodeSelectorValue string `json:"nodeSelectorValue,omitempty"`
	TolerationsValue  string `json:"tolerationsValue,omitempty"`
	// Restore, when set, restores a backup into a new resource annotated
	// chartpilot.dev/restore-from: BACKUP before its release is installed.
	Restore *BackupRestore `json:"restore,omitempty"`
}

// BackupRestore is how a backup of a passthrough kind is put back: before
// the first install, a Job mounts the data volume the release's first pod
// will use (Claim, made now, later adopted by the StatefulSet) at
// MountPath and runs Command in Image (Backup's image when empty), the
// backup on its standard input, checked by chartpilot's agent first.
type BackupRestore struct {
	Image     string   `json:"image,omitempty"`
	Command   []string `json:"command"`
	Claim     string   `json:"claim"`
	MountPath string   `json:"mountPath"`
	// Size is the claim's size when the resource's values do not set it
	// at the watch's storage.sizeValue.
	Size string `json:"size"`
	// StorageClassValue is the values path of the claim's storage class
	// (e.g. persistence.storageClass; unset: the cluster's default).
	StorageClassValue string `json:"storageClassValue,omitempty"`
	// EnabledValue is a values path that must be true for the release to
	// use the claim at all (e.g. persistence.enabled): without it a
	// restore would be lost, and is refused.
	EnabledValue string `json:"enabledValue,omitempty"`
}

// BackupEnv is an environment variable of a backup Job from a Secret.
type BackupEnv struct {
	Name   string `json:"name"`
	Secret string `json:"secret"`
	Key    string `json:"key"`
}

// Monitoring is how the monitoring hook turns on a chart's metrics, for a
// kind without typed fields for it: for each resource annotated
// chartpilot.dev/monitoring: "true", Values (the exporter), and while the
// Prometheus Operator's CRDs are served, PrometheusOperatorValues too (its
// ServiceMonitor or PodMonitor, PrometheusRule).
type Monitoring struct {
	Values                   map[string]any `json:"values"`
	PrometheusOperatorValues map[string]any `json:"prometheusOperatorValues,omitempty"`
}

var envName = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)

// chartField is `chart`: a path, or a remote chart.
type chartField struct {
	Path   string
	Remote *remoteEntry
}

// remoteEntry is `chart` as an object.
type remoteEntry struct {
	Repo      string     `json:"repo"`
	Name      string     `json:"name"`
	Version   string     `json:"version,omitempty"`
	SecretRef *SecretRef `json:"secretRef,omitempty"`
	PlainHTTP bool       `json:"plainHTTP,omitempty"`
	// AllowInsecure lets plainHTTP reach a host that is not loopback.
	AllowInsecure bool `json:"allowInsecure,omitempty"`
	// AllowedHosts are hosts besides the repository's that its index may
	// send downloads to.
	AllowedHosts []string `json:"allowedHosts,omitempty"`
	Interval     string   `json:"interval,omitempty"`
}

func (c *chartField) UnmarshalJSON(data []byte) error {
	if bytes.HasPrefix(bytes.TrimSpace(data), []byte("{")) {
		dec := json.NewDecoder(bytes.NewReader(data))
		dec.DisallowUnknownFields()
		c.Remote = &remoteEntry{}
		if err := dec.Decode(c.Remote); err != nil {
			return fmt.Errorf("chart: %w (fields: repo, name, version, secretRef, plainHTTP, allowInsecure, allowedHosts, interval)", err)
		}
		return nil
	}
	return json.Unmarshal(data, &c.Path)
}

// SecretRef names a Secret holding credentials for a chart source: keys
// username and password (basic auth), ca.crt (a PEM CA bundle).
type SecretRef struct {
	Namespace string `json:"namespace"`
	Name      string `json:"name"`
}

// RemoteChart is a chart in a chart repository or an OCI registry.
type RemoteChart struct {
	// Repo is https://… or http://… (a chart repository) or oci://host/path.
	Repo string
	// Name is the chart's name.
	Name string
	// Version is a semver constraint on the chart's version ("" for any).
	Version string
	// SecretRef holds credentials (nil: anonymous).
	SecretRef *SecretRef
	// PlainHTTP reaches an oci:// registry over HTTP.
	PlainHTTP bool
	// AllowedHosts are hosts besides the repository's own that its index
	// may send archive downloads to.
	AllowedHosts []string
	// Interval between refreshes of the version list.
	Interval time.Duration
}

// OCI reports whether the chart is in an OCI registry.
func (r *RemoteChart) OCI() bool { return strings.HasPrefix(r.Repo, "oci://") }

// Watch is one validated entry of watches.yaml.
type Watch struct {
	// GVK is the kind whose objects become releases.
	GVK schema.GroupVersionKind
	// Chart is the chart's path (a directory or a .tgz), absolute; empty
	// when the chart is remote.
	Chart string
	// Remote is the chart's repository or registry (nil for a path).
	Remote *RemoteChart
	// OverrideValues is the highest values layer, with $ENV expanded and
	// without the entries read from Secrets (SecretValues).
	OverrideValues map[string]any
	// SecretValues are the overrideValues entries read from Secrets.
	SecretValues []SecretValue
	// Hooks are hook names, run in this order.
	Hooks []string
	// ReconcilePeriod is the safety-net resync period.
	ReconcilePeriod time.Duration
	// MaxConcurrentReconciles bounds parallel reconciles of this kind.
	MaxConcurrentReconciles int
	// WatchDependentResources enables drift detection through the release's objects.
	WatchDependentResources bool
	// Selector restricts the objects reconciled (sharding); nil selects all.
	Selector labels.Selector
	// SelectorSource is the selector as written, for logs.
	SelectorSource *metav1.LabelSelector
	// MaxHistory caps the release revisions kept.
	MaxHistory int
	// Timeout bounds each Helm action.
	Timeout time.Duration
	// HealthTimeout is how long an upgraded release's workloads have to
	// become ready before it is rolled back.
	HealthTimeout time.Duration
	// MaxConcurrentUpgrades bounds the releases of this kind upgrading (until
	// healthy) at once.
	MaxConcurrentUpgrades int
	// CanarySoak is how long every canary must have been Ready on a chart
	// version before the other resources upgrade to it.
	CanarySoak time.Duration
	// ServiceAccountName is the ServiceAccount (in each resource's
	// namespace) that Helm runs as for this kind when no Tenant names one.
	ServiceAccountName string
	// Backup is how resources of this kind are backed up (nil: not at all).
	Backup *Backup
	// Monitoring is the values the monitoring hook adds for resources that
	// ask for monitoring (nil: none).
	Monitoring *Monitoring
	// StorageSizeValue is the values path of the data volumes' size
	// ("persistence.size"), which automatic growth (annotation
	// chartpilot.dev/auto-expand) raises; nil: the kind's volumes do not
	// grow by themselves.
	StorageSizeValue []string
	// Anomalies, when set, reports the Anomalous condition on the kind's
	// resources (nil: not at all).
	Anomalies *Anomalies
	// AllowClusterScoped lists the cluster-scoped kinds ("ClusterRole",
	// "PriorityClass.scheduling.k8s.io") a release of this kind may contain;
	// any other object outside the resource's namespace is refused.
	AllowClusterScoped []string
}

// String names the watch by its GVK, as errors do.
func (w Watch) String() string {
	return w.GVK.GroupVersion().String() + " " + w.GVK.Kind
}

// Load reads and validates path. Relative chart paths are resolved against
// the directory of path.
func Load(path string) ([]Watch, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("reading watches file: %w", err)
	}
	abs, err := filepath.Abs(path)
	if err != nil {
		return nil, err
	}
	ws, err := Parse(data, filepath.Dir(abs), os.LookupEnv)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return ws, nil
}

// Parse validates watches.yaml content. baseDir resolves relative chart
// paths; lookupEnv expands $VAR and ${VAR} in overrideValues strings.
func Parse(data []byte, baseDir string, lookupEnv func(string) (string, bool)) ([]Watch, error) {
	var entries []entry
	if len(bytes.TrimSpace(data)) > 0 {
		if err := yaml.UnmarshalStrict(data, &entries); err != nil {
			return nil, fmt.Errorf("not a list of watch entries: %s: fix the YAML (fields: group, version, kind, chart, overrideValues, hooks, reconcilePeriod, maxConcurrentReconciles, watchDependentResources, selector, maxHistory, timeout, healthTimeout, maxConcurrentUpgrades, canarySoak, serviceAccountName, allowClusterScoped, monitoring, backup, storage, anomalies)", cleanYAMLError(err))
		}
	}
	seen := map[schema.GroupKind]int{}
	out := make([]Watch, 0, len(entries))
	for i, e := range entries {
		w, err := validate(e, baseDir, lookupEnv)
		if err == nil {
			err = validateTrust(e, &w)
		}
		if err != nil {
			return nil, fmt.Errorf("entry %d (%s): %w", i, describe(e), err)
		}
		// Two versions of one kind would be two reconcilers of the same
		// objects, each taking the other's releases for its own.
		if j, dup := seen[w.GVK.GroupKind()]; dup {
			return nil, fmt.Errorf("entry %d (%s): duplicate of entry %d: each group/kind may be watched once, at one version", i, describe(e), j)
		}
		seen[w.GVK.GroupKind()] = i
		out = append(out, w)
	}
	return out, nil
}

func describe(e entry) string {
	gv := e.Version
	if e.Group != "" {
		gv = e.Group + "/" + e.Version
	}
	return strings.TrimSpace(gv + " " + e.Kind)
}

var (
	kindPattern    = regexp.MustCompile(`^[A-Z][A-Za-z0-9]*$`)
	versionPattern = regexp.MustCompile(`^v[1-9][0-9]*((alpha|beta)[1-9][0-9]*)?$`)
	hookPattern    = regexp.MustCompile(`^[a-z][a-z0-9-]*$`)
)

func validate(e entry, baseDir string, lookupEnv func(string) (string, bool)) (Watch, error) {
	w := Watch{}
	if e.Group == "" {
		return w, errors.New("field group: required: the API group of the custom resource, e.g. chartpilot.dev")
	}
	if errs := validation.IsDNS1123Subdomain(e.Group); len(errs) > 0 || !strings.Contains(e.Group, ".") {
		return w, fmt.Errorf("field group: %q is not a DNS subdomain with a dot, e.g. chartpilot.dev", e.Group)
	}
	if !versionPattern.MatchString(e.Version) {
		return w, fmt.Errorf("field version: %q is not a Kubernetes API version such as v1 or v1alpha1", e.Version)
	}
	if !kindPattern.MatchString(e.Kind) {
		return w, fmt.Errorf("field kind: %q is not a kind name: CamelCase starting with a capital letter", e.Kind)
	}
	w.GVK = schema.GroupVersionKind{Group: e.Group, Version: e.Version, Kind: e.Kind}

	if e.Chart.Remote != nil {
		rc, err := validateRemote(e.Chart.Remote)
		if err != nil {
			return w, err
		}
		w.Remote = rc
	} else {
		chart, err := validatePath(e.Chart.Path, baseDir)
		if err != nil {
			return w, err
		}
		w.Chart = chart
	}

	vals, err := expandEnv(e.OverrideValues, "overrideValues", lookupEnv)
	if err != nil {
		return w, err
	}
	if vals == nil {
		vals = map[string]any{}
	}
	w.OverrideValues = vals.(map[string]any)
	if w.SecretValues, err = takeSecretValues(w.OverrideValues, nil); err != nil {
		return w, err
	}

	seenHooks := map[string]bool{}
	for i, h := range e.Hooks {
		if !hookPattern.MatchString(h) {
			return w, fmt.Errorf("field hooks[%d]: %q is not a hook name (lower case letters, digits, dashes)", i, h)
		}
		if seenHooks[h] {
			return w, fmt.Errorf("field hooks[%d]: %q is listed twice", i, h)
		}
		seenHooks[h] = true
	}
	w.Hooks = append([]string(nil), e.Hooks...)
	if m := e.Monitoring; m != nil {
		if !seenHooks["monitoring"] {
			return w, errors.New("field monitoring: the monitoring hook applies it: add monitoring to hooks")
		}
		if len(m.Values) == 0 {
			return w, errors.New("field monitoring.values: give the values that turn the chart's exporter on, e.g. {metrics: {enabled: true}}")
		}
		w.Monitoring = m
	}
	if err := readFollowers(e, &w); err != nil {
		return w, err
	}
	if b := e.Backup; b != nil {
		if b.Image == "" || len(b.Command) == 0 {
			return w, errors.New("field backup: image and command are required: the command writes the backup to its standard output, e.g. command: [redis-cli, -h, $(CHARTPILOT_TARGET_NAME), --rdb, -]")
		}
		for i, env := range b.Env {
			if !envName.MatchString(env.Name) || env.Secret == "" || env.Key == "" {
				return w, fmt.Errorf("field backup.env[%d]: name (a variable name), secret and key are required", i)
			}
		}
		for field, v := range map[string]string{"nodeSelectorValue": b.NodeSelectorValue, "tolerationsValue": b.TolerationsValue} {
			if v != "" && slices.Contains(strings.Split(v, "."), "") {
				return w, fmt.Errorf("field backup.%s %q is not a values path: write the dotted path of the release's %s value, e.g. %s", field, v, strings.TrimSuffix(field, "Value"), strings.TrimSuffix(field, "Value"))
			}
		}
		if r := b.Restore; r != nil {
			if !seenHooks["backup"] {
				return w, errors.New("field backup.restore: the backup hook carries restores out: add backup to hooks")
			}
			if err := checkRestore(r); err != nil {
				return w, err
			}
		}
		w.Backup = b
	}

	for _, d := range []struct {
		field, value, hint string
		min, def           time.Duration
		out                *time.Duration
	}{
		{"reconcilePeriod", e.ReconcilePeriod, "1h (it is a safety net: changes are seen through watches)", time.Minute, DefaultReconcilePeriod, &w.ReconcilePeriod},
		{"timeout", e.Timeout, "5m", time.Second, DefaultTimeout, &w.Timeout},
		{"healthTimeout", e.HealthTimeout, "10m", time.Second, DefaultHealthTimeout, &w.HealthTimeout},
		{"canarySoak", e.CanarySoak, "5m", 0, DefaultCanarySoak, &w.CanarySoak},
	} {
		*d.out = d.def
		if d.value == "" {
			continue
		}
		v, err := time.ParseDuration(d.value)
		if err != nil || v < d.min {
			return w, fmt.Errorf("field %s: %q is not a duration of at least %s, e.g. %s", d.field, d.value, shortDuration(d.min), d.hint)
		}
		*d.out = v
	}
	w.MaxConcurrentUpgrades = DefaultMaxConcurrentUpgrades
	if e.MaxConcurrentUpgrades != nil {
		if *e.MaxConcurrentUpgrades < 1 || *e.MaxConcurrentUpgrades > 1000 {
			return w, fmt.Errorf("field maxConcurrentUpgrades: %d is out of range 1..1000", *e.MaxConcurrentUpgrades)
		}
		w.MaxConcurrentUpgrades = *e.MaxConcurrentUpgrades
	}
	w.MaxConcurrentReconciles = DefaultMaxConcurrentReconciles
	if e.MaxConcurrentReconciles != nil {
		if *e.MaxConcurrentReconciles < 1 || *e.MaxConcurrentReconciles > 256 {
			return w, fmt.Errorf("field maxConcurrentReconciles: %d is out of range 1..256", *e.MaxConcurrentReconciles)
		}
		w.MaxConcurrentReconciles = *e.MaxConcurrentReconciles
	}
	w.MaxHistory = DefaultMaxHistory
	if e.MaxHistory != nil {
		if *e.MaxHistory < 2 || *e.MaxHistory > 100 {
			return w, fmt.Errorf("field maxHistory: %d is out of range 2..100 (rollback needs the previous revision)", *e.MaxHistory)
		}
		w.MaxHistory = *e.MaxHistory
	}
	w.WatchDependentResources = true
	if e.WatchDependentResources != nil {
		w.WatchDependentResources = *e.WatchDependentResources
	}
	if e.Selector != nil {
		sel, err := metav1.LabelSelectorAsSelector(e.Selector)
		if err != nil {
			return w, fmt.Errorf("field selector: %w: write matchLabels or matchExpressions with operators In, NotIn, Exists, DoesNotExist", err)
		}
		w.Selector = sel
		w.SelectorSource = e.Selector
	}
	return w, nil
}

// validateTrust checks the fields that decide what a release may do: the
// ServiceAccount it runs as and the cluster-scoped kinds it may create.
func validateTrust(e entry, w *Watch) error {
	if sa := e.ServiceAccountName; sa != "" {
		if errs := validation.IsDNS1123Subdomain(sa); len(errs) > 0 {
			return fmt.Errorf("field serviceAccountName: %q is not a ServiceAccount name: %s", sa, strings.Join(errs, "; "))
		}
		w.ServiceAccountName = sa
	}
	for i, k := range e.AllowClusterScoped {
		kind, group, _ := strings.Cut(k, ".")
		if !kindPattern.MatchString(kind) || (group != "" && len(validation.IsDNS1123Subdomain(group)) > 0) {
			return fmt.Errorf("field allowClusterScoped[%d]: %q is not a kind: write Kind for the core group or Kind.group, e.g. ClusterRole.rbac.authorization.k8s.io", i, k)
		}
	}
	w.AllowClusterScoped = append([]string(nil), e.AllowClusterScoped...)
	return nil
}

func validatePath(path, baseDir string) (string, error) {
	if path == "" {
		return "", errors.New("field chart: required: a chart directory or .tgz file, or {repo, name, version}")
	}
	chart := path
	if !filepath.IsAbs(chart) {
		chart = filepath.Join(baseDir, chart)
	}
	if abs, err := filepath.Abs(chart); err == nil {
		chart = abs
	}
	st, err := os.Stat(chart)
	switch {
	case strings.Contains(path, "://"):
		return "", fmt.Errorf("field chart: %q is a URL: write chart: {repo: <repository URL or oci://host/path>, name: <chart>, version: <constraint>}", path)
	case err != nil:
		return "", fmt.Errorf("field chart: %s does not exist: fix the path (relative paths are resolved against the watches file's directory)", path)
	case st.IsDir():
		if _, err := os.Stat(filepath.Join(chart, "Chart.yaml")); err != nil {
			return "", fmt.Errorf("field chart: directory %s has no Chart.yaml: point at a chart directory", path)
		}
	case !strings.HasSuffix(chart, ".tgz") && !strings.HasSuffix(chart, ".tar.gz"):
		return "", fmt.Errorf("field chart: %s is a file but not a .tgz chart archive", path)
	}
	return chart, nil
}

// envRef matches $VAR and ${VAR}; $$ is a literal dollar.
var envRef = regexp.MustCompile(`\$\$|\$\{([A-Za-z_][A-Za-z0-9_]*)\}|\$([A-Za-z_][A-Za-z0-9_]*)`)

// expandEnv expands environment references in every string of v. An unset
// variable is an error naming the value's path: an empty image tag or
// password must not reach a release silently.
func expandEnv(v any, path string, lookupEnv func(string) (string, bool)) (any, error) {
	switch t := v.(type) {
	case map[string]any:
		if t == nil {
			return nil, nil
		}
		out := make(map[string]any, len(t))
		keys := make([]string, 0, len(t))
		for k := range t {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for _, k := range keys {
			ev, err := expandEnv(t[k], path+"."+k, lookupEnv)
			if err != nil {
				return nil, err
			}
			out[k] = ev
		}
		return out, nil
	case []any:
		out := make([]any, len(t))
		for i := range t {
			ev, err := expandEnv(t[i], fmt.Sprintf("%s[%d]", path, i), lookupEnv)
			if err != nil {
				return nil, err
			}
			out[i] = ev
		}
		return out, nil
	case string:
		var missing string
		s := envRef.ReplaceAllStringFunc(t, func(m string) string {
			if m == "$$" {
				return "$"
			}
			name := strings.Trim(m, "${}")
			val, ok := lookupEnv(name)
			if !ok && missing == "" {
				missing = name
			}
			return val
		})
		if missing != "" {
			return nil, fmt.Errorf("field %s: environment variable %s is not set: set it for the operator or write $$ for a literal dollar", path, missing)
		}
		return s, nil
	default:
		return v, nil
	}
}

// cleanYAMLError keeps a YAML error on one line.
func cleanYAMLError(err error) string {
	return strings.Join(strings.Fields(err.Error()), " ")
}

// shortDuration prints 1m rather than 1m0s.
func shortDuration(d time.Duration) string {
	s := d.String()
	s = strings.TrimSuffix(s, "0s")
	if strings.HasSuffix(s, "m") || strings.HasSuffix(s, "h") {
		return s
	}
	return d.String()
}

// checkRestore checks a backup.restore block.
func checkRestore(r *BackupRestore) error {
	switch {
	case len(r.Command) == 0:
		return errors.New("field backup.restore.command is required: it reads the backup from its standard input, e.g. [sh, -c, 'cat > /data/dump.rdb']")
	case !strings.Contains(r.Claim, "{name}"):
		return fmt.Errorf("field backup.restore.claim %q must contain {name} (the resource's name): it is the claim the release's first pod mounts, e.g. data-{name}-0", r.Claim)
	case !strings.HasPrefix(r.MountPath, "/"):
		return fmt.Errorf("field backup.restore.mountPath %q must be an absolute path (where the restore command finds the volume)", r.MountPath)
	}
	if _, err := resource.ParseQuantity(r.Size); err != nil {
		return fmt.Errorf("field backup.restore.size %q: a quantity such as 1Gi is required (the claim's size when the values do not set it)", r.Size)
	}
	if r.EnabledValue != "" && slices.Contains(strings.Split(r.EnabledValue, "."), "") {
		return fmt.Errorf("field backup.restore.enabledValue %q is not a values path, e.g. persistence.enabled", r.EnabledValue)
	}
	return nil
}

// parseAnomalies reads `anomalies`, filling in the defaults.
func parseAnomalies(a anomaliesEntry) (*Anomalies, error) {
	out := &Anomalies{Window: DefaultAnomalyWindow, History: DefaultAnomalyHistory}
	for _, d := range []struct {
		field, value string
		min          time.Duration
		out          *time.Duration
	}{{"anomalies.window", a.Window, 30 * time.Second, &out.Window}, {"anomalies.history", a.History, 0, &out.History}} {
		if d.value == "" {
			continue
		}
		v, err := time.ParseDuration(d.value)
		if err != nil || v < d.min {
			return nil, fmt.Errorf("field %s: %q is not a duration of at least %s, e.g. 2m", d.field, d.value, shortDuration(d.min))
		}
		*d.out = v
	}
	if n := out.History / out.Window; n < 5 || n > 1000 {
		return nil, fmt.Errorf("field anomalies.history: %s is %d windows of %s: give 5 to 1000 windows (the normal is their median), e.g. history: 1h with window: 2m", out.History, n, out.Window)
	}
	return out, nil
}

// readFollowers reads what follows a kind's releases once they run:
// `storage` (automatic growth) and `anomalies`.
func readFollowers(e entry, w *Watch) error {
	if st := e.Storage; st != nil {
		path := strings.Split(st.SizeValue, ".")
		for _, seg := range path {
			if seg == "" {
				return fmt.Errorf("field storage.sizeValue: %q is not a values path: write the dotted path of the size value, e.g. persistence.size", st.SizeValue)
			}
		}
		w.StorageSizeValue = path
	}
	if a := e.Anomalies; a != nil {
		var err error
		if w.Anomalies, err = parseAnomalies(*a); err != nil {
			return err
		}
	}
	return nil
}
