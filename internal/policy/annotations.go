package policy

import (
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/Masterminds/semver/v3"

	"github.com/chartpilot/chartpilot/internal/api/v1alpha1"
)

// ReasonAppMajor: the resource asks for another major version of the
// software it names; nothing is changed until it opts in.
const ReasonAppMajor = "MajorVersionChangeBlocked"

// AppMajor applies the major-version rule to the software version a kind
// names (PostgreSQL's spec.version): a change of major is a major upgrade,
// a lower major a downgrade. It returns a reason and a message when the
// change must wait, or two empty strings.
func AppMajor(have, want string, allow []uint64, allowDowngrade string) (string, string) {
	if have == "" || want == "" || have == want {
		return "", ""
	}
	h, err1 := strconv.ParseUint(have, 10, 64)
	w, err2 := strconv.ParseUint(want, 10, 64)
	if err1 != nil || err2 != nil {
		return "", ""
	}
	if w > h && !slices.Contains(allow, w) {
		return ReasonAppMajor, fmt.Sprintf("spec.version asks for major version %d but %d runs: a major upgrade is not done on its own; take a backup, then set annotation %s: \"%d\"", w, h, v1alpha1.AnnotationAllowMajorUpgrade, w)
	}
	if w < h && allowDowngrade != want {
		return ReasonDowngrade, fmt.Sprintf("spec.version asks for major version %d but %d runs: downgrades are refused (data written by %d may not be readable by %d); set spec.version back, or annotation %s: %q", w, h, h, w, v1alpha1.AnnotationAllowDowngrade, want)
	}
	return "", ""
}

// ValidateAnnotations checks the version and rollout annotations of a
// resource (admission runs it; the reconciler reports the same errors on
// the resource's conditions). All errors are given on one line.
func ValidateAnnotations(ann map[string]string) error {
	var errs []error
	if _, err := ParseMajors(ann[v1alpha1.AnnotationAllowMajorUpgrade]); err != nil {
		errs = append(errs, err)
	}
	if c := ann[v1alpha1.AnnotationChartVersion]; c != "" {
		if _, err := semver.NewConstraint(c); err != nil {
			errs = append(errs, fmt.Errorf("annotation %s: %q is not a semver constraint (%w): write e.g. \"~1.4\" or \">=1.2, <2\"", v1alpha1.AnnotationChartVersion, c, err))
		}
	}
	if w := ann[v1alpha1.AnnotationMaintenanceWindow]; w != "" {
		if _, err := ParseWindows(w); err != nil {
			errs = append(errs, fmt.Errorf("annotation %s: %w", v1alpha1.AnnotationMaintenanceWindow, err))
		}
	}
	if len(errs) == 0 {
		return nil
	}
	msgs := make([]string, len(errs))
	for i, err := range errs {
		msgs[i] = err.Error()
	}
	return errors.New(strings.Join(msgs, "; "))
}
