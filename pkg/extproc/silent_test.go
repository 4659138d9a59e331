package extproc_test

import (
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/tether-dev/tether/internal/testutil"
	"github.com/tether-dev/tether/pkg/affinity/affinitytest"
	"github.com/tether-dev/tether/pkg/extproc"
	"github.com/tether-dev/tether/pkg/registry"
)

// TestSilentStreamsAreClosed is the regression test for the idle-stream finding of issue 14
// (20,000 ext_proc streams that never sent a message were held forever): streams without a
// first message are closed with DEADLINE_EXCEEDED after the first-message timeout and
// counted, while a stream that spoke in time stays open however long its exchange idles.
//
// With ServerOptions the timeout cancels the stream's context (first.go); on a gRPC server
// without them (plain) a helper goroutine waits for the first message instead.
func TestSilentStreamsAreClosed(t *testing.T) {
	for _, tc := range []struct {
		name string
		opts []grpc.ServerOption
	}{{"ServerOptions", extproc.ServerOptions()}, {"plain", nil}} {
		t.Run(tc.name, func(t *testing.T) { testSilentStreams(t, tc.opts) })
	}
}

func testSilentStreams(t *testing.T, grpcOpts []grpc.ServerOption) {
	const timeout, silent = 300 * time.Millisecond, 50
	svc := affinitytest.Service("web", registry.AffinityCookie)
	f := affinitytest.New(t, []registry.Service{svc}, affinitytest.Instances("web", 2))
	e := newEnvOn(t, f, f.Engine, grpcOpts, extproc.WithFirstMessageTimeout(timeout))

	live, _ := e.open(t, "web")
	dest := destination(roundTrip(t, live, reqHeaders("GET", "/", true)))

	errs := make(chan error, silent)
	for range silent {
		st, _ := e.open(t, "web")
		go func() {
			_, err := st.Recv()
			errs <- err
		}()
	}
	for range silent {
		if err := <-errs; status.Code(err) != codes.DeadlineExceeded {
			t.Fatalf("silent stream ended with %v, want DEADLINE_EXCEEDED", err)
		}
	}
	testutil.Eventually(t, "silent streams counted and closed", func() bool {
		s := e.srv.Stats()
		return s.SilentStreamsClosed == silent && s.OpenStreams == 1
	})
	// The live stream has now idled past the timeout too, and is still served.
	roundTrip(t, live, respHeaders("200", dest, true))
	closeAndWait(t, live)
	e.counter.waitAllEnded(t)
	if s := e.srv.Stats(); s.OpenStreams != 0 || s.Decisions != 1 {
		t.Errorf("stats %+v; want no open stream and the one decision", s)
	}
}
