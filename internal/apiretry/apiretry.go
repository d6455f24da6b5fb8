// Package apiretry retries requests to the API server that failed for a
// reason that says "try again": 429 (honouring Retry-After), 5xx, and
// broken connections. It wraps the transport of a client config, so every
// client built from it (the manager's, Helm's, the dynamic ones) gains the
// retries, and a Helm action is not failed by one lost request.
//
// A request is retried only where sending it again cannot do something the
// caller did not ask for:
//   - 429 means the server did not process the request: any method is
//     sent again.
//   - After a 5xx or a broken connection the request may or may not have
//     been carried out. Reads, deletes of a named object and merge or
//     apply patches are sent again (doing them twice is doing them once).
//     A create of a named object is sent again too: if the retry finds the
//     object already there and it carries exactly the labels and
//     annotations sent, the first attempt made it and its answer is
//     returned as the create's. JSON patches and creates with generateName
//     are not retried.
//   - Watches are never retried here (an informer relists).
//
// Attempts back off exponentially with jitter, wait at least what
// Retry-After asks (up to a bound), and stop when the request's context
// ends.
package apiretry

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"strconv"
	"strings"
	"syscall"
	"time"

	"google.golang.org/protobuf/encoding/protowire"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/rest"
)

// Policy bounds the retries of one request.
type Policy struct {
	// Attempts is the most times a request is sent (1: no retries).
	Attempts int
	// Base is the first back-off; each retry doubles it, up to Max.
	Base, Max time.Duration
	// MaxRetryAfter bounds how long a Retry-After is honoured.
	MaxRetryAfter time.Duration
}

// DefaultPolicy: 6 attempts over about 6 s of back-off (plus what
// Retry-After asks), enough to ride out a burst of throttling or an API
// server restart behind a load balancer.
var DefaultPolicy = Policy{Attempts: 6, Base: 200 * time.Millisecond, Max: 5 * time.Second, MaxRetryAfter: 10 * time.Second}

// Observer is told of every retry (for metrics); reason is the HTTP
// status code or "connection".
type Observer func(method, reason string)

// Wrap makes every client built from cfg retry as policy says.
func Wrap(cfg *rest.Config, policy Policy, observe Observer) {
	cfg.Wrap(func(rt http.RoundTripper) http.RoundTripper {
		return &Transport{Next: rt, Policy: policy, Observe: observe}
	})
}

// Transport retries the requests it carries; see the package comment.
type Transport struct {
	Next    http.RoundTripper
	Policy  Policy
	Observe Observer
}

// RoundTrip implements http.RoundTripper.
func (t *Transport) RoundTrip(req *http.Request) (*http.Response, error) {
	if req.URL.Query().Get("watch") == "true" || t.Policy.Attempts <= 1 {
		return t.Next.RoundTrip(req)
	}
	if req.Body != nil && req.Body != http.NoBody && req.GetBody == nil {
		// Kept in memory to be sent again (client-go's bodies are
		// readers that cannot be rewound from here).
		body := req.Body
		data, err := io.ReadAll(io.LimitReader(body, maxBuffered+1))
		if err != nil {
			body.Close()
			return nil, err
		}
		if len(data) > maxBuffered {
			once := req.Clone(req.Context())
			once.Body = readCloser{io.MultiReader(bytes.NewReader(data), body), body}
			return t.Next.RoundTrip(once)
		}
		body.Close()
		req = req.Clone(req.Context())
		req.Body = io.NopCloser(bytes.NewReader(data))
		req.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(data)), nil }
	}
	kind := classify(req)
	ambiguous := false // an earlier attempt may have been carried out
	for attempt := 1; ; attempt++ {
		r := req
		if attempt > 1 {
			r = req.Clone(req.Context())
			if req.GetBody != nil {
				body, err := req.GetBody()
				if err != nil {
					return nil, err
				}
				r.Body = body
			}
		}
		resp, err := t.Next.RoundTrip(r)
		if ambiguous && kind == namedCreate && err == nil && resp.StatusCode == http.StatusConflict {
			return t.madeByEarlierAttempt(req, resp)
		}
		wait, again, unsure := verdict(req, kind, resp, err)
		if !again || attempt >= t.Policy.Attempts {
			return resp, err
		}
		ambiguous = ambiguous || unsure
		if t.Observe != nil {
			reason := "connection"
			if resp != nil {
				reason = strconv.Itoa(resp.StatusCode)
			}
			t.Observe(req.Method, reason)
		}
		if resp != nil {
			_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
			resp.Body.Close()
		}
		wait = max(wait, t.backoff(attempt))
		if err := sleep(req.Context(), wait); err != nil {
			return nil, err
		}
	}
}

// maxBuffered is the largest request body kept to be sent again: a release
// record is at most 1 MiB, base64 in JSON about 1.4 MiB.
const maxBuffered = 4 << 20

type readCloser struct {
	io.Reader
	io.Closer
}

// backoff is the jittered wait before attempt+1: half to all of
// Base·2^(attempt-1), at most Max.
func (t *Transport) backoff(attempt int) time.Duration {
	d := t.Policy.Base << min(attempt-1, 20)
	if d > t.Policy.Max || d <= 0 {
		d = t.Policy.Max
	}
	return d/2 + rand.N(d/2+1)
}

// requestKind says what sending a request twice does.
type requestKind int

const (
	idempotent  requestKind = iota // read, delete, merge/apply patch, replace
	namedCreate                    // POST of an object with a name
	unsafe                         // may do something twice: only retried when the server did not process it
)

func classify(req *http.Request) requestKind {
	switch req.Method {
	case http.MethodGet, http.MethodHead, http.MethodOptions, http.MethodDelete, http.MethodPut:
		return idempotent
	case http.MethodPatch:
		if strings.HasPrefix(req.Header.Get("Content-Type"), "application/json-patch+json") {
			return unsafe
		}
		return idempotent
	case http.MethodPost:
		if name, ok := postedName(req); ok && name != "" {
			return namedCreate
		}
	}
	return unsafe
}

// postedName reads metadata.name of a JSON request body; ok is false when
// the body is not JSON or has generateName.
func postedName(req *http.Request) (string, bool) {
	meta, ok := postedMeta(req)
	if !ok || meta.GenerateName != "" {
		return "", false
	}
	return meta.Name, true
}

type objectMeta struct {
	Name         string            `json:"name"`
	GenerateName string            `json:"generateName"`
	Labels       map[string]string `json:"labels"`
	Annotations  map[string]string `json:"annotations"`
}

// postedMeta reads the metadata of a request body in JSON or in the API
// server's protobuf encoding (client-go's typed clients send protobuf).
func postedMeta(req *http.Request) (objectMeta, bool) {
	var m struct {
		Metadata objectMeta `json:"metadata"`
	}
	if req.GetBody == nil {
		return m.Metadata, false
	}
	body, err := req.GetBody()
	if err != nil {
		return m.Metadata, false
	}
	defer body.Close()
	switch ct := req.Header.Get("Content-Type"); {
	case strings.HasPrefix(ct, "application/json"):
		if err := json.NewDecoder(body).Decode(&m); err != nil {
			return m.Metadata, false
		}
		return m.Metadata, true
	case strings.HasPrefix(ct, "application/vnd.kubernetes.protobuf"):
		data, err := io.ReadAll(body)
		if err != nil {
			return m.Metadata, false
		}
		return protobufMeta(data)
	}
	return m.Metadata, false
}

// protobufMeta reads the metadata of an object in the API server's
// protobuf encoding: the "k8s\x00" prefix, a runtime.Unknown envelope, and
// the object, whose field 1 is its ObjectMeta (for every API type).
func protobufMeta(data []byte) (objectMeta, bool) {
	var none objectMeta
	magic := []byte("k8s\x00")
	if !bytes.HasPrefix(data, magic) {
		return none, false
	}
	var u runtime.Unknown
	if err := u.Unmarshal(data[len(magic):]); err != nil {
		return none, false
	}
	raw := u.Raw
	for len(raw) > 0 {
		num, typ, n := protowire.ConsumeTag(raw)
		if n < 0 {
			return none, false
		}
		raw = raw[n:]
		if num == 1 && typ == protowire.BytesType {
			v, n := protowire.ConsumeBytes(raw)
			if n < 0 {
				return none, false
			}
			var m metav1.ObjectMeta
			if err := m.Unmarshal(v); err != nil {
				return none, false
			}
			return objectMeta{Name: m.Name, GenerateName: m.GenerateName, Labels: m.Labels, Annotations: m.Annotations}, true
		}
		if n = protowire.ConsumeFieldValue(num, typ, raw); n < 0 {
			return none, false
		}
		raw = raw[n:]
	}
	return none, false
}

// verdict says whether to send the request again, how long at least to wait
// first, and whether the failed attempt may have been carried out.
func verdict(req *http.Request, kind requestKind, resp *http.Response, err error) (wait time.Duration, again, unsure bool) {
	if err != nil {
		if req.Context().Err() != nil {
			return 0, false, false
		}
		if notSent(err) {
			return 0, true, false
		}
		return 0, kind != unsafe, true
	}
	switch code := resp.StatusCode; {
	case code == http.StatusTooManyRequests:
		return retryAfter(resp), true, false
	case code == http.StatusServiceUnavailable && resp.Header.Get("Retry-After") != "":
		// The API server's own "try again later" (shutting down, or a
		// priority level full): not processed.
		return retryAfter(resp), true, false
	case code >= 500 && code != http.StatusNotImplemented && code != http.StatusHTTPVersionNotSupported:
		return retryAfter(resp), kind != unsafe, true
	}
	return 0, false, false
}

// notSent reports an error that happened before the request left: the
// connection was never made.
func notSent(err error) bool {
	var op *net.OpError
	return errors.As(err, &op) && op.Op == "dial"
}

func retryAfter(resp *http.Response) time.Duration {
	s, err := strconv.Atoi(strings.TrimSpace(resp.Header.Get("Retry-After")))
	if err != nil || s <= 0 {
		return 0
	}
	return min(time.Duration(s)*time.Second, DefaultPolicy.MaxRetryAfter)
}

// madeByEarlierAttempt answers a create whose retry found the object
// already there: if the object carries the labels and annotations the
// create sent, an earlier attempt made it and the object is the create's
// answer (201); otherwise the conflict stands.
func (t *Transport) madeByEarlierAttempt(req *http.Request, conflict *http.Response) (*http.Response, error) {
	sent, _ := postedMeta(req)
	get, err := http.NewRequestWithContext(req.Context(), http.MethodGet, strings.TrimSuffix(req.URL.Path, "/")+"/"+sent.Name, nil)
	if err != nil {
		return conflict, nil
	}
	get.URL.Scheme, get.URL.Host, get.Host = req.URL.Scheme, req.URL.Host, req.Host
	get.Header = req.Header.Clone()
	get.Header.Del("Content-Type")
	// Read as JSON (to compare); client-go decodes a JSON answer whatever
	// it asked for.
	get.Header.Set("Accept", "application/json")
	resp, err := t.Next.RoundTrip(get)
	if err != nil || resp.StatusCode != http.StatusOK {
		if resp != nil {
			resp.Body.Close()
		}
		return conflict, nil
	}
	data, err := io.ReadAll(io.LimitReader(resp.Body, 64<<20))
	resp.Body.Close()
	var live struct {
		Metadata objectMeta `json:"metadata"`
	}
	if err != nil || json.Unmarshal(data, &live) != nil || !sameMap(live.Metadata.Labels, sent.Labels) || !sameMap(live.Metadata.Annotations, sent.Annotations) {
		return conflict, nil
	}
	_, _ = io.Copy(io.Discard, conflict.Body)
	conflict.Body.Close()
	resp.StatusCode, resp.Status = http.StatusCreated, "201 Created"
	resp.Body = io.NopCloser(bytes.NewReader(data))
	resp.ContentLength = int64(len(data))
	resp.Header.Del("Content-Length")
	return resp, nil
}

func sameMap(a, b map[string]string) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if w, ok := b[k]; !ok || w != v {
			return false
		}
	}
	return true
}

func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// Transient reports whether err says "try again" rather than "this cannot
// work": throttling, a server error or timeout, a broken connection, a
// conflict with a concurrent writer. It looks through wrapped errors
// (Helm joins and wraps the errors of its requests).
func Transient(err error) bool {
	if err == nil {
		return false
	}
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return false // the action's own time ran out: not the server's doing
	}
	if apierrors.IsTooManyRequests(err) || apierrors.IsInternalError(err) || apierrors.IsServerTimeout(err) ||
		apierrors.IsServiceUnavailable(err) || apierrors.IsTimeout(err) || apierrors.IsConflict(err) {
		return true
	}
	var status apierrors.APIStatus
	if errors.As(err, &status) {
		code := status.Status().Code
		return code == http.StatusBadGateway || code == http.StatusGatewayTimeout || code == http.StatusInternalServerError
	}
	var netErr net.Error
	if errors.As(err, &netErr) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, io.EOF) || errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.ECONNREFUSED) {
		return true
	}
	msg := err.Error()
	for _, s := range []string{"connection refused", "connection reset", "http2: client connection lost", "i/o timeout", "TLS handshake timeout", "unexpected EOF", "the server has received too many requests", "etcdserver: request timed out", "the object has been modified"} {
		if strings.Contains(msg, s) {
			return true
		}
	}
	return false
}
