package api_test

import (
	"context"
	"sync"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/tether-dev/tether/pkg/affinity/affinitytest"
	"github.com/tether-dev/tether/pkg/api/apitest"
	tetherv1 "github.com/tether-dev/tether/pkg/api/gen/tether/v1"
	"github.com/tether-dev/tether/pkg/registry"
)

// TestConcurrentCreatesRespectCapacity sends 60 concurrent CreateSession calls, half over gRPC
// and half over HTTP, to a service with 10 session slots: exactly 10 succeed, each instance
// gets exactly its quota, and the rest are ResourceExhausted.
func TestConcurrentCreatesRespectCapacity(t *testing.T) {
	svc := affinitytest.Service("web", registry.AffinityCookie)
	svc.SessionsPerInstance = 5
	srv := apitest.Start(t, []registry.Service{svc}, affinitytest.Instances("web", 2))
	clients := []client{transports[0].new(t, srv, ""), transports[1].new(t, srv, "")}
	var (
		mu        sync.Mutex
		ok        = map[string]int{}
		exhausted int
		wg        sync.WaitGroup
	)
	for i := range 60 {
		wg.Go(func() {
			s, err := clients[i%2].CreateSession(context.Background(), &tetherv1.CreateSessionRequest{Service: "web"})
			mu.Lock()
			defer mu.Unlock()
			switch status.Code(err) {
			case codes.OK:
				ok[s.GetInstance()]++
			case codes.Unavailable: // no capacity (wire: 503 / UNAVAILABLE)
				exhausted++
			default:
				t.Errorf("create: %v", err)
			}
		})
	}
	wg.Wait()
	if ok["i1"] != 5 || ok["i2"] != 5 || exhausted != 50 {
		t.Errorf("created per instance %v, %d exhausted; want 5 on each and 50 exhausted", ok, exhausted)
	}
	if u := srv.Usage(t, "web"); u["i1"][0] != 5 || u["i2"][0] != 5 {
		t.Errorf("engine usage %v, want 5 sessions on each instance", u)
	}
}

// BenchmarkGetSession measures one GetSession round trip over each transport on loopback.
func BenchmarkGetSession(b *testing.B) {
	for _, tr := range transports {
		b.Run(tr.name, func(b *testing.B) {
			srv := apitest.Start(b, []registry.Service{affinitytest.Service("hdr", registry.AffinityHeader)}, affinitytest.Instances("hdr", 2))
			c := tr.new(b, srv, "")
			ctx := context.Background()
			if _, err := c.CreateSession(ctx, &tetherv1.CreateSessionRequest{Service: "hdr", SessionId: "bench"}); err != nil {
				b.Fatal(err)
			}
			b.ReportAllocs()
			b.ResetTimer()
			for b.Loop() {
				if _, err := c.GetSession(ctx, "hdr", "bench"); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
