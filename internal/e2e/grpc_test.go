package e2e_test

import (
	"context"
	"errors"
	"net"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/tether-dev/tether/internal/e2e"
	"github.com/tether-dev/tether/internal/testutil"
	"github.com/tether-dev/tether/pkg/registry"
)

// grpcInstanceKey is the response header metadata naming the instance that served a call.
const grpcInstanceKey = "x-upstream-instance"

// grpcUpstream is one real gRPC instance (grpc-go, h2c) serving grpc.health.v1: Check answers
// at once, Watch holds the call open until the client goes away. Every call's response headers
// name the instance.
type grpcUpstream struct {
	id     string
	addr   *net.TCPAddr
	served atomic.Int64
}

func startGRPCUpstream(t *testing.T, id string) *grpcUpstream {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	u := &grpcUpstream{id: id, addr: ln.Addr().(*net.TCPAddr)}
	gs := grpc.NewServer(
		grpc.UnaryInterceptor(func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
			u.served.Add(1)
			_ = grpc.SetHeader(ctx, metadata.Pairs(grpcInstanceKey, id))
			return h(ctx, req)
		}),
		grpc.StreamInterceptor(func(srv any, ss grpc.ServerStream, _ *grpc.StreamServerInfo, h grpc.StreamHandler) error {
			u.served.Add(1)
			_ = ss.SetHeader(metadata.Pairs(grpcInstanceKey, id))
			return h(srv, ss)
		}))
	hs := health.NewServer()
	hs.SetServingStatus("", healthpb.HealthCheckResponse_SERVING)
	healthpb.RegisterHealthServer(gs, hs)
	go func() { _ = gs.Serve(ln) }()
	t.Cleanup(gs.Stop)
	return u
}

func (u *grpcUpstream) instance(service string) registry.Instance {
	return registry.Instance{Service: service, ID: u.id, Address: u.addr.IP.String(), HTTPPort: u.addr.Port,
		Weight: 1, State: registry.StateActive}
}

// grpcClient dials the data plane as a gRPC client (HTTP/2 with prior knowledge).
func grpcClient(t *testing.T, e *e2e.Env) healthpb.HealthClient {
	t.Helper()
	cc, err := grpc.NewClient(e.DP.URL()[len("http://"):], grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cc.Close() })
	return healthpb.NewHealthClient(cc)
}

// check makes one Check call with the given request metadata and returns the instance that
// answered, the response headers and trailers, and the call's error.
func check(ctx context.Context, c healthpb.HealthClient, kv ...string) (string, metadata.MD, metadata.MD, error) {
	var hdr, trl metadata.MD
	if len(kv) > 0 {
		ctx = metadata.AppendToOutgoingContext(ctx, kv...)
	}
	_, err := c.Check(ctx, &healthpb.HealthCheckRequest{}, grpc.Header(&hdr), grpc.Trailer(&trl))
	inst := ""
	if v := hdr.Get(grpcInstanceKey); len(v) > 0 {
		inst = v[0]
	}
	return inst, hdr, trl, err
}

// TestGRPCHeaderSessionsAndRejections: a real grpc-go client through the data plane to real
// gRPC instances. Header-type session persistence works over gRPC (Gateway API's GRPCRoute
// header case): the first call gets a generated id in the response headers and 50 calls
// carrying it reach the same instance. Rejections reach the caller with the documented gRPC
// status: RESOURCE_EXHAUSTED with retry pushback at the request cap, UNAVAILABLE when no
// instance can take a new session — not the INTERNAL or UNAVAILABLE-for-everything a bare
// HTTP status would become.
func TestGRPCHeaderSessionsAndRejections(t *testing.T) {
	svc := service("hc", registry.AffinityHeader)
	svc.UpstreamHTTP2 = true
	svc.SessionsPerInstance = 1
	svc.RequestSlotsPerInstance = 1
	g1, g2 := startGRPCUpstream(t, "g1"), startGRPCUpstream(t, "g2")
	e := e2e.StartDataPlane(t, e2e.KindHarness, []registry.Service{svc},
		[]registry.Instance{g1.instance("hc"), g2.instance("hc")})
	c := grpcClient(t, e)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	// With one request slot per instance, each sequential call waits until the previous
	// exchange's slot is back: tether releases it when the side stream ends, just after the
	// caller already has its answer.
	home, hdr, _, err := check(ctx, c)
	e.WaitSlotsReleased(t)
	id := ""
	if v := hdr.Get("x-tether-session"); len(v) == 1 {
		id = v[0]
	}
	if err != nil || home == "" || len(id) != 32 {
		t.Fatalf("first call: instance %q, x-tether-session %q, err %v; want a generated id", home, id, err)
	}
	for i := range 50 {
		got, hdr, _, err := check(ctx, c, "x-tether-session", id)
		if err != nil || got != home {
			t.Fatalf("call %d with the session id: instance %q, err %v; want %q", i, got, err, home)
		}
		if v := hdr.Get("x-tether-session"); len(v) != 0 {
			t.Errorf("call %d: an existing session got an id back: %q", i, v)
		}
		e.WaitSlotsReleased(t)
	}

	// Hold the session's only request slot with a Watch, then call again in that session.
	wctx, wcancel := context.WithCancel(ctx)
	defer wcancel()
	w, err := c.Watch(metadata.AppendToOutgoingContext(wctx, "x-tether-session", id), &healthpb.HealthCheckRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := w.Recv(); err != nil {
		t.Fatalf("watch: %v", err)
	}
	_, _, trl, err := check(ctx, c, "x-tether-session", id)
	if status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("call at the request cap: %v, want RESOURCE_EXHAUSTED", err)
	}
	if got := trl.Get("grpc-retry-pushback-ms"); len(got) != 1 || mustAtoi(t, got[0]) < 1000 {
		t.Errorf("grpc-retry-pushback-ms = %q, want a delay of at least 1000 ms", got)
	}

	// The other instance takes a second session; a third finds no capacity.
	other, _, _, err := check(ctx, c)
	testutil.Eventually(t, "only the Watch holds a slot", func() bool { return e.RequestsInFlight(t, "hc") == 1 })
	if err != nil || other == home || other == "" {
		t.Fatalf("second session: instance %q, err %v; want the other instance", other, err)
	}
	if _, _, _, err := check(ctx, c); status.Code(err) != codes.Unavailable {
		t.Fatalf("third session with every instance full: %v, want UNAVAILABLE", err)
	}
	wcancel()
	if _, err := w.Recv(); status.Code(err) != codes.Canceled && !errors.Is(err, context.Canceled) {
		t.Errorf("watch after cancel: %v", err)
	}
	e.WaitSlotsReleased(t)
	if s := e.Harness().Stats(); s.ImmediateResponses != 2 {
		t.Errorf("harness applied %d ImmediateResponses, want 2", s.ImmediateResponses)
	}
	testutil.Eventually(t, "both instances served", func() bool { return g1.served.Load() > 0 && g2.served.Load() > 0 })
}

func mustAtoi(t *testing.T, s string) int {
	t.Helper()
	n, err := strconv.Atoi(s)
	if err != nil {
		t.Fatalf("%q: %v", s, err)
	}
	return n
}
