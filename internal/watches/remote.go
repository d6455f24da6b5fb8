package watches

import (
	"errors"
	"fmt"
	"net"
	"net/url"
	"regexp"
	"strings"
	"time"

	"github.com/Masterminds/semver/v3"
	"github.com/chartpilot/chartpilot/internal/redact"
	"k8s.io/apimachinery/pkg/util/validation"
)

var chartNamePattern = regexp.MustCompile(`^[a-z0-9]([-a-z0-9_.]*[a-z0-9])?$`)

func validateRemote(e *remoteEntry) (*RemoteChart, error) {
	rc := &RemoteChart{Repo: strings.TrimSuffix(e.Repo, "/"), Name: e.Name, Version: e.Version, SecretRef: e.SecretRef, PlainHTTP: e.PlainHTTP, AllowedHosts: e.AllowedHosts, Interval: DefaultChartInterval}
	u, err := url.Parse(e.Repo)
	switch {
	case e.Repo == "":
		return nil, errors.New("field chart.repo: required: https://… (a chart repository) or oci://host/path (an OCI registry)")
	case err != nil || u.Host == "" || (u.Scheme != "https" && u.Scheme != "http" && u.Scheme != "oci"):
		return nil, fmt.Errorf("field chart.repo: %q is not an https://, http:// or oci:// URL with a host", redact.URL(e.Repo))
	case u.User != nil:
		return nil, errors.New("field chart.repo: credentials in the URL are not accepted (they would show in logs): put them in a Secret and name it in chart.secretRef")
	case e.PlainHTTP && u.Scheme != "oci":
		return nil, errors.New("field chart.plainHTTP: applies to oci:// registries only; write http:// in chart.repo for a plain-HTTP chart repository")
	case e.PlainHTTP && !e.AllowInsecure && !loopbackHost(u.Host):
		return nil, fmt.Errorf("field chart.plainHTTP: %s is not a loopback host: credentials and charts would cross the network unencrypted; use TLS, or set chart.allowInsecure: true", u.Host)
	}
	if !chartNamePattern.MatchString(e.Name) {
		return nil, fmt.Errorf("field chart.name: %q is not a chart name (lower case letters, digits, dashes)", e.Name)
	}
	if e.Version != "" {
		if _, err := semver.NewConstraint(e.Version); err != nil {
			return nil, fmt.Errorf("field chart.version: %q is not a semver constraint (%w): write e.g. \"~1.4\" or \">=1.0.0, <2\"", e.Version, err)
		}
	}
	if r := e.SecretRef; r != nil {
		if len(validation.IsDNS1123Label(r.Namespace)) > 0 || len(validation.IsDNS1123Subdomain(r.Name)) > 0 {
			return nil, fmt.Errorf("field chart.secretRef: namespace %q and name %q must both be set to a Secret's namespace and name", r.Namespace, r.Name)
		}
	}
	if e.Interval != "" {
		d, err := time.ParseDuration(e.Interval)
		if err != nil || d < 10*time.Second {
			return nil, fmt.Errorf("field chart.interval: %q is not a duration of at least 10s, e.g. 5m", e.Interval)
		}
		rc.Interval = d
	}
	return rc, nil
}

// loopbackHost reports whether host (with or without port) is localhost or
// a loopback address.
func loopbackHost(hostport string) bool {
	host := hostport
	if h, _, err := net.SplitHostPort(hostport); err == nil {
		host = h
	}
	ip := net.ParseIP(strings.Trim(host, "[]"))
	return strings.EqualFold(host, "localhost") || (ip != nil && ip.IsLoopback())
}
