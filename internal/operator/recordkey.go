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
	var last error
	for wait := 100 * time.Millisecond; ; wait = min(2*wait, 2*time.Second) {
		key, err := getOrCreateKey(ctx, c, at)
		if err == nil || !transient(err) {
			return key, err
		}
		last = err
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("release record key: %w", last)
		case <-time.After(wait):
		}
	}
}

// transient reports whether a request may succeed when tried again.
func transient(err error) bool {
	return apierrors.IsTooManyRequests(err) || apierrors.IsInternalError(err) || apierrors.IsServerTimeout(err) ||
		apierrors.IsServiceUnavailable(err) || apierrors.IsTimeout(err) || apierrors.IsAlreadyExists(err) || apierrors.IsUnexpectedServerError(err)
}

// getOrCreateKey reads the key, or makes it when the Secret does not exist.
func getOrCreateKey(ctx context.Context, c client.Client, at types.NamespacedName) ([]byte, error) {
	s := &corev1.Secret{}
	err := c.Get(ctx, at, s)
	if err == nil {
		if key := s.Data["key"]; len(key) >= recordKeyBytes {
			return key, nil
		}
		return nil, fmt.Errorf("release record key: Secret %s has no key of %d bytes under data.key: delete it to have a new one made (records signed with the old key are then untrusted)", at, recordKeyBytes)
	}
	if !apierrors.IsNotFound(err) {
		return nil, err
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
	if err := c.Create(ctx, s); err != nil {
		if apierrors.IsNotFound(err) {
			return nil, fmt.Errorf("release record key: creating Secret %s: namespace %s does not exist: create it or set --release-record-key-secret", at, at.Namespace)
		}
		return nil, err // AlreadyExists: another replica made it; read it on the next try
	}
	return key, nil
}
