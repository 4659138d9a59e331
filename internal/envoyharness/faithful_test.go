package envoyharness_test

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	filterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/tether-dev/tether/internal/envoyharness"
	"github.com/tether-dev/tether/internal/testutil"
	"github.com/tether-dev/tether/pkg/extproc"
)

// Each test here fails on the harness as it was before the fix it names (see the Envoy source
// references in the harness's comments).

// oneUpstream serves h on loopback (a real HTTP/1.1 server) and returns its address.
func oneUpstream(t *testing.T, h http.HandlerFunc) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })
	return ln.Addr().String()
}

// harnessFor starts a harness in front of proc (a scripted processor) and the upstream at
// addr, on the route "/" of cluster "web".
func harnessFor(t *testing.T, p *processor, addr string, opts ...envoyharness.Option) *envoyharness.Harness {
	t.Helper()
	return harnessWith(t, p, envoyharness.EndpointsFunc(func(string) []envoyharness.Endpoint {
		return []envoyharness.Endpoint{{Address: addr, Healthy: true}}
	}), nil, opts...)
}

func harnessWith(t *testing.T, p extprocv3.ExternalProcessorServer, eps envoyharness.EndpointSource, sopts []grpc.ServerOption, opts ...envoyharness.Option) *envoyharness.Harness {
	t.Helper()
	gs := grpc.NewServer(sopts...)
	extprocv3.RegisterExternalProcessorServer(gs, p)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = gs.Serve(ln) }()
	t.Cleanup(gs.Stop)
	vhosts := []envoyharness.VirtualHost{{Name: "any", Domains: []string{"*"}, Routes: []envoyharness.Route{
		{Name: "web", PathPrefix: "/", Cluster: "web", Service: "web"}}}}
	h, err := envoyharness.New(ln.Addr().String(), eps, vhosts, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = h.Close() })
	return h
}

// idleAfterFirstLine writes headers and one line, then nothing until the client goes away
// (or 10 s pass, then the body ends cleanly).
func idleAfterFirstLine(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Type", "text/event-stream")
	w.WriteHeader(http.StatusOK)
	_, _ = io.WriteString(w, "first\n")
	w.(http.Flusher).Flush()
	select {
	case <-r.Context().Done():
	case <-time.After(10 * time.Second):
	}
}

// TestSideStreamFailureResetsTheClientAtOnce: bodies NONE, the processor fails the side
// stream after the response started while the upstream sends nothing more. Envoy resets the
// client at once (onGrpcError); the old harness noticed only when another body chunk came,
// and when none came it ended the body cleanly.
func TestSideStreamFailureResetsTheClientAtOnce(t *testing.T) {
	fail := make(chan struct{})
	p := &processor{answer: func(req *extprocv3.ProcessingRequest) (*extprocv3.ProcessingResponse, error) {
		if req.GetResponseHeaders() != nil {
			return cont(req), nil
		}
		if req.GetRequestHeaders() != nil {
			return cont(req), nil
		}
		return nil, nil
	}}
	wrapped := &failingProcessor{processor: p, fail: fail}
	h := harnessWith(t, wrapped, envoyharness.EndpointsFunc(func(string) []envoyharness.Endpoint {
		return []envoyharness.Endpoint{{Address: oneUpstream(t, idleAfterFirstLine), Healthy: true}}
	}), nil)
	resp, err := http.Get(h.URL() + "/")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = resp.Body.Close() }()
	br := bufio.NewReader(resp.Body)
	if line, err := br.ReadString('\n'); err != nil || line != "first\n" {
		t.Fatalf("first line %q, %v", line, err)
	}
	close(fail) // the side stream ends with UNAVAILABLE, as when tether's process dies
	rest, err := io.ReadAll(br)
	if err == nil {
		t.Fatalf("the body ended cleanly (%q) after the side stream failed; Envoy resets the client", rest)
	}
	if s := h.Stats(); s.StreamErrors != 1 {
		t.Errorf("stream errors %d, want 1", s.StreamErrors)
	}
}

// failingProcessor runs processor's script and ends every stream with UNAVAILABLE once fail
// is closed (after at least one answer).
type failingProcessor struct {
	*processor
	fail chan struct{}
}

func (f *failingProcessor) Process(st extprocv3.ExternalProcessor_ProcessServer) error {
	done := make(chan error, 1)
	go func() { done <- f.processor.Process(st) }()
	select {
	case err := <-done:
		return err
	case <-f.fail:
		return status.Error(codes.Unavailable, "processor going away")
	}
}

// TestServerOKCloseLetsTheBodyGoOn: the processor ends the side stream with OK after the
// response headers: Envoy continues without ext_proc (onGrpcClose → processing_complete_), so
// the rest of the body reaches the client and nothing is reset.
func TestServerOKCloseLetsTheBodyGoOn(t *testing.T) {
	release := make(chan struct{})
	p := &processor{answer: func(req *extprocv3.ProcessingRequest) (*extprocv3.ProcessingResponse, error) {
		return cont(req), nil
	}}
	ok := &okClosingProcessor{processor: p, close: make(chan struct{})}
	h := harnessWith(t, ok, envoyharness.EndpointsFunc(func(string) []envoyharness.Endpoint {
		return []envoyharness.Endpoint{{Address: oneUpstream(t, func(w http.ResponseWriter, r *http.Request) {
			w.WriteHeader(http.StatusOK)
			_, _ = io.WriteString(w, "first\n")
			w.(http.Flusher).Flush()
			<-release
			_, _ = io.WriteString(w, "second\n")
		}), Healthy: true}}
	}), nil)
	resp, err := http.Get(h.URL() + "/")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = resp.Body.Close() }()
	br := bufio.NewReader(resp.Body)
	if line, _ := br.ReadString('\n'); line != "first\n" {
		t.Fatalf("first line %q", line)
	}
	close(ok.close)
	waitEnded(t, p.stream(t, 0))
	testutil.Eventually(t, "the harness to see the server's close", func() bool {
		return h.Stats().StreamsClosedByServer == 1
	})
	close(release)
	rest, err := io.ReadAll(br)
	if err != nil || string(rest) != "second\n" {
		t.Fatalf("rest of the body %q, %v; want it delivered after the OK close", rest, err)
	}
	if s := h.Stats(); s.StreamErrors != 0 {
		t.Errorf("stats %+v, want no stream error", s)
	}
}

// okClosingProcessor ends every stream with OK once close is closed.
type okClosingProcessor struct {
	*processor
	close chan struct{}
}

func (o *okClosingProcessor) Process(st extprocv3.ExternalProcessor_ProcessServer) error {
	done := make(chan error, 1)
	go func() { done <- o.processor.Process(st) }()
	select {
	case err := <-done:
		return err
	case <-o.close:
		return nil
	}
}

// TestResponseHeadersReachTheClientAtOnce: Envoy encodes response headers downstream as soon
// as ext_proc lets them through, before any body byte; the old harness held them until the
// first body write, so an upstream that answers headers and then waits looked like "no
// response yet".
func TestResponseHeadersReachTheClientAtOnce(t *testing.T) {
	gotHeaders := make(chan struct{})
	var timedOut atomic.Bool
	addr := oneUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusOK)
		w.(http.Flusher).Flush()
		select {
		case <-gotHeaders:
		case <-time.After(10 * time.Second):
			timedOut.Store(true)
		}
		_, _ = io.WriteString(w, "body\n")
	})
	h := harnessFor(t, &processor{answer: func(req *extprocv3.ProcessingRequest) (*extprocv3.ProcessingResponse, error) {
		return cont(req), nil
	}}, addr)
	resp, err := http.Get(h.URL() + "/")
	if err != nil {
		t.Fatal(err)
	}
	close(gotHeaders)
	b, err := io.ReadAll(resp.Body)
	_ = resp.Body.Close()
	if err != nil || string(b) != "body\n" || resp.StatusCode != 200 {
		t.Fatalf("response %d %q %v", resp.StatusCode, b, err)
	}
	if timedOut.Load() {
		t.Error("the client got the headers only with the body; Envoy flushes them at once")
	}
}

var fullDuplexMode = &filterv3.ProcessingMode{
	RequestHeaderMode: filterv3.ProcessingMode_SEND, ResponseHeaderMode: filterv3.ProcessingMode_SEND,
	RequestBodyMode: filterv3.ProcessingMode_FULL_DUPLEX_STREAMED, ResponseBodyMode: filterv3.ProcessingMode_FULL_DUPLEX_STREAMED,
	RequestTrailerMode: filterv3.ProcessingMode_SEND, ResponseTrailerMode: filterv3.ProcessingMode_SEND,
}

// echoBody answers full-duplex body chunks with themselves and everything else with CONTINUE.
func echoBody(req *extprocv3.ProcessingRequest) *extprocv3.ProcessingResponse {
	mk := func(b *extprocv3.HttpBody) *extprocv3.BodyResponse {
		return &extprocv3.BodyResponse{Response: &extprocv3.CommonResponse{BodyMutation: &extprocv3.BodyMutation{
			Mutation: &extprocv3.BodyMutation_StreamedResponse{StreamedResponse: &extprocv3.StreamedBodyResponse{
				Body: b.GetBody(), EndOfStream: b.GetEndOfStream()}}}}}
	}
	switch {
	case req.GetResponseBody() != nil:
		return &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ResponseBody{ResponseBody: mk(req.GetResponseBody())}}
	case req.GetRequestBody() != nil:
		return &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_RequestBody{RequestBody: mk(req.GetRequestBody())}}
	}
	return cont(req)
}

// TestFullDuplexArmsNoMessageTimeout: Envoy arms no message timer in a direction whose body
// mode is FULL_DUPLEX_STREAMED, headers answers included; the old harness answered a slow
// headers answer on a full-duplex route with 504.
func TestFullDuplexArmsNoMessageTimeout(t *testing.T) {
	const timeout = 50 * time.Millisecond
	p := &processor{answer: func(req *extprocv3.ProcessingRequest) (*extprocv3.ProcessingResponse, error) {
		if req.GetRequestHeaders() != nil || req.GetResponseHeaders() != nil {
			time.Sleep(4 * timeout) // a processor slower than message_timeout
		}
		return echoBody(req), nil
	}}
	h := harnessFor(t, p, oneUpstream(t, func(w http.ResponseWriter, r *http.Request) { _, _ = io.WriteString(w, "ok\n") }),
		envoyharness.WithProcessingMode(fullDuplexMode), envoyharness.WithMessageTimeout(timeout))
	resp, body := get(t, h.URL()+"/")
	if resp.StatusCode != 200 || body != "ok\n" {
		t.Fatalf("response %d %q, want 200 ok (no message_timeout in full duplex)", resp.StatusCode, body)
	}
	if s := h.Stats(); s.MessageTimeouts != 0 {
		t.Errorf("message timeouts %d, want 0", s.MessageTimeouts)
	}
}

// TestFullDuplexSpuriousRequestBodyAnswer: a request_body chunk answered with a plain
// CONTINUE is spurious; Envoy fails closed with a local reply (status_on_error) that does not
// pass through ext_proc. The old harness turned it into a router 503 sent to the processor as
// response_headers.
func TestFullDuplexSpuriousRequestBodyAnswer(t *testing.T) {
	p := &processor{answer: func(req *extprocv3.ProcessingRequest) (*extprocv3.ProcessingResponse, error) {
		if req.GetRequestBody() != nil {
			return cont(req), nil // no streamed_response: spurious in full duplex
		}
		return echoBody(req), nil
	}}
	h := harnessFor(t, p, oneUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		_, _ = io.WriteString(w, "ok\n")
	}), envoyharness.WithProcessingMode(fullDuplexMode))
	resp, err := http.Post(h.URL()+"/", "text/plain", strings.NewReader("hello"))
	if err != nil {
		t.Fatal(err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	_ = resp.Body.Close()
	if resp.StatusCode != http.StatusServiceUnavailable {
		t.Errorf("status %d, want status_on_error 503", resp.StatusCode)
	}
	rec := p.stream(t, 0)
	waitEnded(t, rec)
	for _, m := range rec.messages() {
		if m.GetResponseHeaders() != nil {
			t.Errorf("the processor was sent response_headers %v; Envoy's local reply skips ext_proc", m.GetResponseHeaders())
		}
	}
	if s := h.Stats(); s.SpuriousMessages != 1 {
		t.Errorf("spurious %d, want 1", s.SpuriousMessages)
	}
}

// TestHTTP1TrailersNeedEnableTrailers: Envoy's HTTP/1 codec drops upstream trailers unless
// the cluster sets enable_trailers; the old harness passed them to ext_proc and the client.
func TestHTTP1TrailersNeedEnableTrailers(t *testing.T) {
	addr := oneUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Trailer", "X-T")
		_, _ = io.WriteString(w, "body\n")
		w.Header().Set("X-T", "1")
	})
	for _, tc := range []struct {
		name    string
		enabled bool
	}{{"default: dropped", false}, {"enable_trailers: kept", true}} {
		t.Run(tc.name, func(t *testing.T) {
			p := &processor{answer: func(req *extprocv3.ProcessingRequest) (*extprocv3.ProcessingResponse, error) { return cont(req), nil }}
			var eps envoyharness.EndpointSource = envoyharness.EndpointsFunc(func(string) []envoyharness.Endpoint {
				return []envoyharness.Endpoint{{Address: addr, Healthy: true}}
			})
			if tc.enabled {
				eps = trailersOn{eps.(envoyharness.EndpointsFunc)}
			}
			h := harnessWith(t, p, eps, nil)
			resp, err := http.Get(h.URL() + "/")
			if err != nil {
				t.Fatal(err)
			}
			_, _ = io.ReadAll(resp.Body)
			_ = resp.Body.Close()
			if got := resp.Trailer.Get("X-T") == "1"; got != tc.enabled {
				t.Errorf("client trailer X-T %q, want present: %v", resp.Trailer.Get("X-T"), tc.enabled)
			}
			rec := p.stream(t, 0)
			waitEnded(t, rec)
			sent := false
			for _, m := range rec.messages() {
				sent = sent || m.GetResponseTrailers() != nil
			}
			if sent != tc.enabled {
				t.Errorf("response_trailers sent to ext_proc: %v, want %v", sent, tc.enabled)
			}
		})
	}
}

// TestKeepalivePingsMeetTheServerPolicy: the harness pings its ext_proc connections as
// Envoy's bootstrap does (connection_keepalive). A server with grpc-go's default enforcement
// (one ping per 5 minutes) answers pings every 10 s with GOAWAY too_many_pings and the idle
// long exchange it carried is reset; tether's ServerOptions accept them and the exchange lives
// on. The old harness sent no pings, so nothing ever tested tether's policy.
func TestKeepalivePingsMeetTheServerPolicy(t *testing.T) {
	if testing.Short() {
		t.Skip("needs three 10 s keepalive intervals")
	}
	type result struct {
		name string
		err  error
	}
	results := make(chan result, 2)
	var tetherBody *bufio.Reader
	hold := make(chan struct{})
	defer close(hold)
	addr := oneUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusOK)
		_, _ = io.WriteString(w, "first\n")
		w.(http.Flusher).Flush()
		select {
		case <-r.Context().Done():
		case <-hold:
		}
	})
	eps := envoyharness.EndpointsFunc(func(string) []envoyharness.Endpoint {
		return []envoyharness.Endpoint{{Address: addr, Healthy: true}}
	})
	start := func(name string, sopts []grpc.ServerOption) *bufio.Reader {
		p := &processor{answer: func(req *extprocv3.ProcessingRequest) (*extprocv3.ProcessingResponse, error) { return cont(req), nil }}
		h := harnessWith(t, p, eps, sopts, envoyharness.WithKeepalive(10*time.Second, 5*time.Second))
		resp, err := http.Get(h.URL() + "/")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = resp.Body.Close() })
		br := bufio.NewReader(resp.Body)
		if line, err := br.ReadString('\n'); err != nil || line != "first\n" {
			t.Fatalf("%s: first line %q %v", name, line, err)
		}
		return br
	}
	defaultBody := start("grpc-go default policy", nil)
	tetherBody = start("tether policy", extproc.ServerOptions())
	go func() {
		_, err := io.ReadAll(defaultBody)
		results <- result{"default", err}
	}()
	var r result
	select {
	case r = <-results: // the default policy's GOAWAY after the third ping resets this exchange
	case <-time.After(90 * time.Second):
		t.Fatal("the exchange on the default-policy server is still open after nine ping intervals: no keepalive pings?")
	}
	if r.err == nil {
		t.Fatal("the exchange on the default-policy server ended cleanly; want a reset by too_many_pings")
	}
	// The tether-policy exchange saw as many pings by now and is still open: its next read
	// blocks until hold is closed; a reset would return at once.
	go func() {
		_, err := tetherBody.ReadByte()
		results <- result{"tether", err}
	}()
	select {
	case r := <-results:
		t.Fatalf("the exchange on tether's policy ended (%v) under keepalive pings", r.err)
	case <-time.After(12 * time.Second): // one more ping interval
	}
}
