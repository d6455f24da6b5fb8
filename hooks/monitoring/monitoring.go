// Package monitoring is the hook that wires a resource into the
// Prometheus Operator: for a Postgres with spec.monitoring.enabled (or a
// resource annotated chartpilot.dev/monitoring: "true" of a kind whose
// watch has a monitoring block), the chart's exporter, ServiceMonitor and
// PrometheusRule are turned on through a values layer, the last two only
// while the monitoring.coreos.com CRDs are served. Their appearance (or removal) is seen from a watch of
// CRDs and re-reconciles every resource, so monitoring is added without a
// restart. MonitoringReady says which it is; it never holds a release up.
package monitoring

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"time"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/discovery"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/source"

	"github.com/chartpilot/chartpilot/internal/api/v1alpha1"
	"github.com/chartpilot/chartpilot/internal/hooks"
	"github.com/chartpilot/chartpilot/internal/values"
	"github.com/chartpilot/chartpilot/internal/watches"
)

// Name is the hook's name in watches.yaml.
const Name = "monitoring"

// GroupVersion is the Prometheus Operator's API.
const GroupVersion = "monitoring.coreos.com/v1"

// needed are the resources of GroupVersion the chart renders.
var needed = []string{"servicemonitors", "prometheusrules"}

// Monitoring knows whether the Prometheus Operator's CRDs are served.
type Monitoring struct {
	Discovery discovery.DiscoveryInterface
	// Kinds are the monitoring blocks of watches.yaml, by kind.
	Kinds map[schema.GroupVersionKind]*watches.Monitoring

	mu      sync.Mutex
	checked bool
	served  bool
}

// Served reports whether ServiceMonitors and PrometheusRules are served,
// asking the API server's discovery the first time only; refresh asks
// again.
func (m *Monitoring) Served(ctx context.Context) bool {
	m.mu.Lock()
	checked, served := m.checked, m.served
	m.mu.Unlock()
	if checked {
		return served
	}
	served, _ = m.refresh()
	return served
}

// refresh asks discovery again; true when the answer changed.
func (m *Monitoring) refresh() (served, changed bool) {
	served = m.ask()
	m.mu.Lock()
	defer m.mu.Unlock()
	changed = !m.checked || served != m.served
	m.checked, m.served = true, served
	return served, changed
}

func (m *Monitoring) ask() bool {
	list, err := m.Discovery.ServerResourcesForGroupVersion(GroupVersion)
	if err != nil {
		return false // not served (404), or unknown: asked again on the next CRD change
	}
	have := map[string]bool{}
	for _, r := range list.APIResources {
		have[r.Name] = true
	}
	for _, n := range needed {
		if !have[n] {
			return false
		}
	}
	return true
}

// wanted returns the values that turn obj's exporter on, and those added
// while the Prometheus Operator's CRDs are served; nil when obj does not
// ask for monitoring.
func (m *Monitoring) wanted(obj hooks.Object) (exporter, operator map[string]any) {
	u := obj.Resource
	if u == nil {
		return nil, nil
	}
	if u.GetKind() == "Postgres" {
		spec, _ := u.Object["spec"].(map[string]any)
		mon, _ := spec["monitoring"].(map[string]any)
		if on, _ := mon["enabled"].(bool); !on {
			return nil, nil
		}
		labels, _ := mon["labels"].(map[string]any)
		sm, pr := map[string]any{"enabled": true}, map[string]any{"enabled": true}
		if len(labels) > 0 {
			sm["labels"], pr["labels"] = labels, labels
		}
		return map[string]any{"metrics": map[string]any{"enabled": true}},
			map[string]any{"metrics": map[string]any{"serviceMonitor": sm, "prometheusRule": pr}}
	}
	block := m.Kinds[u.GroupVersionKind()]
	if block == nil || u.GetAnnotations()[v1alpha1.AnnotationMonitoring] != "true" {
		return nil, nil
	}
	return block.Values, block.PrometheusOperatorValues
}

// Hook is the monitoring hook.
func (m *Monitoring) Hook() *hooks.Hook {
	return &hooks.Hook{
		Name:       Name,
		ReportType: v1alpha1.ConditionMonitoringReady,
		Values: hooks.ValuesFunc(func(ctx context.Context, obj hooks.Object) (map[string]any, error) {
			exporter, operator := m.wanted(obj)
			if exporter == nil {
				return nil, nil
			}
			if !m.Served(ctx) || operator == nil {
				return exporter, nil
			}
			return values.Merge(values.Layer{Name: "exporter", Values: exporter}, values.Layer{Name: "prometheus-operator", Values: operator}), nil
		}),
		Report: func(ctx context.Context, obj hooks.Object) *metav1.Condition {
			exporter, _ := m.wanted(obj)
			if exporter == nil {
				return nil
			}
			if !m.Served(ctx) {
				return &metav1.Condition{Status: metav1.ConditionFalse, Reason: "PrometheusOperatorNotInstalled",
					Message: fmt.Sprintf("the exporter runs, but %s (%s) is not served: install the Prometheus Operator's CRDs and the ServiceMonitor and PrometheusRule are added without a restart", GroupVersion, strings.Join(needed, ", "))}
			}
			return &metav1.Condition{Status: metav1.ConditionTrue, Reason: "Monitored",
				Message: fmt.Sprintf("the release has the exporter and the Prometheus Operator's objects of its chart (%s)", obj.Resource.GetName())}
		},
		Watcher: m,
	}
}

// Watch re-reconciles every resource when a CRD of GroupVersion's group
// appears, changes or goes, and that changes whether the kinds are served:
// the CRDs' metadata only, no polling at rest. A CRD just created is served
// a moment later: discovery is asked again every settleEvery for up to
// settleFor after such a change.
func (m *Monitoring) Watch(mgr manager.Manager, c controller.Controller, enqueue hooks.EnqueueFunc) error {
	crd := &metav1.PartialObjectMetadata{}
	crd.SetGroupVersionKind(apiextensionsv1.SchemeGroupVersion.WithKind("CustomResourceDefinition"))
	// Each controller the hook serves remembers what it last acted on.
	var mu sync.Mutex
	known, last := false, false
	return c.Watch(source.Kind(mgr.GetCache(), client.Object(crd), handler.EnqueueRequestsFromMapFunc(func(ctx context.Context, o client.Object) []reconcile.Request {
		if !strings.HasSuffix(o.GetName(), ".monitoring.coreos.com") {
			return nil
		}
		mu.Lock()
		defer mu.Unlock()
		served, _ := m.refresh()
		// Only a CRD created or being deleted just now is waited for (not
		// the old ones every start lists).
		fresh := time.Since(o.GetCreationTimestamp().Time) < 2*settleFor || o.GetDeletionTimestamp() != nil
		if known && fresh {
			for deadline := time.Now().Add(settleFor); served == last && time.Now().Before(deadline); {
				time.Sleep(settleEvery)
				served, _ = m.refresh()
			}
		}
		changed := !known || served != last
		known, last = true, served
		if !changed {
			return nil
		}
		return enqueue(ctx, nil)
	})))
}

// How long and how often discovery is asked after a CRD of the group
// changed, until the answer changes.
const (
	settleFor   = 15 * time.Second
	settleEvery = 500 * time.Millisecond
)
