package backup

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/chartpilot/chartpilot/internal/redact"
)

// StoreRequest is one request of the manager to the store helper
// (`chartpilot store`), written to the helper's standard input: it holds
// the store's credentials, which never go on a command line or into the
// environment.
type StoreRequest struct {
	// Op is "probe" (write, read back and delete a random object) or
	// "manifest" (read the manifest of the backup at Location).
	Op       string `json:"op"`
	S3       *S3    `json:"s3,omitempty"`
	Azure    *Azure `json:"azure,omitempty"`
	GCS      *GCS   `json:"gcs,omitempty"`
	Location string `json:"location,omitempty"`
	// TimeoutMillis is how long the helper may work on the request before
	// it answers that the store did not answer in time; Do sets it a
	// little under its own limit, so that a slow store is reported as
	// such rather than as a helper that was killed.
	TimeoutMillis int64 `json:"timeoutMillis,omitempty"`
}

// Secrets are the credentials in r, scrubbed from every message about it.
func (r StoreRequest) Secrets() []string {
	switch {
	case r.S3 != nil:
		return []string{r.S3.SecretAccessKey, r.S3.AccessKeyID}
	case r.Azure != nil:
		return []string{r.Azure.AccountKey}
	case r.GCS != nil:
		return []string{r.GCS.ServiceAccountKey}
	}
	return nil
}

// StoreReply is the helper's answer, one JSON object on its standard
// output. Its messages are scrubbed of the request's credentials.
type StoreReply struct {
	// Done is set by every answer: an output without it is no answer.
	Done bool `json:"done"`
	// Invalid says why the store could not be opened (its settings).
	Invalid string `json:"invalid,omitempty"`
	// Failed says why the operation failed.
	Failed   string    `json:"failed,omitempty"`
	Manifest *Manifest `json:"manifest,omitempty"`
}

// Scrub is err's message (redacted) without any of secrets.
func Scrub(err error, secrets ...string) string {
	msg := redact.Error(err).Error()
	for _, s := range secrets {
		if len(s) >= 4 {
			msg = strings.ReplaceAll(msg, s, "[redacted]")
		}
	}
	return msg
}

// StoreHelper runs the store helper for the manager: one short-lived
// process per request, each bounded by Timeout from its start.
//
// Stores are named by tenants, and a tenant's store may be slow or
// hostile: at most PerNamespace helpers run for one namespace and at most
// Parallel in all. A request that finds no free slot is not queued behind
// another tenant's slow store: Do answers ErrBusy at once, and the caller
// looks again shortly (waiting is not failing).
//
// The helper process gets an empty environment (no credentials, proxies
// or cluster addresses of the manager's), a working directory of its own
// that is removed after it, and its answer is read within MaxReply bytes.
type StoreHelper struct {
	// Path is the helper binary (a chartpilot built with the object
	// stores' clients); it is run as `Path store`.
	Path string
	// Parallel and PerNamespace bound the helpers running at once, in all
	// and for one namespace (DefaultHelperParallel, DefaultHelperPerNamespace).
	Parallel, PerNamespace int
	// Timeout bounds one run, from its start (DefaultHelperTimeout).
	Timeout time.Duration

	mu      sync.Mutex
	running int
	perNS   map[string]int
}

// DefaultHelperParallel bounds the helper processes running at once.
const DefaultHelperParallel = 4

// DefaultHelperPerNamespace bounds the helper processes running at once
// for one namespace's stores: a namespace's slow stores hold one slot.
const DefaultHelperPerNamespace = 1

// DefaultHelperTimeout bounds one run of the helper.
const DefaultHelperTimeout = 30 * time.Second

// MaxReply bounds the helper's answer (a manifest is at most
// MaxManifestSize; an answer is well under that).
const MaxReply = MaxManifestSize + 16<<10

// ErrBusy is Do's answer when every slot the request could take is in use.
var ErrBusy = errors.New("the store helper is busy")

// NewStoreHelper runs the helper at path.
func NewStoreHelper(path string) *StoreHelper {
	return &StoreHelper{Path: path}
}

// DefaultHelperPath is chartpilot beside the running executable (the
// image holds both), else chartpilot on $PATH.
func DefaultHelperPath() string {
	if exe, err := os.Executable(); err == nil {
		p := filepath.Join(filepath.Dir(exe), "chartpilot")
		if fi, err := os.Stat(p); err == nil && !fi.IsDir() {
			return p
		}
	}
	if p, err := exec.LookPath("chartpilot"); err == nil {
		return p
	}
	return "chartpilot"
}

// take claims a slot for namespace; false when none is free.
func (h *StoreHelper) take(namespace string) bool {
	parallel, perNS := h.Parallel, h.PerNamespace
	if parallel <= 0 {
		parallel = DefaultHelperParallel
	}
	if perNS <= 0 {
		perNS = DefaultHelperPerNamespace
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.running >= parallel || h.perNS[namespace] >= perNS {
		return false
	}
	if h.perNS == nil {
		h.perNS = map[string]int{}
	}
	h.running++
	h.perNS[namespace]++
	return true
}

func (h *StoreHelper) give(namespace string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.running--
	if h.perNS[namespace]--; h.perNS[namespace] <= 0 {
		delete(h.perNS, namespace)
	}
}

// Do runs one request for a store of namespace ("" for the admin's
// cluster-wide stores). ErrBusy means no slot was free: nothing ran. Any
// other error means the helper did not answer (not found, killed at its
// timeout, an answer that is not JSON or too large); its message is
// scrubbed of the request's credentials.
func (h *StoreHelper) Do(ctx context.Context, namespace string, req StoreRequest) (StoreReply, error) {
	if h == nil || h.Path == "" {
		return StoreReply{}, errors.New("no store helper is configured (--store-helper)")
	}
	if !h.take(namespace) {
		return StoreReply{}, ErrBusy
	}
	defer h.give(namespace)
	timeout := h.Timeout
	if timeout <= 0 {
		timeout = DefaultHelperTimeout
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	req.TimeoutMillis = max(timeout-timeout/5, timeout-5*time.Second).Milliseconds()
	in, err := json.Marshal(req)
	if err != nil {
		return StoreReply{}, err
	}
	dir, err := os.MkdirTemp("", "chartpilot-store-")
	if err != nil {
		return StoreReply{}, fmt.Errorf("the store helper's directory: %w", err)
	}
	defer os.RemoveAll(dir)
	var out, stderr bytes.Buffer
	stdout := &limited{w: &out, n: MaxReply}
	cmd := exec.CommandContext(ctx, h.Path, "store")
	cmd.Stdin, cmd.Stdout, cmd.Stderr = bytes.NewReader(in), stdout, &limited{w: &stderr, n: 2048}
	cmd.Dir, cmd.Env = dir, helperEnv(dir)
	cmd.WaitDelay = 5 * time.Second
	runErr := cmd.Run()
	if stdout.over {
		return StoreReply{}, fmt.Errorf("the store helper %s answered more than %d bytes", h.Path, MaxReply)
	}
	var reply StoreReply
	if err := json.Unmarshal(out.Bytes(), &reply); err != nil || !reply.Done {
		why := strings.TrimSpace(stderr.String())
		if runErr != nil {
			why = strings.TrimSpace(runErr.Error() + ": " + why)
		}
		return StoreReply{}, fmt.Errorf("the store helper %s gave no answer: %s", h.Path, Scrub(errors.New(why), req.Secrets()...))
	}
	if reply.Manifest != nil {
		if err := reply.Manifest.Validate(); err != nil {
			return StoreReply{}, fmt.Errorf("the store helper %s answered a manifest that is not valid: %w", h.Path, err)
		}
	}
	// The helper scrubs its messages; scrubbed again here, so that a
	// helper of another version cannot leak what it was given.
	reply.Invalid = clipText(scrubText(reply.Invalid, req.Secrets()))
	reply.Failed = clipText(scrubText(reply.Failed, req.Secrets()))
	return reply, nil
}

// helperEnv is the helper's whole environment: its own directory as home
// and for temporary files, and the trust store and proxy settings the
// manager runs with (the admin's, not a tenant's). The cluster's address,
// cloud credentials and everything else of the manager's stay out.
func helperEnv(dir string) []string {
	env := []string{"HOME=" + dir, "TMPDIR=" + dir}
	for _, k := range []string{"SSL_CERT_FILE", "SSL_CERT_DIR", "HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy", "NO_PROXY", "no_proxy"} {
		if v, ok := os.LookupEnv(k); ok {
			env = append(env, k+"="+v)
		}
	}
	return env
}

// clipText cuts a message from the helper to 1 KiB.
func clipText(msg string) string {
	if len(msg) > 1024 {
		return msg[:1024] + "…"
	}
	return msg
}

func scrubText(msg string, secrets []string) string {
	if msg == "" {
		return ""
	}
	return Scrub(errors.New(msg), secrets...)
}

// limited keeps the first n bytes written to it; over says more came.
type limited struct {
	w    *bytes.Buffer
	n    int
	over bool
}

func (l *limited) Write(p []byte) (int, error) {
	room := l.n - l.w.Len()
	if len(p) > room {
		l.over = true
	}
	if room > 0 {
		if len(p) > room {
			l.w.Write(p[:room])
		} else {
			l.w.Write(p)
		}
	}
	return len(p), nil
}
