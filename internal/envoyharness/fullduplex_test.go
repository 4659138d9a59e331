package envoyharness_test

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	filterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/grpc"

	"github.com/tether-dev/tether/internal/envoyharness"
	"github.com/tether-dev/tether/internal/upstream"
)

// TestRequestAndResponseStreamIndependently: as in Envoy, the response of a POST streams to the
// client while the client is still sending the request body. The upstream answers at once and
// echoes the body when it has it all; the client sends the second half of its body only after
// it got the first response event. A harness that lets Go's server consume the request body
// when the response starts (no full duplex) never delivers that first event; worse, the
// upstream transport's read of a body the server has closed makes it close the upstream
// connection mid-response, which cut MCP tools/call streams (internal/mcpe2e).
func TestRequestAndResponseStreamIndependently(t *testing.T) {
	upLn, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	up := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_ = http.NewResponseController(w).EnableFullDuplex()
		w.Header().Set("Content-Type", "text/event-stream")
		w.WriteHeader(http.StatusOK)
		_, _ = fmt.Fprint(w, "data: started\n\n") // a failed write shows as a missing event at the client
		w.(http.Flusher).Flush()
		body, _ := io.ReadAll(r.Body)
		_, _ = fmt.Fprintf(w, "data: %s\n\n", body)
	})}
	go func() { _ = up.Serve(upLn) }()
	t.Cleanup(func() { _ = up.Close() })
	dest := upLn.Addr().String()

	p := &processor{answer: func(req *extprocv3.ProcessingRequest) (*extprocv3.ProcessingResponse, error) {
		if _, ok := req.GetRequest().(*extprocv3.ProcessingRequest_RequestHeaders); ok {
			return route(dest), nil
		}
		return cont(req), nil
	}}
	gs := grpc.NewServer()
	extprocv3.RegisterExternalProcessorServer(gs, p)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = gs.Serve(ln) }()
	t.Cleanup(gs.Stop)
	vhosts := []envoyharness.VirtualHost{{Name: "any", Domains: []string{"*"}, Routes: []envoyharness.Route{
		{Name: "web", PathPrefix: "/", Cluster: "web", Service: "web"},
	}}}
	h, err := envoyharness.New(ln.Addr().String(), envoyharness.EndpointsFunc(func(string) []envoyharness.Endpoint {
		return []envoyharness.Endpoint{{Address: dest, Healthy: true}}
	}), vhosts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = h.Close() })

	const want = "data: started\n\ndata: 0123456789\n\n"
	for i := range 3 {
		got, err := interleavedPOST(strings.TrimPrefix(h.URL(), "http://"))
		if err != nil || got != want {
			t.Fatalf("attempt %d: got %q, %v; want %q", i, got, err, want)
		}
	}
	if s := h.Stats(); s.UpstreamErrors != 0 || s.LocalReplies != 0 {
		t.Errorf("stats %+v: want no upstream errors and no local replies", s)
	}
}

// TestLocalReplyToPOSTKeepsTheConnection: a POST answered by an ImmediateResponse, its body
// never forwarded, leaves the client's keep-alive connection usable for the next request.
func TestLocalReplyToPOSTKeepsTheConnection(t *testing.T) {
	p := &processor{answer: func(req *extprocv3.ProcessingRequest) (*extprocv3.ProcessingResponse, error) {
		return &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ImmediateResponse{ImmediateResponse: &extprocv3.ImmediateResponse{
			Status: &typev3.HttpStatus{Code: typev3.StatusCode_NotFound},
			Body:   []byte(`{"errorCode":"SessionNotFound"}`),
		}}}, nil
	}}
	gs := grpc.NewServer()
	extprocv3.RegisterExternalProcessorServer(gs, p)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = gs.Serve(ln) }()
	t.Cleanup(gs.Stop)
	vhosts := []envoyharness.VirtualHost{{Name: "any", Domains: []string{"*"}, Routes: []envoyharness.Route{
		{Name: "web", PathPrefix: "/", Cluster: "web", Service: "web"},
	}}}
	h, err := envoyharness.New(ln.Addr().String(), envoyharness.EndpointsFunc(func(string) []envoyharness.Endpoint { return nil }), vhosts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = h.Close() })

	c, err := net.Dial("tcp", strings.TrimPrefix(h.URL(), "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = c.Close() }()
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	br := bufio.NewReader(c)
	for i := range 3 {
		body := strings.Repeat("x", 100*(i+1))
		if _, err := fmt.Fprintf(c, "POST /mcp HTTP/1.1\r\nHost: h\r\nContent-Length: %d\r\n\r\n%s", len(body), body); err != nil {
			t.Fatalf("request %d: %v", i, err)
		}
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatalf("request %d on the same connection: %v", i, err)
		}
		b, err := io.ReadAll(resp.Body)
		_ = resp.Body.Close()
		if err != nil || resp.StatusCode != http.StatusNotFound || string(b) != `{"errorCode":"SessionNotFound"}` {
			t.Fatalf("request %d: %d %q %v, want the local 404", i, resp.StatusCode, b, err)
		}
	}
}

// interleavedPOST sends a POST with a 10-byte body over a raw connection, sending the second
// half of the body only after the first response line arrived, and returns the response body.
func interleavedPOST(addr string) (string, error) {
	c, err := net.Dial("tcp", addr)
	if err != nil {
		return "", err
	}
	defer func() { _ = c.Close() }()
	_ = c.SetDeadline(time.Now().Add(3 * time.Second))
	if _, err := io.WriteString(c, "POST /call HTTP/1.1\r\nHost: "+addr+"\r\nContent-Length: 10\r\n\r\n01234"); err != nil {
		return "", err
	}
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		return "", fmt.Errorf("response headers while the request body was incomplete: %w", err)
	}
	defer func() { _ = resp.Body.Close() }()
	rd := bufio.NewReader(resp.Body)
	first, err := rd.ReadString('\n')
	if err != nil {
		return first, fmt.Errorf("first event while the request body was incomplete: %w", err)
	}
	if _, err := io.WriteString(c, "56789"); err != nil {
		return first, err
	}
	rest, err := io.ReadAll(rd)
	return first + string(rest), err
}

// TestFullDuplexPlainContinueIsSpurious: with FULL_DUPLEX_STREAMED response bodies, a body
// chunk answered with a plain CONTINUE (no streamed_response) is a spurious message, as in
// Envoy AI Gateway's default config: the data plane fails closed — the response already
// started, so the downstream stream is reset and the chunk never reaches the client.
func TestFullDuplexPlainContinueIsSpurious(t *testing.T) {
	fd := &filterv3.ProcessingMode{
		RequestHeaderMode: filterv3.ProcessingMode_SEND, ResponseHeaderMode: filterv3.ProcessingMode_SEND,
		RequestBodyMode: filterv3.ProcessingMode_FULL_DUPLEX_STREAMED, ResponseBodyMode: filterv3.ProcessingMode_FULL_DUPLEX_STREAMED,
		RequestTrailerMode: filterv3.ProcessingMode_SEND, ResponseTrailerMode: filterv3.ProcessingMode_SEND,
	}
	for _, tc := range []struct {
		name     string
		streamed bool
		wantBody bool
		spurious uint64
	}{{"streamed answers pass the body", true, true, 0}, {"plain CONTINUE on a chunk", false, false, 1}} {
		t.Run(tc.name, func(t *testing.T) {
			p := &processor{answer: func(req *extprocv3.ProcessingRequest) (*extprocv3.ProcessingResponse, error) {
				if b := req.GetResponseBody(); b != nil && tc.streamed {
					return &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ResponseBody{ResponseBody: &extprocv3.BodyResponse{
						Response: &extprocv3.CommonResponse{BodyMutation: &extprocv3.BodyMutation{Mutation: &extprocv3.BodyMutation_StreamedResponse{
							StreamedResponse: &extprocv3.StreamedBodyResponse{Body: b.GetBody(), EndOfStream: b.GetEndOfStream()}}}}}}}, nil
				}
				return cont(req), nil
			}}
			gs := grpc.NewServer()
			extprocv3.RegisterExternalProcessorServer(gs, p)
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			go func() { _ = gs.Serve(ln) }()
			t.Cleanup(gs.Stop)
			up, err := upstream.Start("u1")
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = up.Close() })
			vhosts := []envoyharness.VirtualHost{{Name: "any", Domains: []string{"*"}, Routes: []envoyharness.Route{
				{Name: "web", PathPrefix: "/", Cluster: "web", Service: "web"}}}}
			h, err := envoyharness.New(ln.Addr().String(), envoyharness.EndpointsFunc(func(string) []envoyharness.Endpoint {
				return []envoyharness.Endpoint{{Address: up.Addr(), Healthy: true}}
			}), vhosts, envoyharness.WithProcessingMode(fd))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = h.Close() })
			resp, err := http.Get(h.URL() + "/")
			var body []byte
			if err == nil {
				body, err = io.ReadAll(resp.Body)
				_ = resp.Body.Close()
			}
			if got := err == nil && string(body) == "u1\n"; got != tc.wantBody {
				t.Errorf("body %q, err %v; want the body delivered: %v", body, err, tc.wantBody)
			}
			if s := h.Stats(); s.SpuriousMessages != tc.spurious {
				t.Errorf("spurious messages %d, want %d", s.SpuriousMessages, tc.spurious)
			}
		})
	}
}
