package postgres

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	appsv1 "k8s.io/api/apps/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/metrics"

	"github.com/chartpilot/chartpilot/internal/api/v1alpha1"
	"github.com/chartpilot/chartpilot/internal/hooks"
	"github.com/chartpilot/chartpilot/internal/kinds"
	"github.com/chartpilot/chartpilot/internal/values"
)

// GVK is the Postgres kind.
var GVK = v1alpha1.GroupVersion.WithKind("Postgres")

// Kind returns the translator and status reporter of Postgres.
func Kind() kinds.Kind {
	return kinds.Kind{Values: Values, Status: Status, Conditions: Conditions, Facts: Facts, AppMajor: Major, DeployedAppMajor: DeployedMajor, Storage: Storage}
}

// KindWith is Kind whose pods take the instance manager from image
// (REPOSITORY:TAG, the operator's own image; "" keeps the chart's default).
func KindWith(instanceImage string) kinds.Kind {
	k := Kind()
	if instanceImage == "" {
		return k
	}
	repo, tag := instanceImage, "latest"
	if i := strings.LastIndex(instanceImage, ":"); i > strings.LastIndex(instanceImage, "/") {
		repo, tag = instanceImage[:i], instanceImage[i+1:]
	}
	values := k.Values
	k.Values = func(obj *unstructured.Unstructured) (map[string]any, error) {
		v, err := values(obj)
		if err != nil {
			return nil, err
		}
		if f, ok := v["failover"].(map[string]any); ok {
			f["image"] = map[string]any{"repository": repo, "tag": tag}
		}
		return v, nil
	}
	return k
}

// Storage is spec.storage.
func Storage(obj *unstructured.Unstructured) kinds.Storage {
	size, _, _ := unstructured.NestedString(obj.Object, "spec", "storage", "size")
	class, _, _ := unstructured.NestedString(obj.Object, "spec", "storage", "storageClass")
	st := kinds.Storage{Size: size, Class: class, SizeField: "spec.storage.size", ClassField: "spec.storage.storageClass", AutoExpandField: "spec.storage.autoExpand"}
	if raw, ok, _ := unstructured.NestedMap(obj.Object, "spec", "storage", "autoExpand"); ok {
		a := &v1alpha1.StorageAutoExpand{}
		if err := runtime.DefaultUnstructuredConverter.FromUnstructured(raw, a); err != nil {
			st.AutoExpandErr = fmt.Errorf("spec.storage.autoExpand: %w", err)
		} else {
			st.AutoExpand = a
		}
	}
	return st
}

// Facts are the policy figures of a Postgres, read from the values it
// renders (vals, the translator's output): replicas, storage per pod and
// class, CPU and memory per pod, so that spec.values cannot carry what the
// typed fields would be refused for; and the PostgreSQL version.
func Facts(obj *unstructured.Unstructured, vals map[string]any) hooks.Facts {
	f := kinds.GenericFacts(obj, vals)
	f.StorageClassPath = []string{"storage", "storageClass"}
	if pg, err := decode(obj); err == nil {
		f.Version = pg.Spec.Version
	}
	return f
}

func decode(obj *unstructured.Unstructured) (*v1alpha1.Postgres, error) {
	pg := &v1alpha1.Postgres{}
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(obj.Object, pg); err != nil {
		return nil, fmt.Errorf("spec: %w", err)
	}
	return pg, nil
}

// Values maps a Postgres onto charts/postgresql values: spec.values first,
// then every typed field over it.
func Values(obj *unstructured.Unstructured) (map[string]any, error) {
	pg, err := decode(obj)
	if err != nil {
		return nil, err
	}
	s := pg.Spec
	var raw map[string]any
	if s.Values != nil && len(s.Values.Raw) > 0 {
		if err := json.Unmarshal(s.Values.Raw, &raw); err != nil {
			return nil, fmt.Errorf("spec.values: not an object of chart values: %w", err)
		}
	}
	// What reads a store is filled in from the typed fields, checked
	// against the namespace's stores; raw values would pass the checks.
	for key, field := range map[string]string{"walArchive": "spec.backup.walArchive", "bootstrap": "spec.bootstrap.recovery"} {
		if _, ok := raw[key]; ok {
			return nil, fmt.Errorf("spec.values.%s: chartpilot fills the chart's %s values from %s, checked against the namespace's backup stores: remove spec.values.%s and set %s", key, key, field, key, field)
		}
	}
	replicas := int64(1)
	if s.Replicas != nil {
		replicas = int64(*s.Replicas)
	}
	params := map[string]any{}
	for k, v := range Tune(s.Resources, s.Parameters) {
		params[k] = v
	}
	for k, v := range s.Parameters {
		params[k] = v
	}
	failover := map[string]any{"enabled": replicas > 1}
	if f := s.Failover; f != nil {
		if f.Enabled != nil {
			failover["enabled"] = *f.Enabled
		}
		failover["synchronous"] = int64(f.Synchronous)
		failover["maxLagBytes"] = f.MaxLagBytes
	}
	typed := map[string]any{
		"image":    map[string]any{"tag": s.Version},
		"replicas": replicas,
		"failover": failover,
		"storage":  map[string]any{"size": s.Storage.Size, "storageClass": s.Storage.StorageClass},
		"metrics":  map[string]any{"enabled": s.Metrics || (s.Monitoring != nil && s.Monitoring.Enabled)},
	}
	if len(params) > 0 {
		typed["parameters"] = params
	}
	if res, err := toValues(s.Resources); err != nil {
		return nil, err
	} else if len(res) > 0 {
		typed["resources"] = res
	}
	if len(s.NodeSelector) > 0 {
		ns := map[string]any{}
		for k, v := range s.NodeSelector {
			ns[k] = v
		}
		typed["nodeSelector"] = ns
	}
	if len(s.Tolerations) > 0 {
		t, err := toValues(s.Tolerations)
		if err != nil {
			return nil, err
		}
		typed["tolerations"] = t["items"]
	}
	if s.Affinity != nil {
		a, err := toValues(s.Affinity)
		if err != nil {
			return nil, err
		}
		typed["affinity"] = a
	}
	if s.PriorityClassName != "" {
		typed["priorityClassName"] = s.PriorityClassName
	}
	return values.Merge(values.Layer{Name: "spec.values", Values: raw}, values.Layer{Name: "spec", Values: typed}), nil
}

// toValues converts a typed value to plain JSON values; a slice comes back
// under "items".
func toValues(v any) (map[string]any, error) {
	b, err := json.Marshal(v)
	if err != nil {
		return nil, err
	}
	var out any
	if err := json.Unmarshal(b, &out); err != nil {
		return nil, err
	}
	switch t := out.(type) {
	case map[string]any:
		return t, nil
	case []any:
		return map[string]any{"items": t}, nil
	default:
		return nil, nil
	}
}

// servicePort is the port clients reach PostgreSQL on through svc: the
// chart's port named postgresql, else the Service's only port (0: none).
func servicePort(svc *corev1.Service) int32 {
	for _, p := range svc.Spec.Ports {
		if p.Name == "postgresql" {
			return p.Port
		}
	}
	if len(svc.Spec.Ports) == 1 {
		return svc.Spec.Ports[0].Port
	}
	return 0
}

// caSecret is the Secret of the server's certificate as sts mounts it
// (the chart's volume "tls"): its ca.crt is what clients verify. Empty
// when the server takes no TLS.
func caSecret(sts *appsv1.StatefulSet) string {
	for _, v := range sts.Spec.Template.Spec.Volumes {
		if v.Name == "tls" && v.Secret != nil {
			return v.Secret.SecretName
		}
	}
	return ""
}

// Status reports the version, endpoints, tuning and Ready pods. While pods
// are missing it asks to be called again in 5 seconds; once all are Ready it
// asks for nothing, so a resting cluster costs no request.
func Status(ctx context.Context, c client.Reader, obj *unstructured.Unstructured) (map[string]any, time.Duration, error) {
	pg, err := decode(obj)
	if err != nil {
		return nil, 0, err
	}
	want := int32(1)
	if pg.Spec.Replicas != nil {
		want = *pg.Spec.Replicas
	}
	st := v1alpha1.PostgresStatus{
		Version: pg.Spec.Version,
		Endpoints: &v1alpha1.PostgresEndpoints{
			ReadWrite: obj.GetName(),
			ReadOnly:  obj.GetName() + "-ro",
			Secret:    obj.GetName() + "-auth",
		},
		Tuning: Tune(pg.Spec.Resources, pg.Spec.Parameters),
	}
	sts := &appsv1.StatefulSet{}
	err = c.Get(ctx, types.NamespacedName{Namespace: obj.GetNamespace(), Name: obj.GetName()}, sts)
	switch {
	case apierrors.IsNotFound(err):
	case err != nil:
		return nil, 0, fmt.Errorf("reading StatefulSet %s: %w", obj.GetName(), err)
	default:
		st.ReadyReplicas = sts.Status.ReadyReplicas
		st.Endpoints.CASecret = caSecret(sts)
		tls := st.Endpoints.CASecret != ""
		st.Endpoints.TLS = &tls
	}
	svc := &corev1.Service{}
	err = c.Get(ctx, types.NamespacedName{Namespace: obj.GetNamespace(), Name: st.Endpoints.ReadWrite}, svc)
	switch {
	case apierrors.IsNotFound(err):
	case err != nil:
		return nil, 0, fmt.Errorf("reading Service %s: %w", st.Endpoints.ReadWrite, err)
	default:
		st.Endpoints.Port = servicePort(svc)
	}
	again := time.Duration(0)
	if failoverEnabled(pg) {
		// The primary is whoever holds the cluster's Lease; failovers
		// happen without any action of the operator, so it looks again.
		if err := readPrimary(ctx, c, obj, pg, &st); err != nil {
			return nil, 0, err
		}
		if err := readArchiving(ctx, c, obj, pg, &st); err != nil {
			return nil, 0, err
		}
		again = FailoverCheckPeriod
	} else {
		st.Primary = obj.GetName() + "-0"
	}
	if st.Recovery, err = recoveryStatus(ctx, c, obj, pg); err != nil {
		return nil, 0, err
	}
	out, err := runtime.DefaultUnstructuredConverter.ToUnstructured(&st)
	if err != nil {
		return nil, 0, err
	}
	// Only this kind's own fields: the shared release status is the reconciler's.
	extras := map[string]any{}
	for _, k := range []string{"version", "readyReplicas", "endpoints", "tuning", "primary", "lastFailover", "recovery", "archiving"} {
		if v, ok := out[k]; ok {
			extras[k] = v
		} else {
			extras[k] = nil
		}
	}
	if st.ReadyReplicas < want {
		return extras, 5 * time.Second, nil
	}
	return extras, again, nil
}

// FailoverCheckPeriod is how often the primary of a Postgres with failover
// is read (one GET of its Lease).
const FailoverCheckPeriod = 30 * time.Second

var failovers = prometheus.NewCounterVec(prometheus.CounterOpts{
	Name: "chartpilot_postgres_failovers_total",
	Help: "Failovers seen in the Postgres resources' Leases (a standby took over a lost primary).",
}, []string{"namespace", "name"})

func init() { metrics.Registry.MustRegister(failovers) }

func failoverEnabled(pg *v1alpha1.Postgres) bool {
	if f := pg.Spec.Failover; f != nil && f.Enabled != nil {
		return *f.Enabled
	}
	return pg.Spec.Replicas != nil && *pg.Spec.Replicas > 1
}

// readPrimary fills status.primary and status.lastFailover from the
// cluster's Lease (NAME-primary), which the promoting instance manager
// annotates with the member it took over from and its lag.
func readPrimary(ctx context.Context, c client.Reader, obj *unstructured.Unstructured, pg *v1alpha1.Postgres, st *v1alpha1.PostgresStatus) error {
	st.LastFailover = pg.Status.LastFailover
	lease := &coordinationv1.Lease{}
	err := c.Get(ctx, types.NamespacedName{Namespace: obj.GetNamespace(), Name: obj.GetName() + "-primary"}, lease)
	switch {
	case apierrors.IsNotFound(err):
		return nil // no member has started yet
	case err != nil:
		return fmt.Errorf("reading the primary's Lease %s-primary: %w", obj.GetName(), err)
	}
	if lease.Spec.HolderIdentity != nil {
		st.Primary = *lease.Spec.HolderIdentity
	}
	prev := lease.Annotations[v1alpha1.AnnotationPromotedFrom]
	if prev == "" || lease.Spec.AcquireTime == nil || st.Primary == "" {
		return nil
	}
	if last := st.LastFailover; last != nil && last.At.Time.Equal(lease.Spec.AcquireTime.Time.Truncate(time.Second)) && last.To == st.Primary {
		return nil
	}
	lag, _ := strconv.ParseInt(lease.Annotations[v1alpha1.AnnotationPromotedLagBytes], 10, 64)
	st.LastFailover = &v1alpha1.PostgresFailoverStatus{At: metav1.NewTime(lease.Spec.AcquireTime.Time.Truncate(time.Second)), From: prev, To: st.Primary, LagBytes: lag}
	failovers.WithLabelValues(obj.GetNamespace(), obj.GetName()).Inc()
	return nil
}

// Major is the PostgreSQL major version a resource asks for ("17" of
// "17.2"): a change of it is a major upgrade (pg_upgrade territory), so it
// needs the same opt-in as a major chart upgrade.
func Major(obj *unstructured.Unstructured) string {
	v, _, _ := unstructured.NestedString(obj.Object, "spec", "version")
	major, _, _ := strings.Cut(strings.TrimSpace(v), ".")
	return major
}

// DeployedMajor is the PostgreSQL major version running, from status.version
// (written after each deploy).
func DeployedMajor(obj *unstructured.Unstructured) string {
	v, _, _ := unstructured.NestedString(obj.Object, "status", "version")
	major, _, _ := strings.Cut(strings.TrimSpace(v), ".")
	return major
}
