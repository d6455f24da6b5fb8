package release

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"

	"github.com/chartpilot/chartpilot/internal/values"
)

// shown is the form of a values digest that status, history and failures
// carry: an HMAC of it under DigestKey, as long as the digest itself. The
// plain digest stays on the release records (Secrets, which hold the
// values themselves) where the fast path compares it.
func (r *Reconciler) shown(digest string) string {
	if digest == "" {
		return ""
	}
	mac := hmac.New(sha256.New, r.digestKey())
	mac.Write([]byte("chartpilot values digest\x00"))
	mac.Write([]byte(digest))
	return hex.EncodeToString(mac.Sum(nil))[:values.DigestLength]
}

func (r *Reconciler) digestKey() []byte {
	r.keyOnce.Do(func() {
		if len(r.DigestKey) == 0 {
			r.DigestKey = make([]byte, 32)
			_, _ = rand.Read(r.DigestKey)
		}
	})
	return r.DigestKey
}
