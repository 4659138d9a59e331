package extproc

import (
	"context"
	"sync/atomic"
	"time"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/tap"
)

// The first-message timeout without a goroutine per stream: the InTapHandle of ServerOptions
// gives every Process stream a context the server may cancel (grpc-go's receive path waits on
// the stream's context, which is the one the tap returns), and Process arms a timer that
// cancels it unless the first message arrived. Without the tap (a grpc.Server built without
// ServerOptions) the first Recv runs on a helper goroutine instead (recvFirst).

// silentGuard is a Process stream's cancellable context (firstMessageTap).
type silentGuard struct {
	context.Context // from context.WithCancelCause
	cancel          context.CancelCauseFunc
	// md is the stream's initial metadata (the tap's view of it, the same map the handler's
	// incoming context holds): read without the copy metadata.ValueFromIncomingContext makes.
	md metadata.MD
	// state: 0 waiting for the first message, 1 it arrived, 2 the timer fired first.
	state atomic.Int32
}

type silentGuardKey struct{}

// Value returns the guard itself for silentGuardKey.
func (g *silentGuard) Value(key any) any {
	if key == (silentGuardKey{}) {
		return g
	}
	return g.Context.Value(key)
}

// Err reports context.DeadlineExceeded once the first-message timeout cancelled the stream:
// grpc-go answers a receive that ended with the context's error with that status (before the
// handler returns), so the client sees DEADLINE_EXCEEDED as without the tap.
func (g *silentGuard) Err() error {
	err := g.Context.Err()
	if err != nil && g.state.Load() == 2 {
		return context.DeadlineExceeded
	}
	return err
}

// expire is the timer's end: the stream is cancelled unless its first message won the race.
func (g *silentGuard) expire() {
	if g.state.CompareAndSwap(0, 2) {
		g.cancel(errSilentStream)
	}
}

// spoke records the first message; false when the timer had fired first.
func (g *silentGuard) spoke() bool { return g.state.CompareAndSwap(0, 1) || g.state.Load() == 1 }

// firstMessageTap is the InTapHandle of ServerOptions: it gives each ext_proc Process stream
// a silentGuard context and leaves every other method's context alone.
func firstMessageTap(ctx context.Context, info *tap.Info) (context.Context, error) {
	if info.FullMethodName != extprocv3.ExternalProcessor_Process_FullMethodName {
		return ctx, nil
	}
	c, cancel := context.WithCancelCause(ctx)
	return &silentGuard{Context: c, cancel: cancel, md: info.Header}, nil
}

// recvFirstGuarded receives a stream's first message under the guard's timer. A stream that
// stays silent past the timeout ends with errSilentStream.
func (s *Server) recvFirstGuarded(stream extprocv3.ExternalProcessor_ProcessServer, g *silentGuard) (*extprocv3.ProcessingRequest, error) {
	t := time.AfterFunc(s.firstTimeout, g.expire)
	req, err := stream.Recv()
	t.Stop()
	if !g.spoke() {
		s.silentStream()
		return nil, errSilentStream
	}
	return req, err
}

// silentStream counts and logs a stream closed for not speaking in time.
func (s *Server) silentStream() {
	s.counters.silentClosed.Add(1)
	s.log.Debug("ext_proc stream closed: no first message", "timeout", s.firstTimeout)
}
