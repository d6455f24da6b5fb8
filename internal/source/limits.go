package source

import (
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"regexp"
	"strings"

	"github.com/chartpilot/chartpilot/internal/redact"
)

// Default download limits.
const (
	DefaultMaxIndexSize   = 32 << 20
	DefaultMaxArchiveSize = 20 << 20
)

// ErrTooLarge is a download that went over its limit: it is cut off there.
var ErrTooLarge = errors.New("download over its size limit")

// limitedTransport cuts every response body off after max bytes (an error
// for the reader, never more memory).
type limitedTransport struct {
	http.RoundTripper
	max int64
}

func (t limitedTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, err := t.RoundTripper.RoundTrip(req)
	if err != nil || resp.Body == nil {
		return resp, err
	}
	if resp.ContentLength > t.max {
		_ = resp.Body.Close()
		return nil, fmt.Errorf("%w: %s announces %d bytes, the limit is %d", ErrTooLarge, redact.URL(req.URL.String()), resp.ContentLength, t.max)
	}
	resp.Body = &limitedBody{r: resp.Body, left: t.max, url: redact.URL(req.URL.String()), max: t.max}
	return resp, nil
}

type limitedBody struct {
	r    io.ReadCloser
	left int64
	max  int64
	url  string
}

func (b *limitedBody) Read(p []byte) (int, error) {
	if b.left <= 0 {
		// One byte more tells a body of exactly max bytes from a longer one.
		var one [1]byte
		if n, _ := b.r.Read(one[:]); n > 0 {
			return 0, fmt.Errorf("%w: %s is larger than %d bytes", ErrTooLarge, b.url, b.max)
		}
		return 0, io.EOF
	}
	if int64(len(p)) > b.left {
		p = p[:b.left]
	}
	n, err := b.r.Read(p)
	b.left -= int64(n)
	return n, err
}

func (b *limitedBody) Close() error { return b.r.Close() }

// hexDigest is a sha256 digest as a repository index states it.
var hexDigest = regexp.MustCompile(`^[a-f0-9]{64}$`)

// validDigest reports whether a digest from a remote list may name a file.
func validDigest(d string) bool { return d == "" || hexDigest.MatchString(strings.ToLower(d)) }

// sameHost reports whether u (absolute) is on the repository's own scheme
// and host: an index may not send chartpilot elsewhere (another server, the
// cloud's metadata address).
func sameHost(repoURL, u string) bool {
	r, err1 := url.Parse(repoURL)
	c, err2 := url.Parse(u)
	return err1 == nil && err2 == nil && strings.EqualFold(r.Scheme, c.Scheme) && strings.EqualFold(r.Host, c.Host)
}
