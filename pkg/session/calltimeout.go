package session

import (
	"context"
	"time"
)

// callTimeoutKey is the context key of WithCallTimeout.
type callTimeoutKey struct{}

// WithCallTimeout returns a ctx whose store calls a shared store bounds by d each, instead of
// by the store's own call bound. A shared store's own bound is the request path's (tether serve
// gives it a quarter of Envoy's ext_proc message_timeout, 125 ms by default, so that a decision
// answers within its deadline); callers that are not on a request's path and may wait longer
// (the SessionAPI: an operator's create on a loaded machine) mark their ctx with their own
// bound. ctx's own deadline, if sooner, still applies. d ≤ 0 returns ctx unchanged. A store
// without network calls (memstore) ignores it.
func WithCallTimeout(ctx context.Context, d time.Duration) context.Context {
	if d <= 0 {
		return ctx
	}
	return context.WithValue(ctx, callTimeoutKey{}, d)
}

// CallTimeout returns the bound WithCallTimeout put on ctx, and whether there is one.
func CallTimeout(ctx context.Context) (time.Duration, bool) {
	d, ok := ctx.Value(callTimeoutKey{}).(time.Duration)
	return d, ok
}
