package release

import (
	"context"
	"fmt"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/chartpilot/chartpilot/internal/api/v1alpha1"
)

// secretTTL is how long a Secret read for overrideValues is reused: a
// fleet's passes share one read, and a rotated value reaches each release
// at its next pass after that.
const secretTTL = 10 * time.Second

// secretReads remembers the Secrets read for overrideValues.
type secretReads struct {
	mu sync.Mutex
	m  map[types.NamespacedName]secretRead
}

type secretRead struct {
	data map[string][]byte
	at   time.Time
}

// overrideSecrets reads the watch's overrideValues entries that come from
// Secrets (valueFrom.secretKeyRef) as one values layer, nil when there are
// none. An error names the entry and the Secret, never a value.
func (r *Reconciler) overrideSecrets(ctx context.Context) (map[string]any, error) {
	if len(r.Watch.SecretValues) == 0 {
		return nil, nil
	}
	out := map[string]any{}
	for _, sv := range r.Watch.SecretValues {
		key := types.NamespacedName{Namespace: sv.Namespace, Name: sv.Name}
		data, err := r.readSecret(ctx, key)
		if err != nil {
			return nil, fmt.Errorf("%s: reading Secret %s: %w", sv.Field(), key, err)
		}
		v, ok := data[sv.Key]
		if !ok {
			return nil, fmt.Errorf("%s: Secret %s has no key %q: add it, or fix the reference in watches.yaml", sv.Field(), key, sv.Key)
		}
		m := out
		for _, k := range sv.Path[:len(sv.Path)-1] {
			next, ok := m[k].(map[string]any)
			if !ok {
				next = map[string]any{}
				m[k] = next
			}
			m = next
		}
		m[sv.Path[len(sv.Path)-1]] = string(v)
	}
	return out, nil
}

// readSecret reads a Secret through the API (Secrets are not cached: that
// would hold every Secret of the cluster), reusing a read for secretTTL.
func (r *Reconciler) readSecret(ctx context.Context, key types.NamespacedName) (map[string][]byte, error) {
	c := &r.secrets
	c.mu.Lock()
	if got, ok := c.m[key]; ok && r.now().Sub(got.at) < secretTTL {
		c.mu.Unlock()
		return got.data, nil
	}
	c.mu.Unlock()
	s := &corev1.Secret{}
	if err := r.APIReader.Get(ctx, key, s); err != nil {
		return nil, err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.m == nil {
		c.m = map[types.NamespacedName]secretRead{}
	}
	c.m[key] = secretRead{data: s.Data, at: r.now()}
	return s.Data, nil
}

// holdOverrides leaves the release as it is while a value of the watch's
// overrideValues cannot be read, and says why.
func (r *Reconciler) holdOverrides(p *pass, d *desired, err error) {
	msg := "overrideValues of watches.yaml cannot be read, nothing is changed until they can: " + oneLine(err.Error())
	setCondition(p.status, p.obj, v1alpha1.ConditionReconciling, metav1.ConditionTrue, "OverrideSecretUnavailable", msg)
	r.event(p, corev1.EventTypeWarning, "OverrideSecretUnavailable", msg)
	d.held, d.retryAfter = true, r.mem.retryAfter(p.key, "OverrideSecret")
}
