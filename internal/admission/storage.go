package admission

import (
	"context"
	"fmt"

	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/chartpilot/chartpilot/internal/kinds"
	"github.com/chartpilot/chartpilot/internal/volumes"
)

// defaultClassAnnotation marks the cluster's default StorageClass.
const defaultClassAnnotation = "storageclass.kubernetes.io/is-default-class"

// checkStorage refuses a spec change of a typed kind's data volume that no
// volume can follow: a move to another StorageClass (naming the default
// class explicitly is no move), or growth on a StorageClass that does not
// allow volume expansion. It returns the denial, "" to admit.
func (h *Handler) checkStorage(ctx context.Context, k kinds.Kind, old, obj *unstructured.Unstructured) (string, error) {
	if k.Storage == nil || h.StorageClasses == nil {
		return "", nil
	}
	was, now := k.Storage(old), k.Storage(obj)
	if was.Class != now.Class {
		def, err := h.defaultClass(ctx)
		if err != nil {
			return "", err
		}
		from, to := orDefault(was.Class, def), orDefault(now.Class, def)
		if from != to {
			return fmt.Sprintf("%s: %s → %s: volumes cannot move to another StorageClass; set it back to %q (another class needs a new resource, restored from a backup)", now.ClassField, className(was.Class, def), className(now.Class, def), from), nil
		}
	}
	before, err1 := resource.ParseQuantity(was.Size)
	after, err2 := resource.ParseQuantity(now.Size)
	if err1 != nil || err2 != nil || after.Cmp(before) <= 0 {
		return "", nil // a shrink or a malformed size is the CRD's to refuse
	}
	name := now.Class
	if name == "" {
		def, err := h.defaultClass(ctx)
		if err != nil || def == "" {
			return "", err
		}
		name = def
	}
	sc := &storagev1.StorageClass{}
	if err := h.StorageClasses.Get(ctx, client.ObjectKey{Name: name}, sc); err != nil {
		if !apierrors.IsNotFound(err) {
			return "", fmt.Errorf("reading StorageClass %s: %w", name, err)
		}
		sc = nil
	}
	if r := volumes.CheckExpansion(name, sc); r != nil {
		return r.Message(fmt.Sprintf("%s: %s → %s", now.SizeField, was.Size, now.Size), fmt.Sprintf("keep %s at %s", now.SizeField, was.Size)), nil
	}
	return "", nil
}

// defaultClass is the name of the cluster's default StorageClass, "" if none.
func (h *Handler) defaultClass(ctx context.Context) (string, error) {
	list := &storagev1.StorageClassList{}
	if err := h.StorageClasses.List(ctx, list); err != nil {
		return "", fmt.Errorf("listing StorageClasses: %w", err)
	}
	for _, sc := range list.Items {
		if sc.Annotations[defaultClassAnnotation] == "true" {
			return sc.Name, nil
		}
	}
	return "", nil
}

func orDefault(class, def string) string {
	if class == "" {
		return def
	}
	return class
}

func className(class, def string) string {
	switch {
	case class != "":
		return fmt.Sprintf("%q", class)
	case def != "":
		return fmt.Sprintf("the default (%q)", def)
	}
	return "the default"
}
