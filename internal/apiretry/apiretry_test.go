package apiretry

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
)

var fast = Policy{Attempts: 4, Base: time.Millisecond, Max: 5 * time.Millisecond, MaxRetryAfter: 2 * time.Second}

// server answers each request with the next of answers (the last one
// repeats) and counts the requests by method.
type server struct {
	mu      sync.Mutex
	answers []func(w http.ResponseWriter, r *http.Request)
	seen    []string
}

func (s *server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	i := min(len(s.seen), len(s.answers)-1)
	s.seen = append(s.seen, r.Method)
	a := s.answers[i]
	s.mu.Unlock()
	a(w, r)
}

func status(code int, headers ...string) func(w http.ResponseWriter, r *http.Request) {
	return func(w http.ResponseWriter, _ *http.Request) {
		for i := 0; i+1 < len(headers); i += 2 {
			w.Header().Set(headers[i], headers[i+1])
		}
		w.WriteHeader(code)
		fmt.Fprintf(w, `{"kind":"Status","code":%d}`, code)
	}
}

func object(labels string) func(w http.ResponseWriter, r *http.Request) {
	return func(w http.ResponseWriter, _ *http.Request) {
		fmt.Fprintf(w, `{"kind":"ConfigMap","metadata":{"name":"cm","labels":%s}}`, labels)
	}
}

func do(t *testing.T, s *server, method, contentType, body string) (*http.Response, error) {
	t.Helper()
	srv := httptest.NewServer(s)
	t.Cleanup(srv.Close)
	c := &http.Client{Transport: &Transport{Next: http.DefaultTransport, Policy: fast}}
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, err := http.NewRequest(method, srv.URL+"/api/v1/namespaces/ns/configmaps", rd)
	if err != nil {
		t.Fatal(err)
	}
	if contentType != "" {
		req.Header.Set("Content-Type", contentType)
	}
	return c.Do(req)
}

func TestRetries(t *testing.T) {
	const create = `{"metadata":{"name":"cm","labels":{"a":"1"}}}`
	for _, tc := range []struct {
		name        string
		method, ct  string
		body        string
		answers     []func(http.ResponseWriter, *http.Request)
		wantCode    int
		wantAttempt int
	}{
		{"read after two server errors", http.MethodGet, "", "", []func(http.ResponseWriter, *http.Request){status(500), status(502), object(`{}`)}, 200, 3},
		{"read gives up after the attempts", http.MethodGet, "", "", []func(http.ResponseWriter, *http.Request){status(500)}, 500, 4},
		{"throttled create is sent again", http.MethodPost, "application/json", create, []func(http.ResponseWriter, *http.Request){status(429, "Retry-After", "1"), status(201)}, 201, 2},
		{"not found is an answer", http.MethodGet, "", "", []func(http.ResponseWriter, *http.Request){status(404)}, 404, 1},
		{"conflict is an answer", http.MethodPut, "application/json", create, []func(http.ResponseWriter, *http.Request){status(409)}, 409, 1},
		{"merge patch after a server error", http.MethodPatch, "application/merge-patch+json", `{}`, []func(http.ResponseWriter, *http.Request){status(500), status(200)}, 200, 2},
		{"JSON patch is not sent twice", http.MethodPatch, "application/json-patch+json", `[]`, []func(http.ResponseWriter, *http.Request){status(500), status(200)}, 500, 1},
		{"generateName create is not sent twice", http.MethodPost, "application/json", `{"metadata":{"generateName":"cm-"}}`, []func(http.ResponseWriter, *http.Request){status(500), status(201)}, 500, 1},
		{"but it is sent again when throttled", http.MethodPost, "application/json", `{"metadata":{"generateName":"cm-"}}`, []func(http.ResponseWriter, *http.Request){status(429), status(201)}, 201, 2},
		{"create made by the lost attempt is its answer", http.MethodPost, "application/json", create, []func(http.ResponseWriter, *http.Request){status(500), status(409), object(`{"a":"1"}`)}, 201, 3},
		{"someone else's object is a conflict", http.MethodPost, "application/json", create, []func(http.ResponseWriter, *http.Request){status(500), status(409), object(`{"a":"2"}`)}, 409, 3},
		{"conflict on a first create is not looked into", http.MethodPost, "application/json", create, []func(http.ResponseWriter, *http.Request){status(409), object(`{"a":"1"}`)}, 409, 1},
		{"service unavailable with Retry-After is sent again", http.MethodPost, "application/json", `[]`, []func(http.ResponseWriter, *http.Request){status(503, "Retry-After", "1"), status(200)}, 200, 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := &server{answers: tc.answers}
			resp, err := do(t, s, tc.method, tc.ct, tc.body)
			if err != nil {
				t.Fatal(err)
			}
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != tc.wantCode || len(s.seen) != tc.wantAttempt {
				t.Fatalf("got %d after %d requests %v, want %d after %d (body %s)", resp.StatusCode, len(s.seen), s.seen, tc.wantCode, tc.wantAttempt, body)
			}
			if tc.wantCode == 201 && strings.Contains(tc.name, "lost attempt") {
				var m map[string]any
				if err := json.Unmarshal(body, &m); err != nil || m["kind"] != "ConfigMap" {
					t.Fatalf("answer is not the object: %s", body)
				}
			}
		})
	}
}

func TestWatchesAreNotRetried(t *testing.T) {
	s := &server{answers: []func(http.ResponseWriter, *http.Request){status(500), status(200)}}
	srv := httptest.NewServer(s)
	defer srv.Close()
	c := &http.Client{Transport: &Transport{Next: http.DefaultTransport, Policy: fast}}
	resp, err := c.Get(srv.URL + "/api/v1/configmaps?watch=true")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 500 || len(s.seen) != 1 {
		t.Fatalf("watch: %d after %d requests", resp.StatusCode, len(s.seen))
	}
}

func TestCancelStopsRetrying(t *testing.T) {
	s := &server{answers: []func(http.ResponseWriter, *http.Request){status(429, "Retry-After", "10")}}
	srv := httptest.NewServer(s)
	defer srv.Close()
	c := &http.Client{Transport: &Transport{Next: http.DefaultTransport, Policy: DefaultPolicy}}
	ctx, cancel := context.WithCancel(context.Background())
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, srv.URL+"/api/v1/configmaps", nil)
	go func() {
		for {
			s.mu.Lock()
			n := len(s.seen)
			s.mu.Unlock()
			if n > 0 {
				cancel()
				return
			}
			time.Sleep(time.Millisecond)
		}
	}()
	_, err := c.Do(req)
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("got %v, want the context's cancellation", err)
	}
	if len(s.seen) != 1 {
		t.Fatalf("%d requests after cancel", len(s.seen))
	}
}

func TestTransient(t *testing.T) {
	gr := schema.GroupResource{Resource: "configmaps"}
	for _, tc := range []struct {
		err  error
		want bool
	}{
		{apierrors.NewTooManyRequests("slow down", 1), true},
		{fmt.Errorf("release x failed: %w", apierrors.NewInternalError(errors.New("boom"))), true},
		{errors.Join(errors.New("first"), apierrors.NewServiceUnavailable("later")), true},
		{apierrors.NewConflict(gr, "cm", errors.New("modified")), true},
		{errors.New(`Get "https://10.0.0.1/api": dial tcp 10.0.0.1:443: connect: connection refused`), true},
		{apierrors.NewNotFound(gr, "cm"), false},
		{apierrors.NewBadRequest("spec.replicas: must be a number"), false},
		{apierrors.NewForbidden(gr, "cm", errors.New("no")), false},
		{apierrors.NewAlreadyExists(gr, "cm"), false},
		{fmt.Errorf("hook timed out: %w", context.DeadlineExceeded), false},
		{errors.New("template: webapp/templates/cm.yaml:3: function \"nope\" not defined"), false},
		{nil, false},
	} {
		if got := Transient(tc.err); got != tc.want {
			t.Errorf("Transient(%v) = %v, want %v", tc.err, got, tc.want)
		}
	}
}

// TestTypedClientCreates: client-go's typed clients send protobuf bodies
// that cannot be rewound; their creates are retried all the same, and a
// create the lost attempt made is recognised from the protobuf metadata.
func TestTypedClientCreates(t *testing.T) {
	secret := func(labels string) func(http.ResponseWriter, *http.Request) {
		return func(w http.ResponseWriter, r *http.Request) {
			if r.Method != http.MethodGet {
				t.Errorf("looked up the existing object with %s", r.Method)
			}
			w.Header().Set("Content-Type", "application/json")
			fmt.Fprintf(w, `{"kind":"Secret","apiVersion":"v1","metadata":{"name":"rec","namespace":"ns","labels":%s}}`, labels)
		}
	}
	created := func(w http.ResponseWriter, r *http.Request) {
		if ct := r.Header.Get("Content-Type"); !strings.HasPrefix(ct, "application/vnd.kubernetes.protobuf") {
			t.Errorf("the typed client sent %q, not protobuf: the test does not test what it says", ct)
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		fmt.Fprint(w, `{"kind":"Secret","apiVersion":"v1","metadata":{"name":"rec","namespace":"ns"}}`)
	}
	conflict := func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusConflict)
		fmt.Fprint(w, `{"kind":"Status","apiVersion":"v1","status":"Failure","reason":"AlreadyExists","code":409}`)
	}
	for _, tc := range []struct {
		name     string
		answers  []func(http.ResponseWriter, *http.Request)
		wantErr  func(error) bool
		requests int
	}{
		{"sent again after a server error", []func(http.ResponseWriter, *http.Request){status(500), created}, func(err error) bool { return err == nil }, 2},
		{"made by the lost attempt", []func(http.ResponseWriter, *http.Request){status(500), conflict, secret(`{"owner":"helm"}`)}, func(err error) bool { return err == nil }, 3},
		{"someone else's", []func(http.ResponseWriter, *http.Request){status(500), conflict, secret(`{"owner":"other"}`)}, apierrors.IsAlreadyExists, 3},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := &server{answers: tc.answers}
			srv := httptest.NewServer(s)
			defer srv.Close()
			cfg := &rest.Config{Host: srv.URL}
			Wrap(cfg, fast, nil)
			cs, err := kubernetes.NewForConfig(cfg)
			if err != nil {
				t.Fatal(err)
			}
			_, err = cs.CoreV1().Secrets("ns").Create(context.Background(), &corev1.Secret{
				ObjectMeta: metav1.ObjectMeta{Name: "rec", Labels: map[string]string{"owner": "helm"}},
				Data:       map[string][]byte{"release": []byte("body")},
			}, metav1.CreateOptions{})
			if !tc.wantErr(err) || len(s.seen) != tc.requests {
				t.Fatalf("err %v after %d requests %v", err, len(s.seen), s.seen)
			}
		})
	}
}
