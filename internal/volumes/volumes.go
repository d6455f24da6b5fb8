// Package volumes holds the rules about persistent volumes that more than
// one part of chartpilot applies: admission refuses a change the volumes
// cannot follow, and the release reconciler stalls on one that reaches it
// anyway (a passthrough kind's values, a class changed since). Both say
// the same thing because both ask here.
package volumes

import (
	"fmt"

	storagev1 "k8s.io/api/storage/v1"
)

// Refusal says why volumes cannot grow, and what would let them (Fix is
// empty when only keeping the size does).
type Refusal struct {
	Why, Fix string
}

// CheckExpansion is the rule for growing a claim of StorageClass class,
// as read (sc nil: no such class): nil when it may grow.
func CheckExpansion(class string, sc *storagev1.StorageClass) *Refusal {
	switch {
	case class == "":
		return &Refusal{Why: "the claim has no StorageClass"}
	case sc == nil:
		return &Refusal{Why: fmt.Sprintf("StorageClass %q does not exist", class)}
	case sc.AllowVolumeExpansion == nil || !*sc.AllowVolumeExpansion:
		return &Refusal{
			Why: fmt.Sprintf("StorageClass %q does not allow it (allowVolumeExpansion is not true)", class),
			Fix: fmt.Sprintf("an administrator sets allowVolumeExpansion: true on StorageClass %q", class),
		}
	}
	return nil
}

// Message is the refusal as one sentence: what needs volume expansion,
// why it cannot have it, and what to do, ending with keeping the size.
func (r *Refusal) Message(what, keep string) string {
	fix := keep
	if r.Fix != "" {
		fix = r.Fix + ", or " + keep
	}
	return fmt.Sprintf("%s needs volume expansion, and %s: %s", what, r.Why, fix)
}
