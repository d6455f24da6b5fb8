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
// process per request, at most Parallel at once (the rest wait), each
// bounded by the request's context.
type StoreHelper struct {
	// Path is the helper binary (a chartpilot built with the object
	// stores' clients); it is run as `Path store`.
	Path string
	sem  chan struct{}
}

// DefaultHelperParallel bounds the helper processes running at once (as
// many as one controller has workers: a store that does not answer holds
// one for up to a check's 30 s).
const DefaultHelperParallel = 4

// NewStoreHelper runs the helper at path.
func NewStoreHelper(path string) *StoreHelper {
	return &StoreHelper{Path: path, sem: make(chan struct{}, DefaultHelperParallel)}
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

// Do runs one request. An error means the helper did not answer (not
// found, killed at the context's end, an answer that is not JSON); its
// message is scrubbed of the request's credentials.
func (h *StoreHelper) Do(ctx context.Context, req StoreRequest) (StoreReply, error) {
	if h == nil || h.Path == "" {
		return StoreReply{}, errors.New("no store helper is configured (--store-helper)")
	}
	if h.sem != nil {
		select {
		case h.sem <- struct{}{}:
			defer func() { <-h.sem }()
		case <-ctx.Done():
			return StoreReply{}, fmt.Errorf("waiting for a store helper: %w", ctx.Err())
		}
	}
	in, err := json.Marshal(req)
	if err != nil {
		return StoreReply{}, err
	}
	var out, stderr bytes.Buffer
	cmd := exec.CommandContext(ctx, h.Path, "store")
	cmd.Stdin, cmd.Stdout, cmd.Stderr = bytes.NewReader(in), &out, &limited{w: &stderr, n: 2048}
	cmd.WaitDelay = 5 * time.Second
	runErr := cmd.Run()
	var reply StoreReply
	if err := json.Unmarshal(out.Bytes(), &reply); err != nil || !reply.Done {
		why := strings.TrimSpace(stderr.String())
		if runErr != nil {
			why = strings.TrimSpace(runErr.Error() + ": " + why)
		}
		return StoreReply{}, fmt.Errorf("the store helper %s gave no answer: %s", h.Path, Scrub(errors.New(why), req.Secrets()...))
	}
	// The helper scrubs its messages; scrubbed again here, so that a
	// helper of another version cannot leak what it was given.
	reply.Invalid = scrubText(reply.Invalid, req.Secrets())
	reply.Failed = scrubText(reply.Failed, req.Secrets())
	return reply, nil
}

func scrubText(msg string, secrets []string) string {
	if msg == "" {
		return ""
	}
	return Scrub(errors.New(msg), secrets...)
}

// limited keeps the first n bytes written to it.
type limited struct {
	w *bytes.Buffer
	n int
}

func (l *limited) Write(p []byte) (int, error) {
	if room := l.n - l.w.Len(); room > 0 {
		if len(p) > room {
			l.w.Write(p[:room])
		} else {
			l.w.Write(p)
		}
	}
	return len(p), nil
}
