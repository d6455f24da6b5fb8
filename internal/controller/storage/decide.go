// Package storage grows a resource's data volumes before they fill up:
// it reads each volume's fullness from the kubelets' statistics (through
// the API server's node proxy), and above the threshold raises the
// resource's storage size by one step, never above the maximum nor beyond
// a tenant's limits, at most once per window. The release reconciler's
// in-place growth does the rest.
package storage

import (
	"fmt"
	"strconv"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/chartpilot/chartpilot/internal/api/v1alpha1"
)

// Defaults of StorageAutoExpand.
const (
	DefaultThresholdPercent = 80
	DefaultStep             = "25%"
	DefaultWindow           = 10 * time.Minute
)

// minStep is the least a step grows a volume by.
var minStep = resource.MustParse("1Gi")

// settings are a StorageAutoExpand with its defaults, parsed.
type settings struct {
	threshold int32
	// stepPercent or stepSize (exactly one is set).
	stepPercent int64
	stepSize    resource.Quantity
	max         resource.Quantity
	window      time.Duration
}

// parseSettings checks a StorageAutoExpand; field prefixes messages.
func parseSettings(a *v1alpha1.StorageAutoExpand, field string) (settings, error) {
	s := settings{threshold: a.ThresholdPercent, window: DefaultWindow}
	if s.threshold == 0 {
		s.threshold = DefaultThresholdPercent
	}
	if s.threshold < 50 || s.threshold > 99 {
		return s, fmt.Errorf("%s: threshold %d must be from 50 to 99 (percent used)", field, s.threshold)
	}
	if a.Window != nil && a.Window.Duration > 0 {
		s.window = a.Window.Duration
	}
	step := a.Step
	if step == "" {
		step = DefaultStep
	}
	if p, ok := strings.CutSuffix(step, "%"); ok {
		n, err := strconv.ParseInt(p, 10, 64)
		if err != nil || n < 1 || n > 99 {
			return s, fmt.Errorf("%s: step %q must be a percentage from 1%% to 99%% or a quantity such as 5Gi", field, step)
		}
		s.stepPercent = n
	} else {
		q, err := resource.ParseQuantity(step)
		if err != nil || q.Sign() <= 0 {
			return s, fmt.Errorf("%s: step %q must be a percentage such as 25%% or a quantity such as 5Gi", field, step)
		}
		s.stepSize = q
	}
	if a.Max == "" {
		return s, fmt.Errorf("%s: max is required: the largest size the volumes may grow to", field)
	}
	q, err := resource.ParseQuantity(a.Max)
	if err != nil || q.Sign() <= 0 {
		return s, fmt.Errorf("%s: max %q must be a quantity such as 20Gi", field, a.Max)
	}
	s.max = q
	return s, nil
}

// nextSize is size grown by one step (at least minStep), rounded up to a
// whole MiB, and never above max.
func (s settings) nextSize(size resource.Quantity) resource.Quantity {
	step := s.stepSize.Value()
	if s.stepPercent > 0 {
		step = size.Value() * s.stepPercent / 100
	}
	step = max(step, minStep.Value())
	const mi = 1 << 20
	next := (size.Value() + step + mi - 1) / mi * mi
	next = min(next, s.max.Value())
	return *resource.NewQuantity(next, resource.BinarySI)
}

// verdict is what one check decides.
type verdict struct {
	grow bool
	to   resource.Quantity
	// condition of StorageAutoExpand.
	status         bool
	reason, msg    string
	recheck        time.Duration
	warn, announce bool
}

// decide is the step a check takes, from the size asked for, the fullest
// volume's use and the last growth.
func decide(s settings, size resource.Quantity, fullest string, used int32, last *v1alpha1.StorageExpansion, now time.Time, interval time.Duration) verdict {
	watching := fmt.Sprintf("the fullest volume (%s) is %d%% used; the size grows by %s above %d%%, up to %s", fullest, used, s.describeStep(), s.threshold, s.max.String())
	if used < s.threshold {
		return verdict{status: true, reason: "Watching", msg: watching, recheck: interval}
	}
	if size.Cmp(s.max) >= 0 {
		return verdict{reason: "AtMaximum", warn: true, recheck: interval,
			msg: fmt.Sprintf("%s is %d%% used (threshold %d%%) and the size %s is at its maximum %s: raise the maximum, or free space", fullest, used, s.threshold, size.String(), s.max.String())}
	}
	if last != nil {
		if next := last.At.Add(s.window); now.Before(next) {
			return verdict{status: true, reason: "Waiting", recheck: min(next.Sub(now), interval),
				msg: fmt.Sprintf("%s is %d%% used; the last growth (%s → %s) was at %s, and the next may follow after %s", fullest, used, last.From, last.To, last.At.UTC().Format(time.RFC3339), next.UTC().Format(time.RFC3339))}
		}
	}
	to := s.nextSize(size)
	return verdict{grow: true, to: to, status: true, reason: "Expanded", announce: true, recheck: interval,
		msg: fmt.Sprintf("%s was %d%% used (threshold %d%%): the size grows %s → %s (maximum %s)", fullest, used, s.threshold, size.String(), to.String(), s.max.String())}
}

func (s settings) describeStep() string {
	if s.stepPercent > 0 {
		return fmt.Sprintf("%d%% (at least %s)", s.stepPercent, minStep.String())
	}
	return s.stepSize.String()
}
