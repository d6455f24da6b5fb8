package hooks

import (
	"context"
	"sync"
)

type passMemoKey struct{}

type passMemo struct {
	mu sync.Mutex
	m  map[string]memoEntry
}

type memoEntry struct {
	v   any
	err error
}

// WithPassMemo returns a context in which Remember computes each key once:
// the release reconciler makes one per pass, so that the hooks of one pass
// (Validate, Identity, Values) share what they look up, such as the tenant of
// a namespace, and all see the same answer.
func WithPassMemo(ctx context.Context) context.Context {
	return context.WithValue(ctx, passMemoKey{}, &passMemo{m: map[string]memoEntry{}})
}

// Remember returns f's result for key, computed once per context made by
// WithPassMemo; without one (admission, say) f runs every time.
func Remember[T any](ctx context.Context, key string, f func() (T, error)) (T, error) {
	pm, ok := ctx.Value(passMemoKey{}).(*passMemo)
	if !ok {
		return f()
	}
	pm.mu.Lock()
	defer pm.mu.Unlock()
	if e, ok := pm.m[key]; ok {
		v, _ := e.v.(T)
		return v, e.err
	}
	v, err := f()
	pm.m[key] = memoEntry{v: v, err: err}
	return v, err
}
