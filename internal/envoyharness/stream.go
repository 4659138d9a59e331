package envoyharness

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"time"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/metadata"
)

// CloseMode is how the harness ends an ext_proc stream, modelling Envoy's options.
type CloseMode int

const (
	// CloseEnvoy is Envoy's default (ExternalProcessorStreamImpl::close): half-close, then reset
	// at once. The server's Recv returns io.EOF or codes.Canceled, whichever it sees first.
	CloseEnvoy CloseMode = iota
	// CloseGraceful models envoy.reloadable_features.ext_proc_graceful_grpc_close: half-close,
	// wait up to RemoteCloseTimeout for the server to end the stream, then reset. The server
	// sees io.EOF.
	CloseGraceful
	// CloseReset resets the stream without half-closing (a client abort, or a connection
	// failure). The server sees codes.Canceled.
	CloseReset
)

// errStreamClosed is the end of a side stream the harness closed itself.
var errStreamClosed = errors.New("side stream closed")

// RemoteCloseTimeout is Envoy's default for graceful close
// (envoy.filters.http.ext_proc.remote_close_timeout_milliseconds).
const RemoteCloseTimeout = time.Second

// outcome of waiting for the processor's answer.
type outcome int

const (
	gotResponse    outcome = iota
	timedOut               // message_timeout fired
	streamFailed           // the stream ended with a non-OK status (onGrpcError)
	streamClosed           // the stream ended with OK before answering (onGrpcClose)
	downstreamGone         // the client went away while we waited
)

type recvResult struct {
	resp *extprocv3.ProcessingResponse
	err  error
}

// sideStream is one ext_proc stream as Envoy's filter holds it. A single reader goroutine
// feeds recv; the request goroutine sends and waits.
type sideStream struct {
	stream extprocv3.ExternalProcessor_ProcessClient
	cancel context.CancelFunc
	mode   CloseMode
	recv   chan recvResult
	// reqBody, when set, receives the answers to request_body messages (FULL_DUPLEX_STREAMED
	// request bodies stream concurrently with the rest of the exchange); it is closed when the
	// stream ends.
	reqBody   chan *extprocv3.ProcessingResponse
	sendMu    sync.Mutex    // Send is not safe for concurrent use (body pumps send too)
	readerOut chan struct{} // closed when the reader goroutine exits
	closeOnce sync.Once
	// ended is set once the stream has ended (status received); err is its final error
	// (io.EOF for OK).
	ended  bool
	endErr error
}

func openSideStream(pool *connPool, service, serviceKey string, mode CloseMode, demuxRequestBody bool) (*sideStream, error) {
	pc, err := pool.acquire()
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	if service != "" {
		ctx = metadata.AppendToOutgoingContext(ctx, serviceKey, service)
	}
	st, err := pc.client.Process(ctx)
	if err != nil {
		cancel()
		pool.release(pc)
		return nil, err
	}
	s := &sideStream{stream: st, cancel: cancel, mode: mode, recv: make(chan recvResult, 8), readerOut: make(chan struct{})}
	if demuxRequestBody {
		s.reqBody = make(chan *extprocv3.ProcessingResponse, 64)
	}
	go func() {
		s.read()
		pool.release(pc)
	}()
	return s, nil
}

func (s *sideStream) read() {
	defer close(s.readerOut)
	if s.reqBody != nil {
		defer close(s.reqBody)
	}
	for {
		resp, err := s.stream.Recv()
		if err == nil && s.reqBody != nil && resp.GetRequestBody() != nil {
			s.reqBody <- resp
			continue
		}
		s.recv <- recvResult{resp, err}
		if err != nil {
			return
		}
	}
}

func (s *sideStream) send(req *extprocv3.ProcessingRequest) error {
	s.sendMu.Lock()
	defer s.sendMu.Unlock()
	return s.stream.Send(req)
}

// await waits for the next message within timeout.
func (s *sideStream) await(ctx context.Context, timeout time.Duration) (*extprocv3.ProcessingResponse, outcome, error) {
	if s.ended {
		return nil, s.endOutcome(), s.endErr
	}
	t := time.NewTimer(timeout)
	defer t.Stop()
	select {
	case r, ok := <-s.recv:
		if !ok { // closed by close(): the stream is gone
			r = recvResult{err: errStreamClosed}
		}
		resp, out := s.take(r)
		return resp, out, r.err
	case <-t.C:
		return nil, timedOut, nil
	case <-ctx.Done():
		return nil, downstreamGone, ctx.Err()
	}
}

func (s *sideStream) endOutcome() outcome {
	if errors.Is(s.endErr, io.EOF) {
		return streamClosed
	}
	return streamFailed
}

// take applies one event read from recv: the end of the stream (recorded) or a message.
func (s *sideStream) take(r recvResult) (*extprocv3.ProcessingResponse, outcome) {
	if r.err != nil {
		s.ended, s.endErr = true, r.err
		return nil, s.endOutcome()
	}
	return r.resp, gotResponse
}

// watcher waits, on its own goroutine, for whatever the processor sends while the exchange
// expects nothing (a body passing by in body mode NONE, the wait for upstream trailers).
// Envoy reacts to such an event when it arrives — onGrpcError / onGrpcClose / onReceiveMessage
// run from the gRPC client's callbacks (ext_proc.cc, Filter::onGrpcError, Filter::onGrpcClose;
// client_impl.cc, ExternalProcessorStreamImpl::onRemoteClose), not when the next body chunk
// does — so the harness must too. The owner calls stop before it reads the stream again.
type watcher struct {
	s      *sideStream
	halt   chan struct{}
	done   chan struct{}
	got    *recvResult
	halted bool
}

// watch starts a watcher; onEvent runs on the watcher's goroutine with the event it saw
// (before stop returns it).
func (s *sideStream) watch(onEvent func(recvResult)) *watcher {
	w := &watcher{s: s, halt: make(chan struct{}), done: make(chan struct{})}
	if s.ended {
		close(w.done)
		return w
	}
	go func() {
		defer close(w.done)
		select {
		case r, ok := <-s.recv:
			if !ok {
				r = recvResult{err: errStreamClosed}
			}
			w.got = &r
			onEvent(r)
		case <-w.halt:
		}
	}()
	return w
}

// stop ends the watch and applies the event it saw, if any: ok false when there was none.
func (w *watcher) stop() (*extprocv3.ProcessingResponse, outcome, bool) {
	if !w.halted {
		w.halted = true
		close(w.halt)
	}
	<-w.done
	if w.got == nil {
		return nil, 0, false
	}
	r := *w.got
	w.got = nil
	resp, out := w.s.take(r)
	return resp, out, true
}

// close ends the stream once, per the close mode.
func (s *sideStream) close() {
	s.closeOnce.Do(func() {
		switch s.mode {
		case CloseGraceful:
			s.closeSend()
			select {
			case <-s.readerOut:
			case <-time.After(RemoteCloseTimeout):
			}
			s.cancel()
		case CloseReset:
			s.cancel()
		default:
			s.closeSend()
			s.cancel()
		}
		// Drain so the reader goroutine can exit.
		go func() {
			for range s.recv {
			}
		}()
		if s.reqBody != nil {
			go func() {
				for range s.reqBody {
				}
			}()
		}
		go func() {
			<-s.readerOut
			close(s.recv)
		}()
	})
}

// closeSend half-closes the stream after any send in flight (grpc-go forbids CloseSend
// concurrently with Send; a body pump may be sending). Envoy's side stream lives on one
// thread, so its last message always precedes the close. A send blocked on flow control
// longer than RemoteCloseTimeout is cut by cancelling the stream.
func (s *sideStream) closeSend() {
	done := make(chan struct{})
	go func() {
		s.sendMu.Lock()
		_ = s.stream.CloseSend()
		s.sendMu.Unlock()
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(RemoteCloseTimeout):
		s.cancel()
		<-done
	}
}

// streamsPerConn is grpc-go's client default for SETTINGS_MAX_CONCURRENT_STREAMS when the server
// does not announce one: past it, new streams would wait. Envoy's HTTP/2 pool opens another
// connection instead, and so does connPool.
const streamsPerConn = 100

// connPool holds the HTTP/2 connections to the ext_proc server, like Envoy's connection pool
// for the ext_proc cluster: a new connection when every open one carries streamsPerConn streams.
type connPool struct {
	addr string
	// keepalive is the HTTP/2 PING interval and timeout (the bootstrap's connection_keepalive);
	// zero interval sends none.
	keepalive, keepaliveTimeout time.Duration
	mu                          sync.Mutex
	conns                       []*poolConn
}

type poolConn struct {
	conn   *grpc.ClientConn
	client extprocv3.ExternalProcessorClient
	active int
}

func (p *connPool) dial() (*poolConn, error) {
	opts := []grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}
	if p.keepalive > 0 {
		// Envoy pings every connection_keepalive.interval whether or not streams are open
		// (PermitWithoutStream). grpc-go's client will not ping more often than every 10 s.
		opts = append(opts, grpc.WithKeepaliveParams(keepalive.ClientParameters{
			Time: p.keepalive, Timeout: p.keepaliveTimeout, PermitWithoutStream: true,
		}))
	}
	conn, err := grpc.NewClient(p.addr, opts...)
	if err != nil {
		return nil, fmt.Errorf("envoyharness: dial ext_proc %s: %w", p.addr, err)
	}
	pc := &poolConn{conn: conn, client: extprocv3.NewExternalProcessorClient(conn)}
	p.mu.Lock()
	p.conns = append(p.conns, pc)
	p.mu.Unlock()
	return pc, nil
}

func (p *connPool) acquire() (*poolConn, error) {
	p.mu.Lock()
	for _, pc := range p.conns {
		if pc.active < streamsPerConn {
			pc.active++
			p.mu.Unlock()
			return pc, nil
		}
	}
	p.mu.Unlock()
	pc, err := p.dial()
	if err != nil {
		return nil, err
	}
	p.mu.Lock()
	pc.active++
	p.mu.Unlock()
	return pc, nil
}

func (p *connPool) release(pc *poolConn) {
	p.mu.Lock()
	pc.active--
	p.mu.Unlock()
}

func (p *connPool) close() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	var first error
	for _, pc := range p.conns {
		if err := pc.conn.Close(); err != nil && first == nil {
			first = err
		}
	}
	return first
}
