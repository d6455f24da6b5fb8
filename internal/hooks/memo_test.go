package hooks

import (
	"context"
	"errors"
	"testing"
)

func TestRemember(t *testing.T) {
	calls := 0
	lookup := func() (string, error) { calls++; return "acme", nil }
	ctx := WithPassMemo(context.Background())
	for range 3 {
		if v, err := Remember(ctx, "tenant:ns1", lookup); v != "acme" || err != nil {
			t.Fatalf("Remember = %q, %v", v, err)
		}
	}
	if calls != 1 {
		t.Errorf("looked up %d times in one pass, want 1", calls)
	}
	failing := func() (string, error) { calls++; return "", errors.New("no cache") }
	if _, err := Remember(ctx, "tenant:ns2", failing); err == nil {
		t.Error("an error must be remembered too")
	}
	if _, err := Remember(ctx, "tenant:ns2", lookup); err == nil || calls != 2 {
		t.Errorf("a remembered error is answered again without a lookup: err %v, calls %d", err, calls)
	}
	calls = 0
	for range 2 {
		_, _ = Remember(context.Background(), "tenant:ns1", lookup)
	}
	if calls != 2 {
		t.Errorf("without a pass memo every call looks up: %d calls, want 2", calls)
	}
}
