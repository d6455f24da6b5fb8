package release_test

import (
	"fmt"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"

	"github.com/chartpilot/chartpilot/internal/api/v1alpha1"
	"github.com/chartpilot/chartpilot/internal/helm"
	"github.com/chartpilot/chartpilot/internal/watches"
)

// faultProxy sits between the operator and the API server and answers a
// share of the requests with 429 (Retry-After), 503 (Retry-After), a plain
// 500, or a delay. Watches pass untouched (a broken watch only relists).
type faultProxy struct {
	mu       sync.Mutex
	rng      *rand.Rand
	injected atomic.Int64
	total    atomic.Int64
}

func (f *faultProxy) roll() float64 {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.rng.Float64()
}

func startFaultProxy(t *testing.T, upstream *rest.Config) (*rest.Config, *faultProxy) {
	t.Helper()
	target, err := url.Parse(upstream.Host)
	if err != nil {
		t.Fatal(err)
	}
	transport, err := rest.TransportFor(upstream)
	if err != nil {
		t.Fatal(err)
	}
	rp := httputil.NewSingleHostReverseProxy(target)
	rp.Transport = transport
	rp.FlushInterval = -1 // stream watches
	f := &faultProxy{rng: rand.New(rand.NewPCG(42, 7))}
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		f.total.Add(1)
		if r.URL.Query().Get("watch") == "true" {
			rp.ServeHTTP(w, r)
			return
		}
		switch x := f.roll(); {
		case x < 0.05:
			f.injected.Add(1)
			w.Header().Set("Retry-After", "1")
			http.Error(w, `{"kind":"Status","apiVersion":"v1","status":"Failure","reason":"TooManyRequests","code":429}`, http.StatusTooManyRequests)
			return
		case x < 0.08:
			f.injected.Add(1)
			w.Header().Set("Retry-After", "1")
			http.Error(w, `{"kind":"Status","apiVersion":"v1","status":"Failure","reason":"ServiceUnavailable","code":503}`, http.StatusServiceUnavailable)
			return
		case x < 0.10 && r.Method != http.MethodGet:
			f.injected.Add(1)
			http.Error(w, `{"kind":"Status","apiVersion":"v1","status":"Failure","reason":"InternalError","code":500}`, http.StatusInternalServerError)
			return
		case x < 0.15:
			f.injected.Add(1)
			time.Sleep(300 * time.Millisecond)
		}
		rp.ServeHTTP(w, r)
	}))
	srv.StartTLS()
	t.Cleanup(srv.Close)
	return &rest.Config{Host: srv.URL, TLSClientConfig: rest.TLSClientConfig{Insecure: true}, QPS: 100, Burst: 200}, f
}

// TestConvergesThroughAPIFaults: with a tenth of the operator's requests
// answered 429/503/500 or slowly, every resource still converges and no
// release is left pending or failed.
func TestConvergesThroughAPIFaults(t *testing.T) {
	e := newEnv(t)
	cfg, faults := startFaultProxy(t, cluster.Config)
	startOperator(t, cfg, []watches.Watch{webappWatch(t, func(w *watches.Watch) { w.MaxConcurrentReconciles = 8 })})
	const n = 20
	for i := range n {
		e.create(fmt.Sprintf("f-%02d", i), map[string]any{"message": "v1"}, nil, nil)
	}
	deadline := time.Now().Add(5 * time.Minute)
	for i := range n {
		name := fmt.Sprintf("f-%02d", i)
		for {
			u := e.get(name)
			if c := condition(u, v1alpha1.ConditionReady); c != nil && c.Status == metav1.ConditionTrue && c.ObservedGeneration == u.GetGeneration() {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s not Ready within 5 minutes of faults: %v (faults injected %d of %d requests)", name, u.Object["status"], faults.injected.Load(), faults.total.Load())
			}
			time.Sleep(500 * time.Millisecond)
		}
	}
	var bad []string
	for i := range n {
		h := e.history(fmt.Sprintf("f-%02d", i))
		last := h[len(h)-1]
		if last.Status != helm.StatusDeployed {
			bad = append(bad, fmt.Sprintf("f-%02d rev %d %s", i, last.Revision, last.Status))
		}
	}
	if len(bad) > 0 {
		t.Errorf("releases not deployed after convergence: %s", strings.Join(bad, ", "))
	}
	if faults.injected.Load() < 20 {
		t.Errorf("only %d faults injected: the test proves little", faults.injected.Load())
	}
	t.Logf("converged %d releases through %d injected faults in %d requests", n, faults.injected.Load(), faults.total.Load())
}
