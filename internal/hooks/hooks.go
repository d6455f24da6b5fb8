// Package hooks is how Go code joins chartpilot's release reconciler: a hook
// is selected by name per watches.yaml entry (`hooks: [tenancy, ...]`) and is
// called at fixed points of every reconcile:
//
//   - Validate, at admission and before every action: reject with a reason;
//   - Values, to contribute a values layer;
//   - PreUpgrade, which may block an upgrade;
//   - PostRelease, after a successful install or upgrade;
//   - Report, a condition it reports without holding anything up.
//
// Each point is a small interface with a Func adapter. A hook's error becomes
// a condition (the hook's ConditionType) and a Warning event on the resource
// and stops the action it guards; it is never only logged. A hook may also
// watch its own kinds (Watches) so that a change of them re-reconciles the
// resources it affects.
package hooks

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"sync"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
)

// Object is what a hook sees of a managed resource.
type Object struct {
	// Resource is the custom resource.
	Resource *unstructured.Unstructured
	// Facts are the policy-relevant figures of the resource, read by its kind.
	Facts Facts
	// ChartName and ChartVersion are the chart the resource is released from.
	ChartName, ChartVersion string
	// Values are the release's composed values (every layer, before the
	// chart's own defaults); set for PreInstall only.
	Values map[string]any
}

// Facts are what policies reason about, whatever the kind: replicas, storage
// per pod, storage class, the software version and per-pod CPU and memory.
// Zero means "not set / not known".
type Facts struct {
	Replicas     int64
	StorageBytes int64
	StorageClass string
	// StorageClassPath is the values path that sets the storage class, where
	// a hook may put a default ("storage.storageClass").
	StorageClassPath []string
	// Version is the software version the resource asks for (Postgres spec.version).
	Version     string
	CPUMilli    int64
	MemoryBytes int64
	// PriorityClassName, the taint keys of the tolerations ("" for one
	// without a key) and which of nodeSelector and affinity are set: where
	// the resource asks its pods to run.
	PriorityClassName string
	TolerationKeys    []string
	NodePlacement     []string
}

// Validator rejects a resource with a reason.
type Validator interface {
	Validate(ctx context.Context, obj Object) error
}

// ValidateFunc adapts a function to Validator.
type ValidateFunc func(ctx context.Context, obj Object) error

// Validate calls f.
func (f ValidateFunc) Validate(ctx context.Context, obj Object) error { return f(ctx, obj) }

// ValuesProvider contributes a values layer.
type ValuesProvider interface {
	Values(ctx context.Context, obj Object) (map[string]any, error)
}

// ValuesFunc adapts a function to ValuesProvider.
type ValuesFunc func(ctx context.Context, obj Object) (map[string]any, error)

// Values calls f.
func (f ValuesFunc) Values(ctx context.Context, obj Object) (map[string]any, error) {
	return f(ctx, obj)
}

// PreUpgrader may block an upgrade from one chart version to another.
type PreUpgrader interface {
	PreUpgrade(ctx context.Context, obj Object, fromVersion, toVersion string) error
}

// PreUpgradeFunc adapts a function to PreUpgrader.
type PreUpgradeFunc func(ctx context.Context, obj Object, fromVersion, toVersion string) error

// PreUpgrade calls f.
func (f PreUpgradeFunc) PreUpgrade(ctx context.Context, obj Object, from, to string) error {
	return f(ctx, obj, from, to)
}

// PreInstaller may hold a resource's first install (a Rejection says why
// and keeps it held; it is asked again soon): for work that must be done
// before the release's objects exist, such as restoring a data volume.
type PreInstaller interface {
	PreInstall(ctx context.Context, obj Object) error
}

// PreInstallFunc adapts a function to PreInstaller.
type PreInstallFunc func(ctx context.Context, obj Object) error

// PreInstall calls f.
func (f PreInstallFunc) PreInstall(ctx context.Context, obj Object) error { return f(ctx, obj) }

// PostReleaser runs after a successful install or upgrade.
type PostReleaser interface {
	PostRelease(ctx context.Context, obj Object) error
}

// PostReleaseFunc adapts a function to PostReleaser.
type PostReleaseFunc func(ctx context.Context, obj Object) error

// PostRelease calls f.
func (f PostReleaseFunc) PostRelease(ctx context.Context, obj Object) error { return f(ctx, obj) }

// Layer says where a hook's values go in the values layering.
type Layer int

const (
	// LayerHook sits above the resource's own values.
	LayerHook Layer = iota
	// LayerTenant sits above every hook layer, below watches.yaml overrideValues.
	LayerTenant
)

// EnqueueFunc lists the reconcile requests of every managed resource (of
// the controller's kind) in the given namespaces; nil namespaces means all.
type EnqueueFunc func(ctx context.Context, namespaces []string) []reconcile.Request

// Watcher lets a hook re-reconcile resources when its own objects change:
// it adds watches on its kinds to the controller c, mapping an object to
// the namespaces it affects and those to requests with enqueue.
type Watcher interface {
	Watch(mgr manager.Manager, c controller.Controller, enqueue EnqueueFunc) error
}

// Hook is a named set of implementations; any may be nil.
type Hook struct {
	Name string
	// ConditionType is set False (with the error) when the hook refuses, and
	// True when it passes, e.g. "TenantPolicy".
	ConditionType string
	Validator     Validator
	Values        ValuesProvider
	ValuesLayer   Layer
	PreInstall    PreInstaller
	PreUpgrade    PreUpgrader
	PostRelease   PostReleaser
	Watcher       Watcher
	// Report, when set, is a condition the hook reports on the resource at
	// every pass without holding anything up (MonitoringReady); nil
	// removes the condition of type ReportType.
	Report     func(ctx context.Context, obj Object) *metav1.Condition
	ReportType string
	// Identity returns the user Helm actions for obj run as
	// ("system:serviceaccount:ns:name"), or "" to leave it to the watch's
	// serviceAccountName and --default-service-account; of several hooks
	// that name one, the last in the watch's order wins
	// (internal/identity.Resolve).
	Identity func(ctx context.Context, obj Object) (string, error)
	// Peers returns the namespaces whose resources share a fleet rollout
	// (canaries) with those of namespace, such as a tenant's namespaces;
	// nil when the hook has no say.
	Peers func(ctx context.Context, namespace string) ([]string, error)
}

// Rejection is a Validate error that names a policy: admission denies with
// its message; the reconciler sets the hook's condition with its reason.
type Rejection struct {
	Reason  string
	Message string
	// Retry: the refusal waits on something outside the resource (a store
	// not yet checked, say), so the reconciler looks again on its own,
	// backing off, besides when a hook's watch wakes the resource.
	Retry bool
}

func (r *Rejection) Error() string { return r.Message }

// Reject builds a Rejection.
func Reject(reason, format string, args ...any) error {
	return &Rejection{Reason: reason, Message: fmt.Sprintf(format, args...)}
}

// Wait builds a Rejection that waits on something outside the resource
// (Retry).
func Wait(reason, format string, args ...any) error {
	return &Rejection{Reason: reason, Message: fmt.Sprintf(format, args...), Retry: true}
}

// AsRejection returns the Rejection in err, if any.
func AsRejection(err error) (*Rejection, bool) {
	var r *Rejection
	ok := errors.As(err, &r)
	return r, ok
}

// Registry holds hooks by name.
type Registry struct {
	mu    sync.RWMutex
	hooks map[string]*Hook
}

// NewRegistry returns an empty registry.
func NewRegistry() *Registry { return &Registry{hooks: map[string]*Hook{}} }

// Register adds a hook; a name may be registered once.
func (r *Registry) Register(h *Hook) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if h.Name == "" {
		return errors.New("registering a hook without a name")
	}
	if _, dup := r.hooks[h.Name]; dup {
		return fmt.Errorf("hook %q is registered twice", h.Name)
	}
	r.hooks[h.Name] = h
	return nil
}

// Select returns the named hooks in order, or an error naming every unknown
// name and the known ones.
func (r *Registry) Select(names []string) ([]*Hook, error) {
	r.mu.RLock()
	defer r.mu.RUnlock()
	var out []*Hook
	var unknown []string
	for _, n := range names {
		h, ok := r.hooks[n]
		if !ok {
			unknown = append(unknown, n)
			continue
		}
		out = append(out, h)
	}
	if len(unknown) > 0 {
		known := make([]string, 0, len(r.hooks))
		for n := range r.hooks {
			known = append(known, n)
		}
		sort.Strings(known)
		return nil, fmt.Errorf("unknown hook(s) %v: registered hooks are %v", unknown, known)
	}
	return out, nil
}
