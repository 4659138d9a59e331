package envoyharness_test

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"net/http"
	"slices"
	"sync"
	"testing"
	"time"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	"github.com/tether-dev/tether/internal/envoyharness"
	"github.com/tether-dev/tether/internal/testutil"
	"github.com/tether-dev/tether/internal/upstream"
)

// extProcHost is one member of an ext_proc cluster: a scripted processor with a
// grpc.health.v1 service, on its own gRPC server.
type extProcHost struct {
	addr   string
	proc   *processor
	health *health.Server
	gs     *grpc.Server
	ln     net.Listener
}

func startHost(t *testing.T, answer func(*extprocv3.ProcessingRequest) (*extprocv3.ProcessingResponse, error)) *extProcHost {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	h := &extProcHost{addr: ln.Addr().String(), proc: &processor{answer: answer}, health: health.NewServer(), gs: grpc.NewServer(), ln: ln}
	extprocv3.RegisterExternalProcessorServer(h.gs, h.proc)
	healthpb.RegisterHealthServer(h.gs, h.health)
	h.setServing(true)
	go func() { _ = h.gs.Serve(ln) }()
	t.Cleanup(h.gs.Stop)
	return h
}

func (h *extProcHost) setServing(on bool) {
	st := healthpb.HealthCheckResponse_SERVING
	if !on {
		st = healthpb.HealthCheckResponse_NOT_SERVING
	}
	h.health.SetServingStatus(envoyharness.DefaultHealthCheck().Service, st)
}

func (h *extProcHost) streams() int {
	h.proc.mu.Lock()
	defer h.proc.mu.Unlock()
	return len(h.proc.streams)
}

// fastChecks is the bootstrap's health check with a short interval (the thresholds as
// generated), so that tests wait for ejections in milliseconds.
func fastChecks() envoyharness.HealthCheck {
	hc := envoyharness.DefaultHealthCheck()
	hc.Interval = 20 * time.Millisecond
	return hc
}

// clusterHarness starts a harness whose ext_proc cluster is active (priority 0) and standby
// (priority 1), in front of one upstream, on route "/" of cluster web.
func clusterHarness(t *testing.T, active, standby []*extProcHost, hc envoyharness.HealthCheck, opts ...envoyharness.Option) (*envoyharness.Harness, *upstream.Server) {
	t.Helper()
	up, err := upstream.Start("u")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = up.Close() })
	addrs := func(hs []*extProcHost) (out []string) {
		for _, h := range hs {
			out = append(out, h.addr)
		}
		return out
	}
	vhosts := []envoyharness.VirtualHost{{Name: "any", Domains: []string{"*"}, Routes: []envoyharness.Route{
		{Name: "web", PathPrefix: "/", Cluster: "web", Service: "web"}}}}
	h, err := envoyharness.New("", envoyharness.EndpointsFunc(func(string) []envoyharness.Endpoint {
		return []envoyharness.Endpoint{{Address: up.Addr(), Healthy: true}}
	}), vhosts, append([]envoyharness.Option{envoyharness.WithExtProcCluster(addrs(active), addrs(standby), hc)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = h.Close() })
	return h, up
}

func continueAll(req *extprocv3.ProcessingRequest) (*extprocv3.ProcessingResponse, error) {
	return cont(req), nil
}

// spread sends n requests and returns how many side streams each host got.
func spread(t *testing.T, h *envoyharness.Harness, n int, hosts ...*extProcHost) []int {
	t.Helper()
	before := make([]int, len(hosts))
	for i, hs := range hosts {
		before[i] = hs.streams()
	}
	for range n {
		if r, _ := get(t, h.URL()+"/x"); r.StatusCode != 200 {
			t.Fatalf("request: %d", r.StatusCode)
		}
	}
	out := make([]int, len(hosts))
	for i, hs := range hosts {
		out[i] = hs.streams() - before[i]
	}
	return out
}

// TestClusterBalancesOverHealthyHosts: new side streams go round robin over the healthy hosts.
// A host answering NOT_SERVING is ejected at that one check (an ACTIVE failure ignores the
// unhealthy threshold); one that cannot be reached only after unhealthy_threshold (2) network
// failures in a row; one success brings a host back (healthy_threshold 1).
func TestClusterBalancesOverHealthyHosts(t *testing.T) {
	a, b, c := startHost(t, continueAll), startHost(t, continueAll), startHost(t, continueAll)
	h, _ := clusterHarness(t, []*extProcHost{a, b, c}, nil, fastChecks())
	for _, hs := range []*extProcHost{a, b, c} {
		if !h.HostHealthy(hs.addr) {
			t.Fatalf("host %s not healthy once New returned: the first check round makes hosts healthy", hs.addr)
		}
	}
	if got := spread(t, h, 30, a, b, c); !slices.Equal(got, []int{10, 10, 10}) {
		t.Errorf("side streams per host with all healthy: %v, want round robin [10 10 10]", got)
	}

	b.setServing(false)
	testutil.Eventually(t, "b ejected", func() bool { return !h.HostHealthy(b.addr) })
	if ej := h.HostHealthOf(b.addr).Ejections; !slices.Equal(ej, []uint32{1}) {
		t.Errorf("b's ejections %v: want one, at its first NOT_SERVING answer", ej)
	}
	if got := spread(t, h, 30, a, b, c); !slices.Equal(got, []int{15, 0, 15}) {
		t.Errorf("side streams per host with b NOT_SERVING: %v, want [15 0 15]", got)
	}
	b.setServing(true)
	testutil.Eventually(t, "b back", func() bool { return h.HostHealthy(b.addr) })

	c.gs.Stop() // connection refused from now on: network failures
	testutil.Eventually(t, "c ejected", func() bool { return !h.HostHealthy(c.addr) })
	if ej := h.HostHealthOf(c.addr).Ejections; !slices.Equal(ej, []uint32{envoyharness.DefaultHealthCheck().UnhealthyThreshold}) {
		t.Errorf("c's ejections %v: want one, after the unhealthy threshold's network failures", ej)
	}
	if got := spread(t, h, 30, a, b); got[0]+got[1] != 30 || got[0] != 15 {
		t.Errorf("side streams per host with c down: %v, want [15 15]", got)
	}
}

// TestClusterSideStreamStaysOnItsHost: a long exchange's side stream stays on the host it
// opened on after that host is ejected; only new exchanges move.
func TestClusterSideStreamStaysOnItsHost(t *testing.T) {
	a, b := startHost(t, continueAll), startHost(t, continueAll)
	h, up := clusterHarness(t, []*extProcHost{a, b}, nil, fastChecks())
	// Round robin starts at the first host.
	resp, err := http.Get(h.URL() + "/count?interval=5ms")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = resp.Body.Close() }()
	br := bufio.NewReader(resp.Body)
	if _, err := br.ReadString('\n'); err != nil {
		t.Fatal(err)
	}
	if a.streams() != 1 || b.streams() != 0 {
		t.Fatalf("streams a %d b %d, want the first on a", a.streams(), b.streams())
	}
	a.setServing(false)
	testutil.Eventually(t, "a ejected", func() bool { return !h.HostHealthy(a.addr) })
	if got := spread(t, h, 4, a, b); !slices.Equal(got, []int{0, 4}) {
		t.Errorf("new side streams with a ejected: %v, want all on b", got)
	}
	for range 10 { // the long exchange goes on through a's side stream
		if _, err := br.ReadString('\n'); err != nil {
			t.Fatalf("the long exchange after its host was ejected: %v", err)
		}
	}
	rec := a.proc.stream(t, 0)
	select {
	case <-rec.ended:
		t.Fatal("the long exchange's side stream on a ended when a was ejected")
	default:
	}
	up.Release() // the count stream ends cleanly
	if got := waitEnded(t, rec); got != "eof" && got != "canceled" {
		t.Errorf("a's side stream ended by %q, want the exchange's end", got)
	}
}

// TestClusterPrefersActiveOverStandby: the standby (priority 1) gets new side streams only
// while the active host is unhealthy.
func TestClusterPrefersActiveOverStandby(t *testing.T) {
	a, s := startHost(t, continueAll), startHost(t, continueAll)
	h, _ := clusterHarness(t, []*extProcHost{a}, []*extProcHost{s}, fastChecks())
	if got := spread(t, h, 6, a, s); !slices.Equal(got, []int{6, 0}) {
		t.Errorf("with the active healthy: %v, want all on it", got)
	}
	a.setServing(false)
	testutil.Eventually(t, "a ejected", func() bool { return !h.HostHealthy(a.addr) })
	if got := spread(t, h, 6, a, s); !slices.Equal(got, []int{0, 6}) {
		t.Errorf("with the active ejected: %v, want all on the standby", got)
	}
	a.setServing(true)
	testutil.Eventually(t, "a back", func() bool { return h.HostHealthy(a.addr) })
	if got := spread(t, h, 6, a, s); !slices.Equal(got, []int{6, 0}) {
		t.Errorf("with the active back: %v, want all on it", got)
	}
}

// TestClusterRetriesTheSideStreamOpen: a host the health check still holds healthy but whose
// listener is gone (a replica stopped before the check noticed) costs no request: the
// generated retry_policy (connect-failure) reopens the side stream on another host. A host
// that refuses the stream with UNAVAILABLE before answering is retried too; a failure after
// the first answer is not (the router retries only before response headers). Without the
// retry policy the same requests fail with status_on_error.
func TestClusterRetriesTheSideStreamOpen(t *testing.T) {
	slowChecks := envoyharness.DefaultHealthCheck()
	slowChecks.Interval = time.Hour // after the first round, no check notices anything
	for _, tc := range []struct {
		name      string
		retry     bool
		wantFails bool
	}{{"generated retry_policy", true, false}, {"no retry_policy", false, true}} {
		t.Run(tc.name, func(t *testing.T) {
			a, b := startHost(t, continueAll), startHost(t, continueAll)
			var opts []envoyharness.Option
			if !tc.retry {
				opts = append(opts, envoyharness.WithRetryPolicy(nil))
			}
			h, _ := clusterHarness(t, []*extProcHost{a, b}, nil, slowChecks, opts...)
			b.gs.Stop()
			fails := 0
			for range 10 {
				if r, _ := get(t, h.URL()+"/x"); r.StatusCode != 200 {
					fails++
				}
			}
			if !h.HostHealthy(b.addr) {
				t.Fatal("b was ejected: the test needs the health check not to notice")
			}
			if (fails > 0) != tc.wantFails {
				t.Errorf("%d of 10 requests failed with b's listener gone; retries %d", fails, h.Stats().Retries)
			}
			if tc.retry && h.Stats().Retries == 0 {
				t.Error("no retry counted")
			}
		})
	}

	t.Run("UNAVAILABLE before any answer", func(t *testing.T) {
		refuse := func(req *extprocv3.ProcessingRequest) (*extprocv3.ProcessingResponse, error) {
			return nil, status.Error(codes.Unavailable, "draining")
		}
		a, b := startHost(t, continueAll), startHost(t, refuse)
		h, _ := clusterHarness(t, []*extProcHost{a, b}, nil, slowChecks)
		for i := range 6 {
			if r, _ := get(t, h.URL()+"/x"); r.StatusCode != 200 {
				t.Fatalf("request %d: %d, want the refused stream retried on a", i, r.StatusCode)
			}
		}
		if n := h.Stats().Retries; n == 0 || n != uint64(b.streams()) {
			t.Errorf("retries %d, streams refused by b %d: want one retry per refusal", n, b.streams())
		}
	})

	t.Run("failure after the first answer", func(t *testing.T) {
		failLate := func(req *extprocv3.ProcessingRequest) (*extprocv3.ProcessingResponse, error) {
			if req.GetResponseHeaders() != nil {
				return nil, status.Error(codes.Unavailable, "gone")
			}
			return cont(req), nil
		}
		a := startHost(t, failLate)
		b := startHost(t, failLate)
		h, _ := clusterHarness(t, []*extProcHost{a, b}, nil, slowChecks)
		r, _ := get(t, h.URL()+"/x")
		if r.StatusCode != 503 || h.Stats().Retries != 0 {
			t.Errorf("status %d, retries %d: want status_on_error and no retry", r.StatusCode, h.Stats().Retries)
		}
	})
}

// TestClusterInitializesAfterTheFirstChecks: New returns once every host had a first check; a
// host down at start is not healthy and gets no side stream.
func TestClusterInitializesAfterTheFirstChecks(t *testing.T) {
	a, b, c := startHost(t, continueAll), startHost(t, continueAll), startHost(t, continueAll)
	c.gs.Stop()
	h, _ := clusterHarness(t, []*extProcHost{a, b, c}, nil, fastChecks())
	if hh := h.HostHealthOf(c.addr); hh.Healthy || hh.Failed == 0 {
		t.Errorf("c (down) after New: %+v, want checked and unhealthy", hh)
	}
	if got := spread(t, h, 10, a, b); got[0]+got[1] != 10 {
		t.Errorf("side streams %v: want all on a and b", got)
	}
	if n := h.StreamsOpenedOn(c.addr); n != 0 {
		t.Errorf("%d side streams opened on c", n)
	}
}

// TestClusterUnderConcurrentFlaps: requests in flight keep working while a host flaps in and
// out of the cluster (no lock-up, no 5xx).
func TestClusterUnderConcurrentFlaps(t *testing.T) {
	a, b, c := startHost(t, continueAll), startHost(t, continueAll), startHost(t, continueAll)
	h, _ := clusterHarness(t, []*extProcHost{a, b, c}, nil, fastChecks())
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for range 4 {
		wg.Go(func() {
			for ctx.Err() == nil {
				resp, err := http.Get(h.URL() + "/x")
				if err != nil {
					errs <- err
					return
				}
				_ = resp.Body.Close()
				if resp.StatusCode != 200 {
					errs <- fmt.Errorf("status %d", resp.StatusCode)
					return
				}
			}
		})
	}
	for range 5 {
		b.setServing(false)
		testutil.Eventually(t, "b ejected", func() bool { return !h.HostHealthy(b.addr) })
		b.setServing(true)
		testutil.Eventually(t, "b back", func() bool { return h.HostHealthy(b.addr) })
	}
	cancel()
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}
