package replicatest_test

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/tether-dev/tether/internal/redistest"
	"github.com/tether-dev/tether/internal/replicatest"
	"github.com/tether-dev/tether/pkg/affinity/affinitytest"
	"github.com/tether-dev/tether/pkg/registry"
	"github.com/tether-dev/tether/pkg/session/redisstore"
)

// BenchmarkAckDurabilityNewSession: a request without a cookie (placement script and
// Set-Cookie), one at a time, with each store.redis.ackDurability, side by side on the same
// redis-server pair (a primary with its AOF and one replica; the Sentinel is not in the path):
// none on appendfsync everysec (Redis's default) and on always, aof on always, replica (WAIT 1)
// on everysec. The primary's appendfsync is switched with CONFIG SET before each. It reports
// the latency's p50 and p99 (µs) beside ns/op.
func BenchmarkAckDurabilityNewSession(b *testing.B) {
	sn := redistest.StartSentinel(b, redistest.WithAOF("everysec"))
	modes := []struct {
		name  string
		fsync string
		dur   redisstore.Durability
	}{
		{"none-everysec", "everysec", redisstore.Durability{Mode: redisstore.AckNone}},
		{"none-always", "always", redisstore.Durability{Mode: redisstore.AckNone}},
		{"aof-always", "always", redisstore.Durability{Mode: redisstore.AckAOF}},
		{"replica-everysec", "everysec", redisstore.Durability{Mode: redisstore.AckReplica}},
	}
	for _, m := range modes {
		b.Run(m.name, func(b *testing.B) {
			if _, err := sn.Primary.Do("CONFIG", "SET", "appendfsync", m.fsync); err != nil {
				b.Fatal(err)
			}
			reps := replicatest.Start(b, sn.Primary.Addr, 1, []registry.Service{benchService(1 << 30)}, affinitytest.Instances("fn", 10),
				replicatest.Options{Durability: m.dur, Defaults: true})
			e := reps[0].Engine
			ctx := context.Background()
			req := cookieRequest("")
			for range 50 { // warm up: scripts loaded, connections open, the replica streaming
				if d, err := e.Decide(ctx, req); err == nil {
					d.End()
				}
			}
			lat := make([]time.Duration, 0, b.N)
			b.ResetTimer()
			for range b.N {
				t0 := time.Now()
				d, err := e.Decide(ctx, req)
				if err != nil {
					b.Fatal(err)
				}
				lat = append(lat, time.Since(t0))
				d.End()
			}
			b.StopTimer()
			slices.Sort(lat)
			b.ReportMetric(float64(lat[len(lat)/2].Microseconds()), "p50-µs")
			b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds()), "p99-µs")
			for _, r := range reps {
				r.Stop()
			}
		})
	}
}
