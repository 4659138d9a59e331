package extproc

import (
	"context"
	"errors"
	"io"
	"sync"
	"sync/atomic"
	"time"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// Handing exchanges off at shutdown.
//
// A side stream that fails after the response headers went downstream makes Envoy reset the
// client's stream (Filter::onGrpcError → a local reply, which can only be a reset once the
// response started). A side stream the server ends with status OK makes Envoy carry the
// exchange on without ext_proc (Filter::onGrpcClose → processing_complete_; gRPC's A93 client:
// failProcStream on io.EOF → bypass). So an exchange tether has fully answered — its response
// headers answered (the Set-Cookie / Mcp-Session-Id are out) and, for MCP SSE, its session id
// learned — can be handed off: its Process call returns nil and Envoy goes on alone.
//
// Such an exchange registers with the server once it is ready (serveHandoffable). From then on
// its stream is read by a helper goroutine so the exchange's own goroutine can end it the
// moment HandOff is called, whatever the stream is doing. Before it is ready an exchange is
// never handed off: it finishes normally (a drain waits for it).
//
// FULL_DUPLEX_STREAMED: Envoy keeps no copy of a body chunk it sent to tether, so a chunk in
// flight when the stream ends is lost (the protocol's remedy, request_drain_responses, is not
// implemented in Envoy). Every chunk tether has received is answered (echoed) before it
// returns, and it returns only after the stream has been quiet for the handoff quiet period
// (WithHandoffQuiet), at most DefaultHandoffMaxWait after HandOff: a chunk Envoy sends after
// that point can still be lost.

// Defaults of the handoff.
const (
	// DefaultHandoffQuiet is how long a full-duplex exchange's stream must carry no message
	// before it is handed off.
	DefaultHandoffQuiet = 50 * time.Millisecond
	// DefaultHandoffMaxWait bounds the wait for that quiet period.
	DefaultHandoffMaxWait = 5 * time.Second
)

// WithHandoffQuiet sets the quiet period a full-duplex exchange waits for before it is handed
// off (default DefaultHandoffQuiet). d ≤ 0 keeps the default.
func WithHandoffQuiet(d time.Duration) Option {
	return func(s *Server) {
		if d > 0 {
			s.handoffs.quiet = d
		}
	}
}

// handoffs is the set of exchanges ready to be handed off.
type handoffs struct {
	quiet time.Duration
	on    atomic.Bool // HandOff was called: every ready exchange is handed off
	mu    sync.Mutex
	set   map[*exchange]struct{}
	done  atomic.Uint64 // exchanges handed off
	// refused counts exchanges whose Decision refused the handoff (HandOff's error).
	refused atomic.Uint64
}

// HandOff hands every exchange that tether has fully answered off to Envoy: its side stream
// ends with status OK and Envoy carries the exchange on without ext_proc. Exchanges that
// become ready later are handed off as soon as they are. Exchanges not yet ready (no response
// headers answered, an MCP SSE session id still to learn) go on normally. Call it after Drain,
// once Envoy's health checks have moved new streams away. Idempotent; safe for concurrent use.
//
// A handed-off exchange's Decision ends with its HandOff, which keeps the request slot taken
// for as long as the exchange can still last (a detached hold with shared slots; released with
// this process's own counters). An exchange whose HandOff refuses (shared slots and a service
// without maxLifetime, a lapsed lease, Redis unreachable) is not handed off: it is served
// until it ends, and a drain resets it at its deadline (Stats().HandoffRefused counts them).
func (s *Server) HandOff() {
	if s.handoffs.on.Swap(true) {
		return
	}
	s.handoffs.mu.Lock()
	n := len(s.handoffs.set)
	for ex := range s.handoffs.set {
		ex.signalHandoff()
	}
	s.handoffs.mu.Unlock()
	s.log.Info("ext_proc handing exchanges off", "ready", n)
}

// Handoffable returns how many open exchanges are ready to be handed off now.
func (s *Server) Handoffable() int {
	s.handoffs.mu.Lock()
	defer s.handoffs.mu.Unlock()
	return len(s.handoffs.set)
}

func (s *Server) register(ex *exchange) {
	ex.handoff = make(chan struct{})
	s.handoffs.mu.Lock()
	if s.handoffs.set == nil {
		s.handoffs.set = map[*exchange]struct{}{}
	}
	s.handoffs.set[ex] = struct{}{}
	s.handoffs.mu.Unlock()
	if s.handoffs.on.Load() {
		ex.signalHandoff()
	}
}

func (s *Server) unregister(ex *exchange) {
	s.handoffs.mu.Lock()
	delete(s.handoffs.set, ex)
	s.handoffs.mu.Unlock()
}

func (ex *exchange) signalHandoff() {
	ex.handoffOnce.Do(func() { close(ex.handoff) })
}

// handoffReady reports whether tether has said everything it will say to this exchange: the
// response headers are answered and no SSE session id is still to be learned.
func (ex *exchange) handoffReady() bool {
	return ex.decision != nil && ex.answeredResponse && ex.sse == nil
}

type received struct {
	req *extprocv3.ProcessingRequest
	err error
}

// serveHandoffable serves the rest of a ready exchange's stream: a helper goroutine receives,
// this one answers, and ends the stream with OK once HandOff is called (after a quiet period
// in full duplex) and the exchange's Decision let it go (handOff).
func (s *Server) serveHandoffable(ctx context.Context, stream extprocv3.ExternalProcessor_ProcessServer, ex *exchange) error {
	s.register(ex)
	defer s.unregister(ex)
	msgs := make(chan received)
	stop := make(chan struct{})
	defer close(stop)
	go receiveInto(stream, msgs, stop)
	w := &handoffWait{signal: ex.handoff}
	defer w.stop()
	for {
		select {
		case r := <-msgs:
			if done, err := s.serveOne(ctx, stream, ex, r); done || err != nil {
				return err
			}
			w.activity(s.handoffs.quiet)
			continue
		case <-w.signal:
			w.signal = nil
			if ex.fullDuplexRequest || ex.fullDuplexResponse {
				w.startQuiet(s.handoffs.quiet)
				continue
			}
		case <-w.quiet:
			select { // a message the helper already holds is answered first
			case r := <-msgs:
				if done, err := s.serveOne(ctx, stream, ex, r); done || err != nil {
					return err
				}
				w.activity(s.handoffs.quiet)
				continue
			default:
			}
			w.end()
		case <-w.maxWait:
			w.end()
		}
		if s.handOff(ctx, ex) {
			return nil
		}
	}
}

// receiveInto receives stream's messages into msgs until an error (sent too) or stop.
func receiveInto(stream extprocv3.ExternalProcessor_ProcessServer, msgs chan<- received, stop <-chan struct{}) {
	for {
		req, err := stream.Recv()
		select {
		case msgs <- received{req, err}:
		case <-stop:
			return
		}
		if err != nil {
			return
		}
	}
}

// handoffWait is where a ready exchange stands on its way to a handoff: the HandOff signal
// still to come, then (full duplex) the quiet period and its bound.
type handoffWait struct {
	signal       <-chan struct{}
	quiet        <-chan time.Time
	maxWait      <-chan time.Time
	quietTimer   *time.Timer
	maxWaitTimer *time.Timer
}

// startQuiet starts waiting for a quiet stream, at most DefaultHandoffMaxWait.
func (w *handoffWait) startQuiet(quiet time.Duration) {
	w.quietTimer = time.NewTimer(quiet)
	w.quiet = w.quietTimer.C
	w.maxWaitTimer = time.NewTimer(DefaultHandoffMaxWait)
	w.maxWait = w.maxWaitTimer.C
}

// activity restarts the quiet period after a message.
func (w *handoffWait) activity(quiet time.Duration) {
	if w.quiet != nil {
		w.quietTimer.Reset(quiet)
	}
}

// end stops waiting (a handoff is tried now, once).
func (w *handoffWait) end() { w.quiet, w.maxWait = nil, nil }

func (w *handoffWait) stop() {
	if w.quietTimer != nil {
		w.quietTimer.Stop()
		w.maxWaitTimer.Stop()
	}
}

// serveOne answers one received message as Process does; done reports the stream's end (err
// is then its status, nil for OK).
func (s *Server) serveOne(ctx context.Context, stream extprocv3.ExternalProcessor_ProcessServer, ex *exchange, r received) (bool, error) {
	if r.err != nil {
		return true, recvError(ctx, r.err)
	}
	resp, done, err := ex.handle(ctx, stream, r.req)
	if err != nil {
		return true, err
	}
	if resp != nil {
		if err := ex.send(resp); err != nil {
			return true, err
		}
	}
	return done, nil
}

// recvError maps the end of a stream's receive side to the handler's result: Envoy's
// half-close and cancellation end the exchange.
func recvError(ctx context.Context, err error) error {
	if errors.Is(err, io.EOF) {
		return nil
	}
	if status.Code(err) == codes.Canceled || ctx.Err() != nil {
		return status.FromContextError(context.Canceled).Err()
	}
	return err
}

// handOff hands a ready exchange off: its Decision's HandOff keeps the request slot taken
// for as long as the exchange can last (or refuses), and then the stream ends with OK. A
// refused exchange stays with this server, served as before, until it ends or the server
// stops (a drain resets it at its deadline); it is not tried again.
func (s *Server) handOff(ctx context.Context, ex *exchange) bool {
	if ex.decision != nil {
		if err := ex.decision.HandOff(ctx); err != nil {
			s.handoffs.refused.Add(1)
			s.log.Warn("ext_proc: not handing an exchange off: its request slot cannot stay counted after it (it stays until it ends or the drain's deadline)",
				"service", ex.service, "instance", ex.chosen, "err", err)
			return false
		}
		ex.decision = nil // ended by HandOff
	}
	s.handoffs.done.Add(1)
	s.log.Debug("ext_proc exchange handed off", "service", ex.service, "instance", ex.chosen)
	return true
}
