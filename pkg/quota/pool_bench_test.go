package quota_test

import (
	"context"
	"testing"
	"time"

	"github.com/tether-dev/tether/internal/redistest"
	"github.com/tether-dev/tether/pkg/quota"
)

// BenchmarkPoolAcquireRelease: a request slot taken from the local lease and given back — the
// request path's cost of the leases when the lease has room (no Redis round trip): serial, and
// from every core at once (the pool's words shared).
func BenchmarkPoolAcquireRelease(b *testing.B) {
	srv := redistest.Start(b)
	l := quota.New(client(b, srv.Addr), "q:", "a", quota.WithChunk(1000), quota.WithDegradedFor(time.Minute))
	if err := l.Seed(context.Background(), "web"); err != nil {
		b.Fatal(err)
	}
	p := l.Pool("web", "i1", func() int { return 100000 })
	ctx := context.Background()
	if !p.TryAcquire(ctx) { // borrows the lease once
		b.Fatal("first acquire failed")
	}
	p.Release()
	b.Run("serial", func(b *testing.B) {
		for range b.N {
			if !p.TryAcquire(ctx) {
				b.Fatal("refused within the lease")
			}
			p.Release()
		}
	})
	b.Run("parallel", func(b *testing.B) {
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				if !p.TryAcquire(ctx) {
					b.Error("refused within the lease")
					return
				}
				p.Release()
			}
		})
	})
}
