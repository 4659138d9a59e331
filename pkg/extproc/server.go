package extproc

import (
	"context"
	"log/slog"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/status"

	"github.com/tether-dev/tether/pkg/affinity"
	"github.com/tether-dev/tether/pkg/wire"
)

// Engine decides where a request goes. *affinity.Engine implements it. Decide returns a
// *affinity.Reject for refusals; any other error is an internal failure. Implementations must
// be safe for concurrent use.
type Engine interface {
	Decide(ctx context.Context, req affinity.Request) (affinity.Decision, error)
}

// Defaults of the server (the wire contract's names and defaults are pkg/wire's).
const (
	// DefaultSSEScanLimit bounds how many response body bytes are scanned for the MCP SSE
	// endpoint event before giving up.
	DefaultSSEScanLimit = 64 << 10
	// DefaultFirstMessageTimeout bounds how long a new stream may stay silent. Envoy sends
	// request_headers as soon as it opens a stream, so only a broken or hostile client waits.
	DefaultFirstMessageTimeout = 10 * time.Second
)

// Option configures a Server.
type Option func(*Server)

// WithLogger sets the logger; the default discards everything.
func WithLogger(l *slog.Logger) Option { return func(s *Server) { s.log = l } }

// WithDestinationHeader sets the request header that carries the chosen ip:port (default
// x-gateway-destination-endpoint). Names are lower-cased by Envoy; pass a lower-case name.
func WithDestinationHeader(name string) Option {
	return func(s *Server) { s.destHeader = name }
}

// WithMetadataNamespace sets the dynamic metadata namespace for the destination and the
// served host (default envoy.lb).
func WithMetadataNamespace(ns string) Option { return func(s *Server) { s.namespace = ns } }

// WithServedHostKey sets the key under the metadata namespace where Envoy's override_host
// policy reports the host it used (selected_host_key; default
// x-gateway-destination-endpoint-served).
func WithServedHostKey(key string) Option { return func(s *Server) { s.servedKey = key } }

// WithServiceMetadataKey sets the gRPC initial metadata key naming the service (default
// x-tether-service).
func WithServiceMetadataKey(key string) Option { return func(s *Server) { s.serviceKey = key } }

// WithFirstMessageTimeout closes a stream (DEADLINE_EXCEEDED) whose first message has not
// arrived within d, counting it in Stats.SilentStreamsClosed (default
// DefaultFirstMessageTimeout). It bounds what clients that open streams and never speak can
// hold: each such stream costs a goroutine and HTTP/2 state. d ≤ 0 keeps the default.
func WithFirstMessageTimeout(d time.Duration) Option {
	return func(s *Server) {
		if d > 0 {
			s.firstTimeout = d
		}
	}
}

// DecisionTimeout is the deadline of one decision for an Envoy ext_proc message_timeout: four
// fifths of it, so that the response, the network and Envoy's own work fit in the rest. Every
// store call the decision makes runs under it (each is bounded by its own call timeout too).
func DecisionTimeout(messageTimeout time.Duration) time.Duration { return messageTimeout * 4 / 5 }

// WithMessageTimeout sets the message_timeout Envoy's ext_proc filter was given (default
// wire.DefaultMessageTimeout, what tether's generated bootstrap and xDS write): each decision
// gets DecisionTimeout of it as its ctx deadline. d ≤ 0 keeps the default.
func WithMessageTimeout(d time.Duration) Option {
	return func(s *Server) {
		if d > 0 {
			s.decisionTimeout = DecisionTimeout(d)
		}
	}
}

// WithDefaultService names the service of streams whose initial metadata names none — an
// endpoint-picker attachment (Gateway API Inference Extension, Envoy Gateway, Istio), where the
// data plane sends no x-tether-service and the ext_proc listener (or the pool it serves)
// stands for one service. Empty (the default) resolves such streams by :authority and :path.
func WithDefaultService(name string) Option { return func(s *Server) { s.defaultService = name } }

// WithSSEScanLimit bounds how many response body bytes are scanned for the MCP SSE endpoint
// event (default DefaultSSEScanLimit). n ≤ 0 keeps the default.
func WithSSEScanLimit(n int) Option {
	return func(s *Server) {
		if n > 0 {
			s.sseLimit = n
		}
	}
}

// Server implements envoy.service.ext_proc.v3.ExternalProcessorServer and the grpc.health.v1
// service. It is safe for concurrent use: each Process call (one per ext_proc stream) runs on
// its own gRPC goroutine and shares only atomic counters.
type Server struct {
	extprocv3.UnimplementedExternalProcessorServer

	engine     Engine
	log        *slog.Logger
	destHeader string
	namespace  string
	servedKey  string
	serviceKey string
	// defaultService is the service of streams that name none (WithDefaultService).
	defaultService string
	sseLimit       int
	health         *health.Server
	// firstTimeout bounds the wait for a stream's first message.
	firstTimeout time.Duration
	// decisionTimeout is each decision's deadline (DecisionTimeout of the message_timeout).
	decisionTimeout time.Duration

	draining     atomic.Bool
	handoffs     handoffs
	counters     counters
	mismatchLog  logThrottle
	routes       sync.Map // ip:port → *ProcessingResponse (request_headers answer)
	cont         continueResponses
	cachedRoutes atomic.Int64
}

var _ extprocv3.ExternalProcessorServer = (*Server)(nil)

// NewServer returns a Server deciding with engine. Its health service reports SERVING for "",
// ServiceName, LivenessService and ReadinessService; Drain turns all but liveness NOT_SERVING.
func NewServer(engine Engine, opts ...Option) *Server {
	s := &Server{
		engine:     engine,
		log:        slog.New(slog.DiscardHandler),
		destHeader: wire.DestinationHeader,
		namespace:  wire.LBNamespace,
		servedKey:  wire.ServedHostKey,
		serviceKey: wire.ServiceMetadataKey,
		sseLimit:   DefaultSSEScanLimit,
		health:     health.NewServer(),

		firstTimeout:    DefaultFirstMessageTimeout,
		decisionTimeout: DecisionTimeout(wire.DefaultMessageTimeout),
		cont:            newContinueResponses(),
		handoffs:        handoffs{quiet: DefaultHandoffQuiet},
	}
	for _, o := range opts {
		o(s)
	}
	for _, name := range []string{"", wire.ExtProcServiceName, wire.LivenessService, wire.ReadinessService} {
		s.health.SetServingStatus(name, healthpb.HealthCheckResponse_SERVING)
	}
	return s
}

// ServerOptions are the gRPC server options tether's ext_proc listener needs; pass them to
// grpc.NewServer before Register:
//
//   - keepalive enforcement that accepts Envoy's HTTP/2 keepalive pings (the generated bootstrap
//     pings the ext_proc cluster every 30 s, with or without streams); grpc-go's default policy
//     (at most one ping per 5 minutes, none without streams) would answer them with GOAWAY
//     ENHANCE_YOUR_CALM and cut every in-flight stream, failing requests with 503;
//   - server keepalive pings (every 30 s, 5 s timeout), so the streams of a vanished Envoy end
//     and release their request slots instead of waiting for the leak guard;
//   - stream workers: each stream runs on a pooled goroutine whose stack has already grown,
//     saving a stack copy per request (one goroutine per stream still, the Process call);
//   - a codec (gRPC's proto codec plus pre-encoded answers): the request_headers answer of
//     each instance address is encoded once, not per exchange (codec.go);
//   - an InTapHandle giving each Process stream a context the first-message timeout can
//     cancel, so no helper goroutine waits for the first message (first.go).
func ServerOptions() []grpc.ServerOption {
	return []grpc.ServerOption{
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: 10 * time.Second, PermitWithoutStream: true}),
		grpc.KeepaliveParams(keepalive.ServerParameters{Time: 30 * time.Second, Timeout: 5 * time.Second}),
		grpc.NumStreamWorkers(uint32(4 * runtime.GOMAXPROCS(0))),
		grpc.ForceServerCodecV2(newCodec()), // shared answers go out pre-encoded (codec.go)
		grpc.InTapHandle(firstMessageTap),   // the first-message timeout without a goroutine (first.go)
	}
}

// Register registers srv's ext_proc and health services on g.
func Register(g *grpc.Server, srv *Server) {
	extprocv3.RegisterExternalProcessorServer(g, srv)
	healthpb.RegisterHealthServer(g, srv.health)
}

// Health returns the grpc.health.v1 server, for callers that register services themselves.
func (s *Server) Health() healthpb.HealthServer { return s.health }

// Drain starts a graceful drain: the health service reports NOT_SERVING from now on for every
// service but LivenessService (the process is alive; restarting it would cut the streams it
// still serves), so Envoy's health checks move new streams elsewhere, while streams already
// open (and new ones that still arrive) are served normally. Drain is idempotent.
func (s *Server) Drain() {
	if s.draining.Swap(true) {
		return
	}
	for _, name := range []string{"", wire.ExtProcServiceName, wire.ReadinessService} {
		s.health.SetServingStatus(name, healthpb.HealthCheckResponse_NOT_SERVING)
	}
	s.log.Info("ext_proc draining")
}

// Process serves one ext_proc stream: one HTTP exchange. It reads the stream with a single
// Recv loop on the calling goroutine and ends the exchange's Decision exactly once on return.
func (s *Server) Process(stream extprocv3.ExternalProcessor_ProcessServer) error {
	ctx := stream.Context()
	s.counters.streams.Add(1)
	s.counters.open.Add(1)
	defer s.counters.open.Add(-1)
	ex := &exchange{srv: s, stream: stream}
	defer ex.end() // runs first: the Decision ends before the stream counts as closed
	for first := true; ; first = false {
		var req *extprocv3.ProcessingRequest
		var err error
		if first {
			if g, ok := ctx.Value(silentGuardKey{}).(*silentGuard); ok {
				req, err = s.recvFirstGuarded(stream, g)
			} else {
				req, err = s.recvFirst(stream)
			}
		} else {
			req, err = stream.Recv()
		}
		if err != nil {
			if err == errSilentStream { //nolint:errorlint // our own sentinel, returned as is
				return err
			}
			return recvError(ctx, err) // io.EOF: Envoy half-closed, the exchange is over
		}
		resp, done, err := ex.handle(ctx, stream, req)
		if err != nil {
			return err
		}
		if resp != nil {
			if err := ex.send(resp); err != nil {
				return err
			}
		}
		if done {
			// An ImmediateResponse ends Envoy's processing; it closes its side too.
			return nil
		}
		if ex.handoffReady() {
			return s.serveHandoffable(ctx, stream, ex) // handoff.go
		}
	}
}

// errSilentStream ends a stream whose first message did not arrive in time.
var errSilentStream = status.Error(codes.DeadlineExceeded, "ext_proc: no message on the new stream within the first-message timeout")

// recvFirst receives a stream's first message, or gives up after the first-message timeout,
// on a server without ServerOptions' tap (first.go): the Recv runs on a helper goroutine, and
// returning from Process ends the stream, which ends that Recv too. Later messages are
// received on the calling goroutine.
func (s *Server) recvFirst(stream extprocv3.ExternalProcessor_ProcessServer) (*extprocv3.ProcessingRequest, error) {
	type result struct {
		req *extprocv3.ProcessingRequest
		err error
	}
	ch := make(chan result, 1)
	go func() {
		req, err := stream.Recv()
		ch <- result{req, err}
	}()
	t := time.NewTimer(s.firstTimeout)
	defer t.Stop()
	select {
	case r := <-ch:
		return r.req, r.err
	case <-t.C:
		s.silentStream()
		return nil, errSilentStream
	}
}

// Stats is a point-in-time copy of the server's counters. Counters only grow, except
// OpenStreams.
type Stats struct {
	// OpenStreams is the number of ext_proc streams being served now.
	OpenStreams int64
	// Streams counts every stream served since start.
	Streams uint64
	// Decisions counts requests the engine admitted (one Decision each).
	Decisions uint64
	// Rejects counts the engine's refusals by class.
	Rejects RejectCounts
	// EngineErrors counts Decide failures that were not rejections (answered with 500).
	EngineErrors uint64
	// ProtocolErrors counts streams ended because the client broke the ext_proc protocol.
	ProtocolErrors uint64
	// ServedHostMismatches counts responses whose served host (Envoy's selected_host_key)
	// differs from the instance tether chose.
	ServedHostMismatches uint64
	// BodiesStreamed counts responses switched to a STREAMED body for SSE session learning.
	BodiesStreamed uint64
	// SessionsLearned counts MCP SSE session ids learned from endpoint events.
	SessionsLearned uint64
	// LearnFailures counts endpoint events without a usable session id, LearnSession errors and
	// streams whose endpoint event did not appear within the scan limit.
	LearnFailures uint64
	// SilentStreamsClosed counts streams closed because their first message did not arrive
	// within the first-message timeout.
	SilentStreamsClosed uint64
	// ExchangesExpired counts exchanges the engine told to end because they outlived their
	// limit (extProc.maxRequestLifetime; a stream its service's maxLifetime): each was reset.
	ExchangesExpired uint64
	// Draining reports whether Drain was called.
	Draining bool
	// HandoffReady counts open exchanges tether has fully answered (response headers, SSE
	// session id): the ones HandOff would hand off now. HandedOff counts exchanges handed off.
	HandoffReady int
	HandedOff    uint64
	// HandoffRefused counts ready exchanges whose Decision refused the handoff (their slot
	// could not stay counted after them): they stayed with tether.
	HandoffRefused uint64
}

// RejectCounts counts rejections by affinity.Class.
type RejectCounts struct {
	BadRequest      uint64
	NotFound        uint64
	Conflict        uint64
	TooManyRequests uint64
	NoCapacity      uint64
	NoService       uint64
	// Other counts rejections with a class this package does not know (answered with 500).
	Other uint64
}

// Stats returns a snapshot of the counters. Safe for concurrent use.
func (s *Server) Stats() Stats {
	c := &s.counters
	return Stats{
		OpenStreams: c.open.Load(),
		Streams:     c.streams.Load(),
		Decisions:   c.decisions.Load(),
		Rejects: RejectCounts{
			BadRequest:      c.rejects[affinity.ClassBadRequest].Load(),
			NotFound:        c.rejects[affinity.ClassNotFound].Load(),
			Conflict:        c.rejects[affinity.ClassConflict].Load(),
			TooManyRequests: c.rejects[affinity.ClassTooManyRequests].Load(),
			NoCapacity:      c.rejects[affinity.ClassNoCapacity].Load(),
			NoService:       c.rejects[affinity.ClassNoService].Load(),
			Other:           c.rejects[0].Load(),
		},
		EngineErrors:         c.engineErrors.Load(),
		ProtocolErrors:       c.protocolErrors.Load(),
		ServedHostMismatches: c.mismatches.Load(),
		BodiesStreamed:       c.bodiesStreamed.Load(),
		SessionsLearned:      c.learned.Load(),
		LearnFailures:        c.learnFailures.Load(),
		SilentStreamsClosed:  c.silentClosed.Load(),
		ExchangesExpired:     c.expired.Load(),
		Draining:             s.draining.Load(),
		HandoffReady:         s.Handoffable(),
		HandedOff:            s.handoffs.done.Load(),
		HandoffRefused:       s.handoffs.refused.Load(),
	}
}

type counters struct {
	open           atomic.Int64
	streams        atomic.Uint64
	decisions      atomic.Uint64
	rejects        [affinity.ClassNoService + 1]atomic.Uint64 // index 0: unknown class
	engineErrors   atomic.Uint64
	protocolErrors atomic.Uint64
	mismatches     atomic.Uint64
	bodiesStreamed atomic.Uint64
	learned        atomic.Uint64
	learnFailures  atomic.Uint64
	silentClosed   atomic.Uint64
	expired        atomic.Uint64
}

func (c *counters) reject(class affinity.Class) {
	if class < 1 || int(class) >= len(c.rejects) {
		class = 0
	}
	c.rejects[class].Add(1)
}
