// Package redact keeps credentials out of the messages chartpilot writes to
// status, events and logs.
package redact

import (
	"errors"
	"net/url"
	"regexp"
	"strings"
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
	apiValue    = regexp.MustCompile(`((?:Invalid|Unsupported|Duplicate|Forbidden) value: )(?:"(?:[^"\\]|\\.)*"|\S.*?)(: |$)`)
	urlUserInfo = regexp.MustCompile(`://[^/@\s]+@`)
)

// Redacted stands where a value was.
const Redacted = "<redacted>"

// number is a value kept as it is: a number says what was wrong (a port
// out of range) and is not a secret.
var number = regexp.MustCompile(`^-?[0-9]+(\.[0-9]+)?$`)

// Text removes from a message the values that input was rejected for
// (which may be secrets; numbers are kept) and credentials in URLs.
func Text(s string) string {
	s = schemaValue.ReplaceAllString(s, "${1}"+Redacted)
	s = apiValue.ReplaceAllStringFunc(s, func(m string) string {
		sub := apiValue.FindStringSubmatch(m)
		value := strings.TrimSuffix(strings.TrimPrefix(m, sub[1]), sub[2])
		if number.MatchString(value) {
			return m
		}
		return sub[1] + Redacted + sub[2]
	})
	return urlUserInfo.ReplaceAllString(s, "://")
}

// Error is err with its message redacted (nil stays nil).
func Error(err error) error {
	if err == nil {
		return nil
	}
	return errors.New(Text(err.Error()))
}
