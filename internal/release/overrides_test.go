package release_test

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/chartpilot/chartpilot/internal/api/v1alpha1"
	"github.com/chartpilot/chartpilot/internal/watches"
)

// TestOverrideValuesFromSecret: an overrideValues entry read from a Secret
// (valueFrom.secretKeyRef) reaches the release and nothing else: not the
// status, its digests or the events. A rotated value reaches the release
// at its next pass; a Secret that is gone holds the release as it is,
// naming the entry and the Secret.
func TestOverrideValuesFromSecret(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	const first, rotated = "s3cr3t-first-value", "s3cr3t-rotated-value"
	secret := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "webapp-message", Namespace: e.ns}, StringData: map[string]string{"message": first}}
	if _, err := e.cs.CoreV1().Secrets(e.ns).Create(ctx, secret, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	startOperator(t, cluster.Config, []watches.Watch{webappWatch(t, func(w *watches.Watch) {
		w.SecretValues = []watches.SecretValue{{Path: []string{"message"}, Namespace: e.ns, Name: "webapp-message", Key: "message"}}
	})})
	e.create("fromsecret", map[string]any{"message": "plain"}, nil, nil)
	u := e.waitCondition("fromsecret", v1alpha1.ConditionReady, metav1.ConditionTrue, "")
	if cm, err := e.configMap("fromsecret-config"); err != nil || cm.Data["message"] != first {
		t.Fatalf("the release does not carry the Secret's value: %v %v", cm.Data, err)
	}

	st, _ := json.Marshal(u.Object["status"])
	for _, s := range append([]string{string(st)}, e.events("fromsecret")...) {
		if strings.Contains(s, first) {
			t.Errorf("the Secret's value is in status or events: %.300s", s)
		}
	}
	// The digest in status is keyed with the release record key: a reader of
	// status cannot test guesses of the values against it.
	h := e.history("fromsecret")
	label := h[len(h)-1].Labels[v1alpha1.LabelDigest]
	shown := status(u).Release.ValuesDigest
	if label == "" || shown == label || len(shown) != len(label) {
		t.Fatalf("status digest %q, record digest %q: want a keyed digest of the same length", shown, label)
	}
	key, err := e.cs.CoreV1().Secrets("default").Get(ctx, "chartpilot-release-records", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	mac := hmac.New(sha256.New, key.Data["key"])
	mac.Write([]byte("chartpilot values digest\x00" + label))
	if want := hex.EncodeToString(mac.Sum(nil))[:len(label)]; shown != want {
		t.Errorf("status digest %s is not the HMAC of the record's digest under the record key (%s)", shown, want)
	}
	for _, entry := range status(u).History {
		if entry.Digest == label {
			t.Errorf("history entry %s carries the plain digest", entry.Action)
		}
	}

	secret.StringData = map[string]string{"message": rotated}
	if _, err := e.cs.CoreV1().Secrets(e.ns).Update(ctx, secret, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	requested := 0
	e.waitFor("the rotated value released", func() (bool, string) {
		requested++
		e.patch("fromsecret", fmt.Sprintf(`{"metadata":{"annotations":{%q:"rotate-%d"}}}`, v1alpha1.AnnotationReconcileRequestedAt, requested))
		cm, err := e.configMap("fromsecret-config")
		if err != nil {
			return false, err.Error()
		}
		return cm.Data["message"] == rotated, cm.Data["message"]
	})
	revisions := len(e.history("fromsecret"))

	if err := e.cs.CoreV1().Secrets(e.ns).Delete(ctx, "webapp-message", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	e.waitFor("the release held for its missing Secret", func() (bool, string) {
		requested++
		e.patch("fromsecret", fmt.Sprintf(`{"metadata":{"annotations":{%q:"gone-%d"}}}`, v1alpha1.AnnotationReconcileRequestedAt, requested))
		c := condition(e.get("fromsecret"), v1alpha1.ConditionReconciling)
		return c != nil && c.Reason == "OverrideSecretUnavailable" && strings.Contains(c.Message, "overrideValues.message") &&
			strings.Contains(c.Message, e.ns+"/webapp-message"), fmt.Sprint(c)
	})
	if n := len(e.history("fromsecret")); n != revisions {
		t.Errorf("a missing Secret changed the release: %d revisions, had %d", n, revisions)
	}
	if cm, err := e.configMap("fromsecret-config"); err != nil || cm.Data["message"] != rotated {
		t.Errorf("a missing Secret changed the release's objects: %v %v", cm.Data, err)
	}
	st, _ = json.Marshal(e.get("fromsecret").Object["status"])
	for _, s := range append([]string{string(st)}, e.events("fromsecret")...) {
		if strings.Contains(s, first) || strings.Contains(s, rotated) {
			t.Errorf("a Secret's value is in status or events: %.300s", s)
		}
	}
}
