package operator

import (
	"context"
	"crypto/rand"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// recordKeyBytes is the size of the key that signs release records.
const recordKeyBytes = 32

// recordKey reads the key that signs release records from Secret at (key
// "key"), creating it with a random key at the first start. Replicas share
// it through the Secret; a second replica starting at the same moment reads
// the first one's.
func recordKey(ctx context.Context, c client.Client, at types.NamespacedName) ([]byte, error) {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	for attempt := 0; attempt < 2; attempt++ {
		s := &corev1.Secret{}
		err := c.Get(ctx, at, s)
		if err == nil {
			key := s.Data["key"]
			if len(key) < recordKeyBytes {
				return nil, fmt.Errorf("release record key: Secret %s has no key of %d bytes under data.key: delete it to have a new one made (records signed with the old key are then untrusted)", at, recordKeyBytes)
			}
			return key, nil
		}
		if !apierrors.IsNotFound(err) {
			return nil, fmt.Errorf("release record key: reading Secret %s: %w", at, err)
		}
		key := make([]byte, recordKeyBytes)
		if _, err := rand.Read(key); err != nil {
			return nil, err
		}
		s = &corev1.Secret{
			ObjectMeta: metav1.ObjectMeta{Namespace: at.Namespace, Name: at.Name, Labels: map[string]string{"app.kubernetes.io/managed-by": "chartpilot"}},
			Type:       corev1.SecretTypeOpaque,
			Data:       map[string][]byte{"key": key},
		}
		err = c.Create(ctx, s)
		if err == nil {
			return key, nil
		}
		if !apierrors.IsAlreadyExists(err) {
			return nil, fmt.Errorf("release record key: creating Secret %s (does namespace %s exist?): %w", at, at.Namespace, err)
		}
	}
	return nil, fmt.Errorf("release record key: Secret %s could not be read or created", at)
}
