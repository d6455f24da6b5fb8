// Package redact keeps credentials out of the messages chartpilot writes to
// status, events and logs.
package redact

import (
	"errors"
	"net/url"
	"regexp"
)

// URL drops the user information (user name and password) from a URL. A
// string that does not parse as a URL is not repeated at all: it may hold
// the credentials in a form the parser did not recognise.
func URL(u string) string {
	pu, err := url.Parse(u)
	if err != nil {
		return "(unparseable URL)"
	}
	pu.User = nil
	return pu.String()
}

// Values quoted by Helm's schema validator ("at '/path': 'value' does not
// match ...") and by the API server's field errors ("Invalid value: \"x\":",
// "Unsupported value: ...", "Duplicate value: ..."), and credentials in
// URLs. The field path stays, so a message still names the field and the fix.
var (
	schemaValue = regexp.MustCompile(`(at '[^']*': )'(?:[^'\\]|\\.)*'`)
	apiValue    = regexp.MustCompile(`((?:Invalid|Unsupported|Duplicate|Forbidden) value: )(?:"(?:[^"\\]|\\.)*"|[^:\s][^:]*?)(: |$)`)
	urlUserInfo = regexp.MustCompile(`://[^/@\s]+@`)
)

// Redacted stands where a value was.
const Redacted = "<redacted>"

// Text removes from a message the values that input was rejected for
// (which may be secrets) and credentials in URLs.
func Text(s string) string {
	s = schemaValue.ReplaceAllString(s, "${1}"+Redacted)
	s = apiValue.ReplaceAllString(s, "${1}"+Redacted+"${2}")
	return urlUserInfo.ReplaceAllString(s, "://")
}

// Error is err with its message redacted (nil stays nil).
func Error(err error) error {
	if err == nil {
		return nil
	}
	return errors.New(Text(err.Error()))
}
