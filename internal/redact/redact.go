// Package redact keeps credentials out of the messages chartpilot writes to
// status, events and logs.
package redact

import "net/url"

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
