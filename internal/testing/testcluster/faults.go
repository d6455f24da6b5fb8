package testcluster

import (
	"fmt"
	"math"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
)

// Fault is one kind of injected failure.
type Fault int

// The faults a FaultProxy injects, in equal shares.
const (
	// FaultThrottled answers 429 TooManyRequests with Retry-After: 1,
	// without passing the request on.
	FaultThrottled Fault = iota
	// FaultInternal answers 500 InternalError without passing the request on.
	FaultInternal
	// FaultLate passes the request on after FaultProxy.Delay.
	FaultLate
	faultKinds
)

// FaultProxy sits between a client and the API server and answers a share
// of the client's requests with a fault. Watches pass untouched (a broken
// watch only relists). It forwards with the upstream config's credentials,
// so the audit log shows the requests that reached the server under that
// config's user.
type FaultProxy struct {
	// URL is the proxy's HTTPS address (a self-signed certificate).
	URL string
	// Delay is how late a FaultLate request is passed on.
	Delay time.Duration
	// Force, when set, answers every request it returns true for with 500
	// (besides the random faults). Set it before requests flow.
	Force func(*http.Request) bool

	srv      *httptest.Server
	rate     atomic.Uint64 // math.Float64bits of the share faulted
	mu       sync.Mutex
	rng      *rand.Rand
	total    atomic.Int64
	injected [faultKinds]atomic.Int64
}

// StartFaultProxy starts a proxy to upstream that faults rate (0–1) of the
// non-watch requests, chosen by a generator seeded with seed.
func StartFaultProxy(upstream *rest.Config, rate float64, seed uint64) (*FaultProxy, error) {
	target, err := url.Parse(upstream.Host)
	if err != nil {
		return nil, err
	}
	transport, err := rest.TransportFor(upstream)
	if err != nil {
		return nil, err
	}
	rp := httputil.NewSingleHostReverseProxy(target)
	rp.Transport = transport
	rp.FlushInterval = -1 // stream watches
	f := &FaultProxy{Delay: 2 * time.Second, rng: rand.New(rand.NewPCG(seed, 7))}
	f.SetRate(rate)
	f.srv = httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Query().Get("watch") == "true" {
			rp.ServeHTTP(w, r)
			return
		}
		f.total.Add(1)
		if f.Force != nil && f.Force(r) {
			f.injected[FaultInternal].Add(1)
			writeStatus(w, http.StatusInternalServerError, "InternalError")
			return
		}
		x, kind := f.roll()
		if x >= f.Rate() {
			rp.ServeHTTP(w, r)
			return
		}
		f.injected[kind].Add(1)
		switch kind {
		case FaultThrottled:
			w.Header().Set("Retry-After", "1")
			writeStatus(w, http.StatusTooManyRequests, "TooManyRequests")
		case FaultInternal:
			writeStatus(w, http.StatusInternalServerError, "InternalError")
		default:
			time.Sleep(f.Delay)
			rp.ServeHTTP(w, r)
		}
	}))
	f.srv.StartTLS()
	f.URL = f.srv.URL
	return f, nil
}

func writeStatus(w http.ResponseWriter, code int, reason string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	fmt.Fprintf(w, `{"kind":"Status","apiVersion":"v1","status":"Failure","message":"injected fault","reason":%q,"code":%d}`, reason, code)
}

func (f *FaultProxy) roll() (float64, Fault) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.rng.Float64(), Fault(f.rng.IntN(int(faultKinds)))
}

// SetRate changes the share of requests faulted from now on.
func (f *FaultProxy) SetRate(rate float64) { f.rate.Store(math.Float64bits(rate)) }

// Rate is the share of requests faulted.
func (f *FaultProxy) Rate() float64 { return math.Float64frombits(f.rate.Load()) }

// Counts returns the non-watch requests seen and those faulted, by kind.
func (f *FaultProxy) Counts() (total int64, injected [faultKinds]int64) {
	for i := range injected {
		injected[i] = f.injected[i].Load()
	}
	return f.total.Load(), injected
}

// Injected is the number of faults injected so far.
func (f *FaultProxy) Injected() int64 {
	_, in := f.Counts()
	var n int64
	for _, v := range in {
		n += v
	}
	return n
}

// Config is a client config for the proxy (no credentials of its own: the
// proxy adds the upstream's).
func (f *FaultProxy) Config() *rest.Config {
	return &rest.Config{Host: f.URL, TLSClientConfig: rest.TLSClientConfig{Insecure: true}, QPS: 100, Burst: 200}
}

// WriteKubeconfig writes a kubeconfig for the proxy to path.
func (f *FaultProxy) WriteKubeconfig(path string) error {
	kc := clientcmdapi.NewConfig()
	kc.Clusters["proxy"] = &clientcmdapi.Cluster{Server: f.URL, InsecureSkipTLSVerify: true}
	kc.AuthInfos["proxy"] = &clientcmdapi.AuthInfo{}
	kc.Contexts["proxy"] = &clientcmdapi.Context{Cluster: "proxy", AuthInfo: "proxy"}
	kc.CurrentContext = "proxy"
	data, err := clientcmd.Write(*kc)
	if err != nil {
		return err
	}
	return os.WriteFile(path, data, 0o600)
}

// Close stops the proxy.
func (f *FaultProxy) Close() { f.srv.Close() }
