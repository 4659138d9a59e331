package grpc_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net"
	"os"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	grpcxds "google.golang.org/grpc/xds"

	"github.com/tether-dev/tether/internal/testutil"
	"github.com/tether-dev/tether/pkg/affinity/affinitytest"
	"github.com/tether-dev/tether/pkg/extproc"
	"github.com/tether-dev/tether/pkg/registry"
	"github.com/tether-dev/tether/pkg/xds"
)

// extProcClientEnv enables grpc-go's client-side ext_proc filter (gRFC A93). grpc-go reads it
// once, when its packages initialise, so TestMain runs the tests in a child process with it set.
const extProcClientEnv = "GRPC_EXPERIMENTAL_XDS_EXT_PROC_ON_CLIENT"

func TestMain(m *testing.M) {
	if os.Getenv(extProcClientEnv) != "true" {
		cmd := exec.Command(os.Args[0], os.Args[1:]...)
		cmd.Env = append(os.Environ(), extProcClientEnv+"=true")
		cmd.Stdout, cmd.Stderr = os.Stdout, os.Stderr
		if err := cmd.Run(); err != nil {
			var ee *exec.ExitError
			if errors.As(err, &ee) {
				os.Exit(ee.ExitCode())
			}
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// backend is one service instance: a real gRPC server (grpc.health.v1) that names itself in a
// response header and, for calls carrying "block", holds the call until released (with
// "sendheader", after sending its response headers).
type backend struct {
	id      string
	addr    *net.TCPAddr
	served  atomic.Int64
	blocked atomic.Int64
	release chan struct{}
}

func startBackend(t *testing.T, id string) *backend {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	b := &backend{id: id, addr: lis.Addr().(*net.TCPAddr), release: make(chan struct{})}
	gs := grpc.NewServer(grpc.UnaryInterceptor(func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
		b.served.Add(1)
		md, _ := metadata.FromIncomingContext(ctx)
		send := grpc.SetHeader
		if len(md.Get("sendheader")) > 0 {
			send = grpc.SendHeader // the response headers go out before the call blocks
		}
		if err := send(ctx, metadata.Pairs("backend", id)); err != nil {
			return nil, err
		}
		if len(md.Get("block")) > 0 {
			b.blocked.Add(1)
			defer b.blocked.Add(-1)
			select {
			case <-b.release:
			case <-ctx.Done():
				return nil, ctx.Err()
			}
		}
		return h(ctx, req)
	}))
	healthpb.RegisterHealthServer(gs, health.NewServer())
	go func() { _ = gs.Serve(lis) }()
	t.Cleanup(gs.Stop)
	return b
}

func (b *backend) instance(service string) registry.Instance {
	return registry.Instance{Service: service, ID: b.id, Address: "127.0.0.1", HTTPPort: b.addr.Port, Weight: 1, State: registry.StateActive}
}

// proxyless is tether (engine, ext_proc server and xDS server, each on loopback) and a grpc-go
// client configured by tether's xDS alone, its ext_proc filter included.
type proxyless struct {
	f          *affinitytest.Fixture
	res        func(target string) *grpc.ClientConn
	stopTether func() // stops tether's ext_proc server
	ep         *extproc.Server
}

func startProxyless(t *testing.T, services []registry.Service, instances []registry.Instance) *proxyless {
	t.Helper()
	f := affinitytest.New(t, services, instances)

	elis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	es := grpc.NewServer(extproc.ServerOptions()...)
	ep := extproc.NewServer(f.Engine)
	extproc.Register(es, ep)
	go func() { _ = es.Serve(elis) }()
	t.Cleanup(es.Stop)
	target := "dns:///" + elis.Addr().String()

	xlis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := xds.NewServer(f.Registry, xds.WithDebounce(0), xds.WithGRPCParams(xds.Params{GRPCExtProcTarget: target}))
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Run(ctx, xlis) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	})

	// The recipe's bootstrap, pointed at these servers: its allowed_grpc_services entry for
	// the ext_proc target is what lets the client dial it (gRFC A102).
	bs, err := localBootstrap(xlis.Addr().String(), target)
	if err != nil {
		t.Fatal(err)
	}
	res, err := grpcxds.NewXDSResolverWithConfigForTesting(bs)
	if err != nil {
		t.Fatalf("grpc-go refuses the bootstrap: %v", err)
	}
	return &proxyless{f: f, stopTether: es.Stop, ep: ep, res: func(name string) *grpc.ClientConn {
		cc, err := grpc.NewClient("xds:///"+name, grpc.WithResolvers(res), grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = cc.Close() })
		return cc
	}}
}

// localBootstrap is bootstrap.json with the xDS server and the allowed ext_proc target
// replaced by loopback ones.
func localBootstrap(xdsAddr, extProcTarget string) ([]byte, error) {
	data, err := os.ReadFile("bootstrap.json")
	if err != nil {
		return nil, err
	}
	var raw map[string]any
	if err := json.Unmarshal(data, &raw); err != nil {
		return nil, err
	}
	raw["xds_servers"].([]any)[0].(map[string]any)["server_uri"] = "passthrough:///" + xdsAddr
	allowed, ok := raw["allowed_grpc_services"].(map[string]any)
	if !ok || len(allowed) != 1 {
		return nil, fmt.Errorf("bootstrap.json: want one allowed_grpc_services entry (tether's ext_proc), got %v", raw["allowed_grpc_services"])
	}
	for _, v := range allowed {
		raw["allowed_grpc_services"] = map[string]any{extProcTarget: v}
	}
	return json.Marshal(raw)
}

func call(ctx context.Context, cc *grpc.ClientConn, kv ...string) (string, error) {
	var hdr metadata.MD
	ctx = metadata.AppendToOutgoingContext(ctx, kv...)
	_, err := healthpb.NewHealthClient(cc).Check(ctx, &healthpb.HealthCheckRequest{}, grpc.Header(&hdr), grpc.WaitForReady(true))
	if v := hdr.Get("backend"); len(v) == 1 {
		return v[0], err
	}
	return "", err
}

// TestProxylessCapThroughTethersXDS: a grpc-go client configured only by tether's xDS runs
// tether's ext_proc filter (gRFC A93) on every call. On a service whose one instance has 200
// request slots, 200 concurrent calls are admitted and the 201st fails with RESOURCE_EXHAUSTED
// and tether's rejection code in its status message; an unknown service fails UNAVAILABLE (its
// listener does not exist); every slot is back to 0 when the calls end; and with tether's
// ext_proc server gone calls fail closed.
func TestProxylessCapThroughTethersXDS(t *testing.T) {
	be := startBackend(t, "web-1")
	svc := affinitytest.Service("web", registry.AffinityNone)
	if svc.RequestSlotsPerInstance != 200 {
		t.Fatalf("default request slots = %d, the test assumes 200", svc.RequestSlotsPerInstance)
	}
	p := startProxyless(t, []registry.Service{svc}, []registry.Instance{be.instance("web")})
	cc := p.res("web")
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	// An unknown service has no listener: grpc-go fails the call UNAVAILABLE once its
	// resource timer (15 s) gives up on the listener; checked alongside the rest.
	unknown := make(chan error, 1)
	nope := p.res("nope")
	go func() {
		_, err := healthpb.NewHealthClient(nope).Check(ctx, &healthpb.HealthCheckRequest{})
		unknown <- err
	}()

	if got, err := call(ctx, cc); err != nil || got != "web-1" {
		t.Fatalf("first call: served by %q, %v; want web-1", got, err)
	}
	var wg sync.WaitGroup
	errs := make(chan error, 200)
	for range 200 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if _, err := call(ctx, cc, "block", "1"); err != nil {
				errs <- err
			}
		}()
	}
	testutil.Eventually(t, "200 calls held by the backend", func() bool { return be.blocked.Load() == 200 })
	if n := p.f.Usage(t, "web")["web-1"][1]; n != 200 {
		t.Errorf("tether counts %d requests in flight, want 200", n)
	}
	_, err := call(ctx, cc)
	st := status.Convert(err)
	if st.Code() != codes.ResourceExhausted || !strings.HasPrefix(st.Message(), "ResourceExhausted: ") {
		t.Errorf("201st call: %v, want RESOURCE_EXHAUSTED with message \"ResourceExhausted: …\"", err)
	}
	t.Logf("201st call: code %v, message %q", st.Code(), st.Message())
	if be.served.Load() != 201 {
		t.Errorf("backend served %d calls, want 201 (the rejected one never reaches it)", be.served.Load())
	}
	close(be.release)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Errorf("admitted call: %v", err)
	}
	testutil.Eventually(t, "slots back to 0", func() bool { return p.f.Usage(t, "web")["web-1"][1] == 0 })

	// tether gone: the call fails closed (INTERNAL) and never reaches the instance.
	p.stopTether()
	served := be.served.Load()
	if _, err := call(ctx, cc); status.Code(err) != codes.Internal {
		t.Errorf("with tether's ext_proc server stopped: %v, want INTERNAL", err)
	}
	if be.served.Load() != served {
		t.Error("a call reached the instance while tether was down")
	}

	uerr := <-unknown
	if c := status.Code(uerr); c != codes.Unavailable {
		t.Errorf("unknown service: %v, want UNAVAILABLE", uerr)
	}
	t.Logf("unknown service: %v", uerr)
}

// TestProxylessDrain measures what draining means to a proxyless gRPC client, which differs
// from Envoy (deploy/grpc/README.md): 30 keys hashed on the session header over three backends,
// then one backend draining. grpc-go keeps only HEALTHY and UNKNOWN endpoints in its ring
// (cdsbalancer configbuilder), so every key on the draining backend moves at once — a call in
// flight there still completes — and rebuilding the ring (each remaining endpoint gets more
// ring entries) moves some keys between the other two. Every call keeps succeeding, through
// tether's filter, and none reaches the draining backend; the engine's mirror of the ring
// follows (each key is still counted where it goes).
func TestProxylessDrain(t *testing.T) {
	bes := []*backend{startBackend(t, "web-1"), startBackend(t, "web-2"), startBackend(t, "web-3")}
	svc := affinitytest.Service("web", registry.AffinityNone)
	var ins []registry.Instance
	byID := map[string]*backend{}
	for _, b := range bes {
		ins = append(ins, b.instance("web"))
		byID[b.id] = b
	}
	p := startProxyless(t, []registry.Service{svc}, ins)
	cc := p.res("web")
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	const keys = 30
	place := func() map[string]string {
		out := map[string]string{}
		for i := range keys {
			k := fmt.Sprintf("key-%02d", i)
			got, err := call(ctx, cc, xds.DefaultSessionHeader, k)
			if err != nil {
				t.Fatalf("%s: %v", k, err)
			}
			out[k] = got
		}
		return out
	}
	before := place()
	if again := place(); !maps.Equal(before, again) {
		t.Fatalf("keys are not sticky before the drain:\n%v\n%v", before, again)
	}
	perBackend := map[string]int{}
	for _, b := range before {
		perBackend[b]++
	}
	drained := "web-1"
	var onDrained string
	for k, b := range before {
		if b == drained {
			onDrained = k
			break
		}
	}
	if onDrained == "" {
		t.Fatalf("no key on %s: %v", drained, perBackend)
	}

	// A call in flight on the backend about to drain.
	inflight := make(chan error, 1)
	go func() {
		_, err := call(ctx, cc, xds.DefaultSessionHeader, onDrained, "block", "1")
		inflight <- err
	}()
	testutil.Eventually(t, "the in-flight call held on "+drained, func() bool { return byID[drained].blocked.Load() == 1 })

	if err := p.f.Registry.SetState(registry.Key{Service: "web", ID: drained}, registry.StateDraining); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, "the client to stop sending "+onDrained+" to "+drained, func() bool {
		got, err := call(ctx, cc, xds.DefaultSessionHeader, onDrained)
		return err == nil && got != drained
	})
	after := place()
	movedOff, movedOthers, unmirrored := 0, 0, 0
	for k, b := range before {
		// tether's mirror follows the rebuilt ring: it still counts each key where it goes.
		if in, err := p.f.Engine.GRPCRingLookup(ctx, "web", k); err != nil || in.ID != after[k] {
			unmirrored++
			t.Errorf("%s: after the drain grpc-go sends it to %s, the mirror names %q (%v)", k, after[k], in.ID, err)
		}
		switch {
		case after[k] == drained:
			t.Errorf("%s went to the draining backend", k)
		case b == drained:
			movedOff++
		case after[k] != b:
			movedOthers++
		}
	}
	close(byID[drained].release)
	if err := <-inflight; err != nil {
		t.Errorf("the call in flight on the draining backend: %v, want it to complete", err)
	}
	if movedOff != perBackend[drained] {
		t.Errorf("%d of %d keys on the draining backend moved, want all (grpc-go drops DRAINING endpoints)", movedOff, perBackend[drained])
	}
	t.Logf("placement before the drain: %v; keys on %s that moved: %d of %d; keys on the other backends that moved: %d of %d; keys the mirror places elsewhere after the drain: %d",
		perBackend, drained, movedOff, perBackend[drained], movedOthers, keys-perBackend[drained], unmirrored)
	testutil.Eventually(t, "slots back to 0", func() bool {
		for _, u := range p.f.Usage(t, "web") {
			if u[1] != 0 {
				return false
			}
		}
		return true
	})
}

// TestProxylessHandoff: a grpc-go client's call through its real ext_proc filter (gRFC A93),
// past its response headers, whose side stream tether hands off at a drain (closes with status
// OK): grpc-go's filter goes on without ext_proc (failProcStream on io.EOF: the call bypasses
// the processor from then on), so the call completes with the backend's answer instead of
// failing; the handed-off call's request slot is released with the handoff.
func TestProxylessHandoff(t *testing.T) {
	be := startBackend(t, "web-1")
	p := startProxyless(t, []registry.Service{affinitytest.Service("web", registry.AffinityNone)}, []registry.Instance{be.instance("web")})
	cc := p.res("web")
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if got, err := call(ctx, cc); err != nil || got != "web-1" {
		t.Fatalf("first call: served by %q, %v; want web-1", got, err)
	}
	type result struct {
		got string
		err error
	}
	done := make(chan result, 1)
	go func() {
		got, err := call(ctx, cc, "block", "1", "sendheader", "1")
		done <- result{got, err}
	}()
	testutil.Eventually(t, "the call held by the backend", func() bool { return be.blocked.Load() == 1 })
	testutil.Eventually(t, "the call ready to be handed off (its response headers answered)", func() bool { return p.ep.Handoffable() == 1 })
	p.ep.Drain()
	p.ep.HandOff()
	testutil.Eventually(t, "the side stream handed off", func() bool { return p.ep.Stats().HandedOff == 1 })
	testutil.Eventually(t, "the slot released with the handoff", func() bool { return p.f.Usage(t, "web")["web-1"][1] == 0 })
	close(be.release)
	r := <-done
	if r.err != nil || r.got != "web-1" {
		t.Errorf("the handed-off call: served by %q, %v; want it to complete on web-1", r.got, r.err)
	}
	if n := be.served.Load(); n != 2 {
		t.Errorf("backend served %d calls, want 2", n)
	}
}

// TestProxylessCountsAreTheRingsPick: tether decides each call of a proxyless client on the
// instance grpc-go's ring picks for it (the engine's mirror, package ringhash), so per-instance
// counts and caps are per backend. 30 calls on 30 keys held open over three backends: tether
// counts on each instance exactly the calls that backend holds. Then, on a service with 3
// request slots per instance, three calls held on the backend the ring gives one key and one on
// another: a fourth key the ring sends to the full backend is refused (RESOURCE_EXHAUSTED,
// naming that instance) and never reaches it, while a key the ring sends to the other backend
// is served there.
func TestProxylessCountsAreTheRingsPick(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	t.Run("counts", func(t *testing.T) {
		bes, p := startRing(t, affinitytest.Service("web", registry.AffinityNone), 3)
		cc := p.res("web")
		keys := make([]string, 30)
		for i := range keys {
			keys[i] = fmt.Sprintf("key-%02d", i)
		}
		wait := holdCalls(ctx, t, cc, keys)
		testutil.Eventually(t, "30 calls held by the backends", func() bool { return held(bes) == len(keys) })
		served, counted := map[string]int{}, map[string]int{}
		total, miscounted := 0, 0
		for _, b := range bes {
			served[b.id] = int(b.blocked.Load())
		}
		for id, u := range p.f.Usage(t, "web") {
			counted[id] = u[1]
			total += u[1]
			if d := u[1] - served[id]; d > 0 {
				miscounted += d
			}
		}
		if total != len(keys) {
			t.Errorf("tether counts %d calls in flight for the service, want %d", total, len(keys))
		}
		if diff := cmp.Diff(served, counted); diff != "" {
			t.Errorf("per-instance counts differ from the calls each backend holds (-held +counted):\n%s", diff)
		}
		t.Logf("calls held per backend (ring hash): %v; counted per instance by tether: %v; %d of %d calls counted on another instance than the one serving them",
			served, counted, miscounted, len(keys))
		releaseAll(bes)
		wait()
		testutil.Eventually(t, "slots back to 0", func() bool { return inFlight(t, p) == 0 })
	})
	t.Run("cap per backend", func(t *testing.T) {
		const slots = 3
		svc := affinitytest.Service("web", registry.AffinityNone)
		svc.RequestSlotsPerInstance = slots
		bes, p := startRing(t, svc, 3)
		cc := p.res("web")
		byBackend := keysByRing(ctx, t, p, 200)
		full, other := bes[0], bes[1]
		if len(byBackend[full.id]) < slots+1 || len(byBackend[other.id]) < 2 {
			t.Fatalf("200 keys do not give %s %d keys and %s 2: %v", full.id, slots+1, other.id, byBackend)
		}
		hold := append(slices.Clone(byBackend[full.id][:slots]), byBackend[other.id][0])
		wait := holdCalls(ctx, t, cc, hold)
		testutil.Eventually(t, "the calls held where the ring sends them", func() bool {
			return full.blocked.Load() == slots && other.blocked.Load() == 1
		})
		servedFull := full.served.Load()
		_, err := call(ctx, cc, xds.DefaultSessionHeader, byBackend[full.id][slots])
		st := status.Convert(err)
		if st.Code() != codes.ResourceExhausted || !strings.HasPrefix(st.Message(), "ResourceExhausted: ") || !strings.Contains(st.Message(), fmt.Sprintf("%q", full.id)) {
			t.Errorf("a %dth call the ring sends to the full %s: %v, want RESOURCE_EXHAUSTED naming %s", slots+1, full.id, err, full.id)
		}
		t.Logf("%dth call on the full backend: code %v, message %q", slots+1, st.Code(), st.Message())
		if n := full.served.Load(); n != servedFull {
			t.Errorf("the refused call reached %s (served %d, want %d)", full.id, n, servedFull)
		}
		if got, err := call(ctx, cc, xds.DefaultSessionHeader, byBackend[other.id][1]); err != nil || got != other.id {
			t.Errorf("a call the ring sends to %s, which has room: served by %q, %v; want %s", other.id, got, err, other.id)
		}
		releaseAll(bes)
		wait()
		testutil.Eventually(t, "slots back to 0", func() bool { return inFlight(t, p) == 0 })
	})
}

// TestProxylessRingMirror compares the engine's mirror of grpc-go's ring (package ringhash,
// Engine.GRPCRingLookup) with grpc-go's real ring_hash picker, driven by tether's xDS to real
// backends: for several endpoint sets — equal and unequal weights, two zones with their own
// weights, a draining instance (on no ring, its weight still in its locality's sum) and a
// standby one (priority 1) — 200 keys each on the session header (every tenth call with a
// second value of the header), the backend that served each key is the one the mirror names.
func TestProxylessRingMirror(t *testing.T) {
	type spec struct {
		weight uint32
		zone   string
		state  registry.State
	}
	active := func(w uint32, zone string) spec { return spec{w, zone, registry.StateActive} }
	for _, tc := range []struct {
		name string
		ins  []spec
	}{
		{"three equal", []spec{active(1, ""), active(1, ""), active(1, "")}},
		{"five weighted", []spec{active(1, ""), active(2, ""), active(3, ""), active(1, ""), active(5, "")}},
		{"two zones", []spec{active(1, "a"), active(3, "a"), active(2, "b"), active(1, "b"), active(7, "b")}},
		{"draining and standby", []spec{active(1, ""), active(2, ""), {3, "", registry.StateDraining}, {1, "", registry.StateStandby}}},
		{"one", []spec{active(4, "")}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
			defer cancel()
			var ins []registry.Instance
			for i, sp := range tc.ins {
				b := startBackend(t, fmt.Sprintf("web-%d", i+1))
				in := b.instance("web")
				in.Weight, in.Zone, in.State = sp.weight, sp.zone, sp.state
				ins = append(ins, in)
			}
			p := startProxyless(t, []registry.Service{affinitytest.Service("web", registry.AffinityNone)}, ins)
			cc := p.res("web")
			const keys = 200
			differ, got := 0, map[string]int{}
			for i := range keys {
				k := fmt.Sprintf("k%d-%x", i, i*7919)
				kv := []string{xds.DefaultSessionHeader, k}
				if i%10 == 9 { // two values of the header: grpc-go hashes them joined with ","
					kv = append(kv, xds.DefaultSessionHeader, "second")
					k += ",second"
				}
				served, err := call(ctx, cc, kv...)
				if err != nil {
					t.Fatalf("%s: %v", k, err)
				}
				mirror, err := p.f.Engine.GRPCRingLookup(ctx, "web", k)
				if err != nil {
					t.Fatal(err)
				}
				got[served]++
				if mirror.ID != served {
					differ++
					if differ <= 5 {
						t.Errorf("key %q: grpc-go sent it to %s, the mirror names %s", k, served, mirror.ID)
					}
				}
			}
			if differ > 0 {
				t.Errorf("%d of %d keys differ", differ, keys)
			}
			t.Logf("%d keys served %v; %d differ from the mirror", keys, got, differ)
		})
	}
}

// startRing starts n backends web-1… of one service and tether in front of them.
func startRing(t *testing.T, svc registry.Service, n int) ([]*backend, *proxyless) {
	t.Helper()
	var bes []*backend
	var ins []registry.Instance
	for i := range n {
		b := startBackend(t, fmt.Sprintf("web-%d", i+1))
		bes = append(bes, b)
		ins = append(ins, b.instance(svc.Name))
	}
	return bes, startProxyless(t, []registry.Service{svc}, ins)
}

// keysByRing returns n keys grouped by the instance the engine's ring mirror names for them.
func keysByRing(ctx context.Context, t *testing.T, p *proxyless, n int) map[string][]string {
	t.Helper()
	out := map[string][]string{}
	for i := range n {
		k := fmt.Sprintf("key-%03d", i)
		in, err := p.f.Engine.GRPCRingLookup(ctx, "web", k)
		if err != nil {
			t.Fatal(err)
		}
		out[in.ID] = append(out[in.ID], k)
	}
	return out
}

// holdCalls starts one blocking call per key (on the session header) and returns a function
// that waits for them to end, reporting their errors.
func holdCalls(ctx context.Context, t *testing.T, cc *grpc.ClientConn, keys []string) func() {
	t.Helper()
	var wg sync.WaitGroup
	errs := make(chan error, len(keys))
	for _, k := range keys {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if _, err := call(ctx, cc, xds.DefaultSessionHeader, k, "block", "1"); err != nil {
				errs <- fmt.Errorf("%s: %w", k, err)
			}
		}()
	}
	return func() {
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Errorf("held call: %v", err)
		}
	}
}

func held(bes []*backend) int {
	n := 0
	for _, b := range bes {
		n += int(b.blocked.Load())
	}
	return n
}

func releaseAll(bes []*backend) {
	for _, b := range bes {
		close(b.release)
	}
}

// inFlight is the number of request slots tether counts in use on the service "web".
func inFlight(t *testing.T, p *proxyless) int {
	n := 0
	for _, u := range p.f.Usage(t, "web") {
		n += u[1]
	}
	return n
}
