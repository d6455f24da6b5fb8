package policy

import (
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/Masterminds/semver/v3"

	"github.com/chartpilot/chartpilot/internal/api/v1alpha1"
)

// Reasons a Choice holds a release back.
const (
	ReasonMajorUpgrade = "MajorUpgradeBlocked"
	ReasonDowngrade    = "DowngradeRefused"
)

// Policy is what decides a resource's chart version.
type Policy struct {
	// Chart names the chart, for messages.
	Chart string
	// Watch is the watches.yaml constraint ("" for any).
	Watch string
	// Resource is the resource's own constraint (spec.chartVersion or the
	// chartpilot.dev/chart-version annotation; "" for any), and Field names
	// where it came from, for messages.
	Resource, Field string
	// Deployed is the chart version deployed now ("" when nothing is).
	Deployed string
	// AllowMajor are the major versions the resource opted in to
	// (annotation chartpilot.dev/allow-major-upgrade).
	AllowMajor []uint64
	// AllowDowngrade is the exact version a downgrade to is allowed
	// (annotation chartpilot.dev/allow-downgrade).
	AllowDowngrade string
}

// Choice is the outcome of Choose.
type Choice struct {
	// Version is the version to deploy; "" when none may be deployed
	// (Blocked says why, and the release stays as it is).
	Version string
	// Desired is the highest version satisfying both constraints.
	Desired string
	// AvailableUpgrade is the highest version the watch allows that is
	// above Version ("" when Version is the highest).
	AvailableUpgrade string
	// Blocked is a reason (ReasonMajorUpgrade, ReasonDowngrade) when policy
	// holds the release below or above Desired; Message says how to proceed.
	Blocked, Message string
}

// ParseMajors reads the allow-major-upgrade annotation: one major version
// or a comma-separated list ("2" or "2,16").
func ParseMajors(s string) ([]uint64, error) {
	var out []uint64
	for _, f := range strings.Split(s, ",") {
		f = strings.TrimSpace(f)
		if f == "" {
			continue
		}
		n, err := strconv.ParseUint(f, 10, 64)
		if err != nil {
			return nil, fmt.Errorf("annotation %s: %q is not a major version number: write the target major, e.g. \"2\"", v1alpha1.AnnotationAllowMajorUpgrade, f)
		}
		out = append(out, n)
	}
	return out, nil
}

// Choose picks the version for a resource among versions (any order):
// the highest satisfying the watch's and the resource's constraints, unless
// that is a major upgrade the resource has not opted in to (then the
// highest within the allowed majors) or a downgrade not allowed exactly
// (then the deployed version is kept). Fresh installs take the highest.
func Choose(versions []string, p Policy) (Choice, error) {
	var watchC, resC *semver.Constraints
	var err error
	if p.Watch != "" {
		if watchC, err = semver.NewConstraint(p.Watch); err != nil {
			return Choice{}, fmt.Errorf("watches.yaml chart.version %q: %w", p.Watch, err)
		}
	}
	if p.Resource != "" {
		if resC, err = semver.NewConstraint(p.Resource); err != nil {
			return Choice{}, fmt.Errorf("%s %q is not a semver constraint (%w): write e.g. \"~1.4\" or \">=1.2, <2\"", p.Field, p.Resource, err)
		}
	}
	all := parseSorted(versions)
	var allowedByWatch, sat []*semver.Version
	for _, v := range all {
		if watchC == nil || watchC.Check(v) {
			allowedByWatch = append(allowedByWatch, v)
			if resC == nil || resC.Check(v) {
				sat = append(sat, v)
			}
		}
	}
	if len(sat) == 0 {
		return Choice{}, fmt.Errorf("no version of chart %s satisfies %s (known: %s): change %s", p.Chart, describeConstraints(p), listTop(all), p.changeWhat())
	}
	desired := sat[0]
	c := Choice{Desired: desired.Original()}
	var pick *semver.Version
	if p.Deployed == "" {
		pick = desired
	} else {
		dv, err := semver.NewVersion(p.Deployed)
		if err != nil {
			// An unparseable deployed version cannot be compared: take the highest.
			pick = desired
		} else {
			pick = choose(sat, dv, p, &c)
		}
	}
	// availableUpgrade is relative to what stays deployed.
	base := pick
	if pick != nil {
		c.Version = pick.Original()
	} else {
		base, _ = semver.NewVersion(p.Deployed)
	}
	if top := allowedByWatch[0]; base != nil && top.GreaterThan(base) {
		c.AvailableUpgrade = top.Original()
	}
	return c, nil
}

func choose(sat []*semver.Version, dv *semver.Version, p Policy, c *Choice) *semver.Version {
	desired := sat[0]
	allowedMajor := func(m uint64) bool { return m == dv.Major() || slices.Contains(p.AllowMajor, m) }
	for _, v := range sat {
		switch {
		case v.LessThan(dv) && v.Original() != p.AllowDowngrade:
			// Everything from here on is a refused downgrade.
			if v == desired {
				c.Blocked = ReasonDowngrade
				c.Message = fmt.Sprintf("%s selects chart %s %s, below the deployed %s: downgrades are refused; set annotation %s: %q to downgrade, or change the constraint", describeConstraints(p), p.Chart, v.Original(), dv.Original(), v1alpha1.AnnotationAllowDowngrade, v.Original())
			}
			return keepDeployed(sat, dv)
		case v.Major() > dv.Major() && !allowedMajor(v.Major()):
			if c.Blocked == "" {
				c.Blocked = ReasonMajorUpgrade
				c.Message = fmt.Sprintf("chart %s %s is available but is a major upgrade from %s: set annotation %s: \"%d\" to upgrade", p.Chart, v.Original(), dv.Original(), v1alpha1.AnnotationAllowMajorUpgrade, v.Major())
			}
			continue
		default:
			return v
		}
	}
	return keepDeployed(sat, dv)
}

// keepDeployed returns the deployed version if the constraints still allow
// it, else nil (nothing may be deployed: the release stays as it is).
func keepDeployed(sat []*semver.Version, dv *semver.Version) *semver.Version {
	for _, v := range sat {
		if v.Equal(dv) {
			return v
		}
	}
	return nil
}

func parseSorted(versions []string) []*semver.Version {
	var out []*semver.Version
	for _, s := range versions {
		if v, err := semver.NewVersion(s); err == nil {
			out = append(out, v)
		}
	}
	slices.SortStableFunc(out, func(a, b *semver.Version) int { return b.Compare(a) })
	return out
}

func describeConstraints(p Policy) string {
	var parts []string
	if p.Watch != "" {
		parts = append(parts, fmt.Sprintf("the watch's constraint %q", p.Watch))
	}
	if p.Resource != "" {
		parts = append(parts, fmt.Sprintf("%s %q", p.Field, p.Resource))
	}
	if len(parts) == 0 {
		return "any version"
	}
	return strings.Join(parts, " and ")
}

func (p Policy) changeWhat() string {
	if p.Resource != "" {
		return p.Field
	}
	return "the watch's chart.version or publish a matching version"
}

func listTop(vs []*semver.Version) string {
	if len(vs) == 0 {
		return "none"
	}
	var out []string
	for i, v := range vs {
		if i == 8 {
			out = append(out, fmt.Sprintf("and %d more", len(vs)-8))
			break
		}
		out = append(out, v.Original())
	}
	return strings.Join(out, ", ")
}
