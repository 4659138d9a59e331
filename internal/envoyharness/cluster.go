package envoyharness

import (
	"context"
	"errors"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	"github.com/tether-dev/tether/pkg/wire"
)

// The ext_proc cluster as Envoy holds it: the static cluster of the generated bootstrap
// (pkg/xds controlPlaneCluster: every replica's ext_proc address, a standby at priority 1)
// with its active gRPC health check (grpcHealthCheck: interval, timeout, unhealthy and healthy
// thresholds from pkg/wire) and round-robin load balancing (the cluster sets no lb_policy), and
// the grpc_service retry_policy applied to the side stream's open (xds.ExtProcRetryPolicy).
//
// What Envoy does, from its source:
//   - Health checking (source/extensions/health_checkers/grpc/health_checker_impl.cc,
//     GrpcHealthCheckerImpl::GrpcActiveHealthCheckSession::onRpcComplete; and
//     source/extensions/health_checkers/common/health_checker_base_impl.cc,
//     HealthCheckerImplBase::ActiveHealthCheckSession::setUnhealthy / handleSuccess): a check
//     answered with anything but SERVING is an ACTIVE failure and ejects the host at once; a
//     network failure or a timeout (NETWORK, NETWORK_TIMEOUT, onTimeoutBase) ejects it only at
//     the unhealthy_threshold-th in a row. The first result ever seen for a host that passes
//     makes it healthy at once (first_check_); later it takes healthy_threshold successes.
//     The next check is armed one interval after the previous result (interval_timer_ in
//     handleSuccess / handleFailure; unhealthy_interval and the edge intervals default to
//     interval). Hosts start failed and pending (HealthCheckerImplBase::addHosts), and a
//     cluster with active health checking initializes once every host had its first check
//     (the harness's New waits for that round).
//   - Host selection (source/common/upstream/load_balancer_impl.cc,
//     LoadBalancerBase::recalculatePerPriorityState / choosePriority, and
//     ZoneAwareLoadBalancerBase::hostSourceToUse): each priority's health is
//     min(100, overprovisioning 1.4 × healthy / hosts); the load goes to the lowest priorities
//     that have health, normalized when the total is below 100; a priority whose healthy share
//     is below the panic threshold (50 %) picks among all its hosts (panic mode), and with no
//     healthy host at all priority 0 panics. Round robin within the chosen set
//     (source/extensions/load_balancing_policies/round_robin).
//   - A side stream lives on the host it opened on: the async client's stream is one upstream
//     request (source/common/http/async_client_impl.cc, AsyncStreamImpl), bound to one
//     connection of that host's pool; health changes move only new streams.
//   - retry_policy (source/common/grpc/async_client_impl.cc, AsyncStreamImpl::initialize:
//     the grpc_service's retry_policy becomes the async stream's Router::RetryPolicy; the
//     ext_proc filter opens it with setBufferBodyForRetry(true) in
//     source/extensions/filters/http/ext_proc/client_impl.cc, ExternalProcessorClientImpl::start,
//     so the first message can be replayed): the router (source/common/router/router.cc,
//     Filter::onUpstreamReset / Filter::onUpstreamHeaders with RetryStateImpl::shouldRetryReset /
//     shouldRetryHeaders in source/common/router/retry_state_impl.cc) retries only while no
//     upstream response headers arrived, on connect-failure (the connection could not be made),
//     refused-stream (REFUSED_STREAM) and unavailable (grpc-status 14 in a trailers-only
//     answer); a reset after the stream was accepted ("reset", not in tether's retry_on) is not
//     retried. Each retry picks a host again through the load balancer and waits the jittered
//     exponential back-off (JitteredExponentialBackOffStrategy: a random duration below
//     base × 2^(n-1), at most max_interval). The filter's message_timeout timer runs across the
//     retries: it knows nothing of them.

// HealthCheck is the active gRPC health check of the ext_proc cluster (the generated
// bootstrap's, by default: wire.HealthCheck*).
type HealthCheck struct {
	Interval, Timeout                    time.Duration
	UnhealthyThreshold, HealthyThreshold uint32
	// Service is the grpc.health.v1 service name checked (default the wire contract's).
	Service string
}

// DefaultHealthCheck is the generated bootstrap's health check of the ext_proc cluster.
func DefaultHealthCheck() HealthCheck {
	fc := wire.FilterContract().HealthCheck
	return HealthCheck{Interval: fc.Interval, Timeout: fc.Timeout, UnhealthyThreshold: fc.UnhealthyThreshold,
		HealthyThreshold: fc.HealthyThreshold, Service: fc.Service}
}

// WithExtProcCluster makes the ext_proc cluster several hosts, as the generated bootstrap of
// several replicas does: priority 0 holds the address given to New (if any) and active, priority 1
// holds standby (the bootstrap's controlPlane standby). Every host is health checked with hc.
// Without it the cluster is New's one address and no health check runs: with one host Envoy
// routes to it whatever its health (panic mode), so checking would change nothing.
func WithExtProcCluster(active, standby []string, hc HealthCheck) Option {
	return func(h *Harness) {
		h.clusterActive, h.clusterStandby = active, standby
		if hc.Service == "" {
			hc.Service = DefaultHealthCheck().Service
		}
		h.healthCheck = &hc
	}
}

// WithRetryPolicy sets the grpc_service retry_policy applied to side streams (default the
// generated one, xds.ExtProcRetryPolicy's values; nil: no retries).
func WithRetryPolicy(p *corev3.RetryPolicy) Option {
	return func(h *Harness) { h.retry = retryPolicyOf(p) }
}

// retryPolicy is the part of a RetryPolicy the side stream's open uses.
type retryPolicy struct {
	connectFailure, refusedStream, unavailable bool
	retries                                    int
	base, max                                  time.Duration
}

func retryPolicyOf(p *corev3.RetryPolicy) retryPolicy {
	if p == nil {
		return retryPolicy{}
	}
	rp := retryPolicy{retries: 1, base: 25 * time.Millisecond} // Envoy's defaults (router/retry_state_impl.cc)
	if p.GetNumRetries() != nil {
		rp.retries = int(p.GetNumRetries().GetValue())
	}
	if b := p.GetRetryBackOff(); b != nil {
		rp.base = b.GetBaseInterval().AsDuration()
		if b.GetMaxInterval() != nil {
			rp.max = b.GetMaxInterval().AsDuration()
		}
	}
	if rp.max == 0 {
		rp.max = 10 * rp.base
	}
	for _, on := range strings.Split(p.GetRetryOn(), ",") {
		switch strings.TrimSpace(on) {
		case "connect-failure":
			rp.connectFailure = true
		case "refused-stream":
			rp.refusedStream = true
		case "unavailable":
			rp.unavailable = true
		}
	}
	return rp
}

// backoff is the wait before retry n (1-based): JitteredExponentialBackOffStrategy::nextBackOffMs
// (source/common/common/backoff_strategy.cc), a random duration below base × (2^n − 1), at most
// max_interval.
func (rp retryPolicy) backoff(n int) time.Duration {
	ceil := rp.base * time.Duration(1<<n-1)
	if ceil <= 0 || ceil > rp.max {
		ceil = rp.max
	}
	return time.Duration(rand.Int64N(int64(ceil)))
}

// failureKind is how a side stream's open failed, as the router would classify it.
type failureKind int

const (
	notRetriable   failureKind = iota
	connectFailure             // the host could not be connected to
	refusedStream              // the server refused the stream (REFUSED_STREAM, GOAWAY)
	unavailable                // the server answered grpc-status 14 before any header
)

// classify maps a side stream that ended before any answer to the router's retry condition.
// grpc-go reports all three as codes.Unavailable; its message tells which: a dial error, a
// refused stream, a transport that broke after the stream was sent (a reset: not retried), or
// the server's own status.
func classify(err error) failureKind {
	st, ok := status.FromError(err)
	if !ok || st.Code() != codes.Unavailable {
		return notRetriable
	}
	msg := st.Message()
	switch {
	case strings.Contains(msg, "while dialing"), strings.Contains(msg, "connection refused"),
		strings.Contains(msg, "connection active"): // "no connection active" (the conn is in transient failure)
		return connectFailure
	case strings.Contains(msg, "REFUSED_STREAM"), strings.Contains(msg, "stream refused"),
		strings.Contains(msg, "received goaway"):
		return refusedStream
	case strings.Contains(msg, "transport is closing"), strings.Contains(msg, "error reading from server"),
		strings.Contains(msg, "connection reset"), strings.Contains(msg, "EOF"):
		return notRetriable
	}
	return unavailable
}

func (rp retryPolicy) retriable(k failureKind) bool {
	switch k {
	case connectFailure:
		return rp.connectFailure
	case refusedStream:
		return rp.refusedStream
	case unavailable:
		return rp.unavailable
	}
	return false
}

// host is one ext_proc cluster member.
type host struct {
	addr     string
	priority int
	pool     *connPool
	healthy  atomic.Bool
	// checked closes after the host's first health check result.
	checked chan struct{}
	opened  atomic.Uint64 // side streams opened on it
	// ejections records, for each time the health check took the host out, how many failed
	// checks in a row did.
	mu         sync.Mutex
	ejections  []uint32
	passed     uint64
	failedRuns uint64
}

// cluster is the ext_proc cluster: its hosts, their health, round robin.
type cluster struct {
	hosts []*host
	rr    atomic.Uint64
	hc    *HealthCheck
	stop  context.CancelFunc
	done  sync.WaitGroup
}

func newCluster(active, standby []string, hc *HealthCheck, keepalive, keepaliveTimeout time.Duration) (*cluster, error) {
	c := &cluster{hc: hc}
	for p, addrs := range [][]string{active, standby} {
		for _, a := range addrs {
			hs := &host{addr: a, priority: p, checked: make(chan struct{}),
				pool: &connPool{addr: a, keepalive: keepalive, keepaliveTimeout: keepaliveTimeout}}
			if hc == nil {
				hs.healthy.Store(true)
				close(hs.checked)
			}
			c.hosts = append(c.hosts, hs)
		}
	}
	if len(c.hosts) == 0 {
		return nil, errors.New("envoyharness: the ext_proc cluster has no host")
	}
	return c, nil
}

// start runs the health checks and waits for their first round (cluster initialization),
// at most until ctx ends.
func (c *cluster) start(ctx context.Context) error {
	if c.hc == nil {
		return nil
	}
	runCtx, stop := context.WithCancel(context.Background())
	c.stop = stop
	for _, hs := range c.hosts {
		conn, err := grpc.NewClient(hs.addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			stop()
			return err
		}
		c.done.Go(func() {
			defer func() { _ = conn.Close() }()
			c.check(runCtx, hs, healthpb.NewHealthClient(conn))
		})
	}
	for _, hs := range c.hosts {
		select {
		case <-hs.checked:
		case <-ctx.Done():
			return nil // Envoy initializes the cluster anyway after its timeout
		}
	}
	return nil
}

// check runs one host's active health check until ctx ends.
func (c *cluster) check(ctx context.Context, hs *host, client healthpb.HealthClient) {
	var unhealthy, healthy uint32
	first := true
	for {
		cctx, cancel := context.WithTimeout(ctx, c.hc.Timeout)
		resp, err := client.Check(cctx, &healthpb.HealthCheckRequest{Service: c.hc.Service})
		cancel()
		if ctx.Err() != nil {
			return
		}
		network := false
		if err != nil {
			code := status.Code(err)
			network = code == codes.Unavailable || code == codes.DeadlineExceeded
		}
		hs.mu.Lock()
		if err == nil && resp.GetStatus() == healthpb.HealthCheckResponse_SERVING {
			hs.passed++
			unhealthy = 0
			if !hs.healthy.Load() {
				healthy++
				if first || healthy >= c.hc.HealthyThreshold {
					hs.healthy.Store(true)
				}
			}
		} else {
			hs.failedRuns++
			healthy = 0
			if hs.healthy.Load() {
				unhealthy++
				if !network || unhealthy >= c.hc.UnhealthyThreshold {
					hs.healthy.Store(false)
					hs.ejections = append(hs.ejections, unhealthy)
					unhealthy = 0
				}
			}
		}
		hs.mu.Unlock()
		if first {
			first = false
			close(hs.checked)
		}
		t := time.NewTimer(c.hc.Interval)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
	}
}

// overprovisioning and panicThreshold are Envoy's defaults (1.4 and 50 %).
const (
	overprovisioning = 1.4
	panicThreshold   = 0.5
)

// pick chooses the host for a new side stream.
func (c *cluster) pick() *host {
	if len(c.hosts) == 1 {
		return c.hosts[0]
	}
	var total, healthy [2]int
	for _, hs := range c.hosts {
		total[hs.priority]++
		if hs.healthy.Load() {
			healthy[hs.priority]++
		}
	}
	var health [2]float64
	sum := 0.0
	for p := range health {
		if total[p] > 0 {
			health[p] = min(1, overprovisioning*float64(healthy[p])/float64(total[p]))
		}
		sum += health[p]
	}
	prio := 0
	if sum > 0 {
		// Lowest priorities first, each taking what its health allows of what is left; below
		// a total of 100 % the loads are normalized.
		x := rand.Float64() * min(1, sum)
		for p := range health {
			if x < health[p] || p == len(health)-1 {
				prio = p
				break
			}
			x -= health[p]
		}
		if total[prio] == 0 {
			prio = 0
		}
	}
	panicMode := total[prio] == 0 || float64(healthy[prio])/float64(total[prio]) < panicThreshold
	var set []*host
	for _, hs := range c.hosts {
		if hs.priority == prio && (panicMode || hs.healthy.Load()) {
			set = append(set, hs)
		}
	}
	if len(set) == 0 {
		set = c.hosts
	}
	return set[int(c.rr.Add(1)-1)%len(set)]
}

func (c *cluster) close() error {
	if c.stop != nil {
		c.stop()
		c.done.Wait()
	}
	var first error
	for _, hs := range c.hosts {
		if err := hs.pool.close(); err != nil && first == nil {
			first = err
		}
	}
	return first
}

// HostHealthy reports whether the harness's health check holds the ext_proc host at addr
// healthy (false for an unknown address).
func (h *Harness) HostHealthy(addr string) bool {
	for _, hs := range h.cluster.hosts {
		if hs.addr == addr {
			return hs.healthy.Load()
		}
	}
	return false
}

// HostHealth is what the health check saw of one ext_proc host.
type HostHealth struct {
	Healthy bool
	// Passed and Failed count the checks.
	Passed, Failed uint64
	// Ejections lists, for each time the host was taken out, how many failed checks in a row
	// did it (1 for an answer other than SERVING; the unhealthy threshold for network failures
	// and timeouts).
	Ejections []uint32
}

// HostHealthOf returns the health check's view of the ext_proc host at addr.
func (h *Harness) HostHealthOf(addr string) HostHealth {
	for _, hs := range h.cluster.hosts {
		if hs.addr == addr {
			hs.mu.Lock()
			defer hs.mu.Unlock()
			return HostHealth{Healthy: hs.healthy.Load(), Passed: hs.passed, Failed: hs.failedRuns,
				Ejections: append([]uint32(nil), hs.ejections...)}
		}
	}
	return HostHealth{}
}

// StreamsOpenedOn returns how many side streams were opened on the ext_proc host at addr.
func (h *Harness) StreamsOpenedOn(addr string) uint64 {
	for _, hs := range h.cluster.hosts {
		if hs.addr == addr {
			return hs.opened.Load()
		}
	}
	return 0
}
