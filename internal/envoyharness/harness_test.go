package envoyharness_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	filterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/tether-dev/tether/internal/envoyharness"
	"github.com/tether-dev/tether/internal/testutil"
	"github.com/tether-dev/tether/internal/upstream"
)

// processor is a scripted ext_proc server: the peer whose view of the harness the tests check.
// answer returns the response to each message (nil: no answer; error: end the stream).
type processor struct {
	extprocv3.UnimplementedExternalProcessorServer
	answer func(req *extprocv3.ProcessingRequest) (*extprocv3.ProcessingResponse, error)

	mu      sync.Mutex
	streams []*streamRecord
}

type streamRecord struct {
	mu      sync.Mutex
	md      metadata.MD
	msgs    []*extprocv3.ProcessingRequest
	endedBy string // "eof", "canceled" or the error
	ended   chan struct{}
}

func (r *streamRecord) messages() []*extprocv3.ProcessingRequest {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]*extprocv3.ProcessingRequest(nil), r.msgs...)
}

func (p *processor) Process(st extprocv3.ExternalProcessor_ProcessServer) error {
	md, _ := metadata.FromIncomingContext(st.Context())
	rec := &streamRecord{md: md, ended: make(chan struct{})}
	p.mu.Lock()
	p.streams = append(p.streams, rec)
	p.mu.Unlock()
	defer close(rec.ended)
	for {
		req, err := st.Recv()
		if err != nil {
			rec.mu.Lock()
			switch {
			case errors.Is(err, io.EOF):
				rec.endedBy = "eof"
			case status.Code(err) == codes.Canceled:
				rec.endedBy = "canceled"
			default:
				rec.endedBy = err.Error()
			}
			rec.mu.Unlock()
			return nil
		}
		rec.mu.Lock()
		rec.msgs = append(rec.msgs, req)
		rec.mu.Unlock()
		resp, err := p.answer(req)
		if err != nil {
			rec.mu.Lock()
			rec.endedBy = "server error"
			rec.mu.Unlock()
			return err
		}
		if resp != nil {
			if err := st.Send(resp); err != nil {
				return err
			}
		}
	}
}

func (p *processor) stream(t *testing.T, i int) *streamRecord {
	t.Helper()
	var r *streamRecord
	testutil.EventuallyWithin(t, 5*time.Second, fmt.Sprintf("stream %d to open", i), func() bool {
		p.mu.Lock()
		defer p.mu.Unlock()
		if i < len(p.streams) {
			r = p.streams[i]
		}
		return r != nil
	})
	return r
}

func waitEnded(t *testing.T, r *streamRecord) string {
	t.Helper()
	select {
	case <-r.ended:
	case <-time.After(5 * time.Second):
		t.Fatal("the ext_proc stream did not end")
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.endedBy
}

// route answers request_headers with the destination in metadata and header.
func route(dest string) *extprocv3.ProcessingResponse {
	return &extprocv3.ProcessingResponse{
		Response: &extprocv3.ProcessingResponse_RequestHeaders{RequestHeaders: &extprocv3.HeadersResponse{
			Response: &extprocv3.CommonResponse{HeaderMutation: &extprocv3.HeaderMutation{SetHeaders: []*corev3.HeaderValueOption{{
				Header: &corev3.HeaderValue{Key: "x-gateway-destination-endpoint", RawValue: []byte(dest)},
				Append: wrapperspb.Bool(false),
			}}}},
		}},
		DynamicMetadata: &structpb.Struct{Fields: map[string]*structpb.Value{
			"envoy.lb": structpb.NewStructValue(&structpb.Struct{Fields: map[string]*structpb.Value{
				"x-gateway-destination-endpoint": structpb.NewStringValue(dest),
			}}),
		}},
	}
}

// cont answers any message with an empty CONTINUE of the matching kind.
func cont(req *extprocv3.ProcessingRequest) *extprocv3.ProcessingResponse {
	switch req.GetRequest().(type) {
	case *extprocv3.ProcessingRequest_RequestHeaders:
		return &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_RequestHeaders{RequestHeaders: &extprocv3.HeadersResponse{}}}
	case *extprocv3.ProcessingRequest_ResponseHeaders:
		return &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ResponseHeaders{ResponseHeaders: &extprocv3.HeadersResponse{}}}
	case *extprocv3.ProcessingRequest_ResponseBody:
		return &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ResponseBody{ResponseBody: &extprocv3.BodyResponse{}}}
	case *extprocv3.ProcessingRequest_ResponseTrailers:
		return &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ResponseTrailers{ResponseTrailers: &extprocv3.TrailersResponse{}}}
	case *extprocv3.ProcessingRequest_RequestBody:
		return &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_RequestBody{RequestBody: &extprocv3.BodyResponse{}}}
	}
	return nil
}

// trailersOn is an endpoint source whose HTTP/1 clusters set enable_trailers, as the rig's do
// (so upstream trailers reach ext_proc).
type trailersOn struct{ envoyharness.EndpointsFunc }

func (trailersOn) HTTP1Trailers(string) bool { return true }

type rig struct {
	proc *processor
	h    *envoyharness.Harness
	up   []*upstream.Server
}

func newRig(t *testing.T, answer func(req *extprocv3.ProcessingRequest) (*extprocv3.ProcessingResponse, error), opts ...envoyharness.Option) *rig {
	t.Helper()
	p := &processor{answer: answer}
	gs := grpc.NewServer()
	extprocv3.RegisterExternalProcessorServer(gs, p)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = gs.Serve(ln) }()
	t.Cleanup(gs.Stop)
	var ups []*upstream.Server
	var eps []envoyharness.Endpoint
	for _, id := range []string{"a", "b"} {
		u, err := upstream.Start(id)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = u.Close() })
		ups = append(ups, u)
		eps = append(eps, envoyharness.Endpoint{Address: u.Addr(), Healthy: true})
	}
	vhosts := []envoyharness.VirtualHost{{Name: "any", Domains: []string{"*"}, Routes: []envoyharness.Route{
		{Name: "off", PathPrefix: "/off", Cluster: "web", Disabled: true},
		{Name: "nocluster", PathPrefix: "/nocluster", Cluster: "none", Service: "web"},
		{Name: "web", PathPrefix: "/", Cluster: "web", Service: "web"},
	}}}
	h, err := envoyharness.New(ln.Addr().String(), trailersOn{envoyharness.EndpointsFunc(func(c string) []envoyharness.Endpoint {
		if c == "web" {
			return eps
		}
		return nil
	})}, vhosts, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = h.Close() })
	return &rig{proc: p, h: h, up: ups}
}

// reply is a finished HTTP response: what the tests read of it, the body returned beside it.
type reply struct {
	StatusCode int
	Header     http.Header
}

// get makes a GET with the header pairs hdr and returns the response with its whole body
// (already closed).
func get(t *testing.T, url string, hdr ...string) (reply, string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Add(hdr[i], hdr[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = resp.Body.Close() }()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return reply{StatusCode: resp.StatusCode, Header: resp.Header}, string(b)
}

func headerOf(m *corev3.HeaderMap, key string) string {
	for _, h := range m.GetHeaders() {
		if h.GetKey() == key {
			return string(h.GetRawValue())
		}
	}
	return ""
}

func TestExchangeAsEnvoySendsIt(t *testing.T) {
	var r *rig
	r = newRig(t, func(req *extprocv3.ProcessingRequest) (*extprocv3.ProcessingResponse, error) {
		switch req.GetRequest().(type) {
		case *extprocv3.ProcessingRequest_RequestHeaders:
			return route(r.up[1].Addr()), nil
		case *extprocv3.ProcessingRequest_ResponseHeaders:
			return &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ResponseHeaders{ResponseHeaders: &extprocv3.HeadersResponse{
				Response: &extprocv3.CommonResponse{HeaderMutation: &extprocv3.HeaderMutation{SetHeaders: []*corev3.HeaderValueOption{{
					Header: &corev3.HeaderValue{Key: "set-cookie", RawValue: []byte("t=1")}, Append: wrapperspb.Bool(true),
				}}}},
			}}}, nil
		}
		return cont(req), nil
	})
	resp, body := get(t, r.h.URL()+"/hello?x=1", "X-Upstream-Set-Cookie", "up=1",
		"x-gateway-destination-endpoint", r.up[0].Addr()) // forged; the processor overwrites it
	if body != "b\n" || resp.Header.Get(upstream.InstanceHeader) != "b" {
		t.Fatalf("served by %q (%q), want b", resp.Header.Get(upstream.InstanceHeader), body)
	}
	if got := resp.Header.Values("Set-Cookie"); strings.Join(got, "|") != "up=1|t=1" {
		t.Errorf("Set-Cookie = %q, want the upstream's and the appended one", got)
	}
	seen := r.up[1].Requests()
	if len(seen) != 1 || seen[0].Header.Get("X-Gateway-Destination-Endpoint") != r.up[1].Addr() {
		t.Errorf("upstream b saw %+v, want one request with the overwritten destination header", seen)
	}

	rec := r.proc.stream(t, 0)
	if got := waitEnded(t, rec); got != "eof" && got != "canceled" {
		t.Errorf("stream ended by %q, want EOF or Canceled at the end of the exchange", got)
	}
	if got := rec.md.Get("x-tether-service"); len(got) != 1 || got[0] != "web" {
		t.Errorf("initial metadata x-tether-service = %q, want [web]", got)
	}
	msgs := rec.messages()
	if len(msgs) != 2 {
		t.Fatalf("got %d messages, want request_headers and response_headers (no trailers without upstream trailers)", len(msgs))
	}
	rh := msgs[0].GetRequestHeaders()
	if rh == nil || !rh.GetEndOfStream() {
		t.Fatalf("first message %v, want request_headers with end_of_stream", msgs[0])
	}
	for k, want := range map[string]string{":authority": strings.TrimPrefix(r.h.URL(), "http://"), ":path": "/hello?x=1",
		":method": "GET", ":scheme": "http", "x-forwarded-proto": "http", "x-gateway-destination-endpoint": r.up[0].Addr()} {
		if got := headerOf(rh.GetHeaders(), k); got != want {
			t.Errorf("request header %s = %q, want %q", k, got, want)
		}
	}
	attrs := msgs[0].GetAttributes()["envoy.filters.http.ext_proc"].GetFields()
	if attrs["request.id"].GetStringValue() == "" || attrs["request.id"].GetStringValue() != headerOf(rh.GetHeaders(), "x-request-id") {
		t.Errorf("request.id attribute %v, want the x-request-id header", attrs["request.id"])
	}
	if a := attrs["source.address"].GetStringValue(); !strings.HasPrefix(a, "127.0.0.1:") || attrs["source.port"].GetNumberValue() == 0 {
		t.Errorf("source attributes %v, want the client's address and port", attrs)
	}
	if msgs[0].GetProtocolConfig() == nil || msgs[0].GetMetadataContext() == nil {
		t.Errorf("first message lacks protocol_config or metadata_context: %v", msgs[0])
	}
	if msgs[1].GetAttributes() != nil {
		t.Errorf("response_headers carries attributes %v; request attributes go with the first message only", msgs[1].GetAttributes())
	}
	lb := msgs[1].GetMetadataContext().GetFilterMetadata()["envoy.lb"].GetFields()
	if lb["x-gateway-destination-endpoint-served"].GetStringValue() != r.up[1].Addr() ||
		lb["x-gateway-destination-endpoint"].GetStringValue() != r.up[1].Addr() {
		t.Errorf("response_headers metadata_context envoy.lb = %v, want destination and served host b", lb)
	}
	if headerOf(msgs[1].GetResponseHeaders().GetHeaders(), ":status") != "200" {
		t.Errorf("response_headers without :status 200: %v", msgs[1])
	}
	if s := r.h.Stats(); s.FallbackPicks != 0 || s.StreamsOpened != 1 {
		t.Errorf("stats %+v, want 1 stream and no fallback", s)
	}
}

func TestImmediateResponseIsALocalReply(t *testing.T) {
	r := newRig(t, func(req *extprocv3.ProcessingRequest) (*extprocv3.ProcessingResponse, error) {
		return &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ImmediateResponse{ImmediateResponse: &extprocv3.ImmediateResponse{
			Status: &typev3.HttpStatus{Code: typev3.StatusCode_TooManyRequests},
			Headers: &extprocv3.HeaderMutation{SetHeaders: []*corev3.HeaderValueOption{
				{Header: &corev3.HeaderValue{Key: "content-type", RawValue: []byte("application/json")}},
				{Header: &corev3.HeaderValue{Key: "retry-after", RawValue: []byte("1")}},
				{Header: &corev3.HeaderValue{Key: "x-envoy-nope", RawValue: []byte("1")}},
			}},
			Body: []byte(`{"errorCode":"ResourceExhausted"}`),
		}}}, nil
	})
	resp, body := get(t, r.h.URL()+"/")
	if resp.StatusCode != 429 || resp.Header.Get("Retry-After") != "1" || resp.Header.Get("Content-Type") != "application/json" ||
		body != `{"errorCode":"ResourceExhausted"}` {
		t.Errorf("got %d %v %q, want 429 with retry-after, JSON content type and body", resp.StatusCode, resp.Header, body)
	}
	if resp.Header.Get("X-Envoy-Nope") != "" {
		t.Error("an x-envoy-* header got through the mutation rules")
	}
	if r.up[0].Served()+r.up[1].Served() != 0 {
		t.Error("an upstream was reached despite the ImmediateResponse")
	}
	waitEnded(t, r.proc.stream(t, 0))
}

func TestFailuresFailClosed(t *testing.T) {
	tests := []struct {
		name       string
		answer     func(*extprocv3.ProcessingRequest) (*extprocv3.ProcessingResponse, error)
		wantStatus int
		check      func(t *testing.T, s envoyharness.Stats)
	}{
		{"message timeout → 504", func(*extprocv3.ProcessingRequest) (*extprocv3.ProcessingResponse, error) { return nil, nil },
			504, func(t *testing.T, s envoyharness.Stats) {
				if s.MessageTimeouts != 1 {
					t.Errorf("MessageTimeouts = %d", s.MessageTimeouts)
				}
			}},
		{"stream error → status_on_error", func(*extprocv3.ProcessingRequest) (*extprocv3.ProcessingResponse, error) {
			return nil, status.Error(codes.Internal, "boom")
		}, 503, func(t *testing.T, s envoyharness.Stats) {
			if s.StreamErrors != 1 {
				t.Errorf("StreamErrors = %d", s.StreamErrors)
			}
		}},
		{"spurious answer → status_on_error", func(*extprocv3.ProcessingRequest) (*extprocv3.ProcessingResponse, error) {
			return cont(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseHeaders{}}), nil
		}, 503, func(t *testing.T, s envoyharness.Stats) {
			if s.SpuriousMessages != 1 {
				t.Errorf("SpuriousMessages = %d", s.SpuriousMessages)
			}
		}},
		{"invalid mutation → status_on_error", func(*extprocv3.ProcessingRequest) (*extprocv3.ProcessingResponse, error) {
			return &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_RequestHeaders{RequestHeaders: &extprocv3.HeadersResponse{
				Response: &extprocv3.CommonResponse{HeaderMutation: &extprocv3.HeaderMutation{SetHeaders: []*corev3.HeaderValueOption{{
					Header: &corev3.HeaderValue{Key: "x", Value: "a", RawValue: []byte("b")}}}}},
			}}}, nil
		}, 503, func(t *testing.T, s envoyharness.Stats) {
			if s.MutationErrors != 1 {
				t.Errorf("MutationErrors = %d", s.MutationErrors)
			}
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r := newRig(t, tc.answer, envoyharness.WithMessageTimeout(100*time.Millisecond))
			resp, _ := get(t, r.h.URL()+"/")
			if resp.StatusCode != tc.wantStatus {
				t.Errorf("status = %d, want %d", resp.StatusCode, tc.wantStatus)
			}
			if r.up[0].Served()+r.up[1].Served() != 0 {
				t.Error("an upstream was reached although ext_proc failed (fail closed)")
			}
			tc.check(t, r.h.Stats())
		})
	}
}

func TestMetadataOutsideReceivingNamespacesIsDropped(t *testing.T) {
	var r *rig
	r = newRig(t, func(req *extprocv3.ProcessingRequest) (*extprocv3.ProcessingResponse, error) {
		if req.GetRequestHeaders() != nil {
			resp := route(r.up[1].Addr())
			resp.Response = cont(req).Response // no header: only the metadata could route
			return resp, nil
		}
		return cont(req), nil
	}, envoyharness.WithNamespaces(nil, []string{"envoy.lb"}))
	for range 4 {
		get(t, r.h.URL()+"/")
	}
	s := r.h.Stats()
	if s.DroppedMetadata != 4 || s.FallbackPicks != 4 {
		t.Errorf("stats %+v, want every metadata namespace dropped and every pick a silent fallback", s)
	}
	if r.up[0].Served() != 2 || r.up[1].Served() != 2 {
		t.Errorf("fallback spread a=%d b=%d, want round robin 2/2", r.up[0].Served(), r.up[1].Served())
	}
}

func TestCloseModesAsTheServerSeesThem(t *testing.T) {
	tests := []struct {
		mode envoyharness.CloseMode
		want []string
	}{
		{envoyharness.CloseGraceful, []string{"eof"}},
		{envoyharness.CloseReset, []string{"canceled"}},
		{envoyharness.CloseEnvoy, []string{"eof", "canceled"}},
	}
	for _, tc := range tests {
		r := newRig(t, func(req *extprocv3.ProcessingRequest) (*extprocv3.ProcessingResponse, error) { return cont(req), nil },
			envoyharness.WithCloseMode(tc.mode))
		get(t, r.h.URL()+"/")
		got := waitEnded(t, r.proc.stream(t, 0))
		if !strings.Contains(strings.Join(tc.want, ","), got) {
			t.Errorf("close mode %d: server saw %q, want one of %v", tc.mode, got, tc.want)
		}
	}
}

func TestStreamCloseRules(t *testing.T) {
	t.Run("no response body: closed after response_headers", func(t *testing.T) {
		r := newRig(t, func(req *extprocv3.ProcessingRequest) (*extprocv3.ProcessingResponse, error) { return cont(req), nil })
		resp, _ := get(t, r.h.URL()+"/empty")
		if resp.StatusCode != 204 {
			t.Fatalf("status %d", resp.StatusCode)
		}
		rec := r.proc.stream(t, 0)
		waitEnded(t, rec)
		if s := r.h.Stats(); s.StreamsClosedEarly != 1 {
			t.Errorf("StreamsClosedEarly = %d, want 1", s.StreamsClosedEarly)
		}
		if n := len(rec.messages()); n != 2 {
			t.Errorf("%d messages, want 2", n)
		}
	})
	t.Run("trailers SKIP: closed after response_headers even with a body", func(t *testing.T) {
		r := newRig(t, func(req *extprocv3.ProcessingRequest) (*extprocv3.ProcessingResponse, error) { return cont(req), nil },
			envoyharness.WithProcessingMode(&filterv3.ProcessingMode{RequestHeaderMode: filterv3.ProcessingMode_SEND,
				ResponseHeaderMode: filterv3.ProcessingMode_SEND, ResponseTrailerMode: filterv3.ProcessingMode_SKIP}))
		// The upstream blocks: the stream must end before the body does.
		done := make(chan struct{})
		go func() {
			defer close(done)
			resp, err := http.Get(r.h.URL() + "/block")
			if err == nil {
				_, _ = io.Copy(io.Discard, resp.Body)
				_ = resp.Body.Close()
			}
		}()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := r.up[0].WaitBlocked(ctx, 1); err != nil {
			if err := r.up[1].WaitBlocked(ctx, 1); err != nil {
				t.Fatal(err)
			}
		}
		// /block holds its headers too, so release, then check the stream ended with the headers.
		r.up[0].Release()
		r.up[1].Release()
		<-done
		waitEnded(t, r.proc.stream(t, 0))
		if s := r.h.Stats(); s.StreamsClosedEarly != 1 {
			t.Errorf("StreamsClosedEarly = %d, want 1", s.StreamsClosedEarly)
		}
	})
	t.Run("trailers SEND with a body: open until the exchange ends", func(t *testing.T) {
		r := newRig(t, func(req *extprocv3.ProcessingRequest) (*extprocv3.ProcessingResponse, error) { return cont(req), nil })
		resp, err := http.Get(r.h.URL() + "/sse")
		if err != nil {
			t.Fatal(err)
		}
		buf := make([]byte, 64)
		if _, err := resp.Body.Read(buf); err != nil {
			t.Fatal(err)
		}
		rec := r.proc.stream(t, 0)
		select {
		case <-rec.ended:
			t.Fatal("the stream ended while the SSE response was still streaming")
		case <-time.After(100 * time.Millisecond):
		}
		_ = resp.Body.Close() // client abort
		if got := waitEnded(t, rec); got != "eof" && got != "canceled" {
			t.Errorf("ended by %q", got)
		}
		if s := r.h.Stats(); s.StreamsClosedEarly != 0 {
			t.Errorf("StreamsClosedEarly = %d, want 0", s.StreamsClosedEarly)
		}
	})
	t.Run("whole body arrived before the headers answer: closed after response_headers (>= 1.37)", func(t *testing.T) {
		r := newRig(t, func(req *extprocv3.ProcessingRequest) (*extprocv3.ProcessingResponse, error) { return cont(req), nil },
			envoyharness.WithBodyBeforeHeadersAnswer(true))
		if _, body := get(t, r.h.URL()+"/"); body != "a\n" && body != "b\n" {
			t.Errorf("body %q, want the upstream's whole body after the early close", body)
		}
		get(t, r.h.URL()+"/trailers") // trailers: the rule does not apply, trailers end the stream
		for i, wantLast := range []string{"response_headers", "response_trailers"} {
			rec := r.proc.stream(t, i)
			waitEnded(t, rec)
			msgs := rec.messages()
			last := "response_headers"
			if msgs[len(msgs)-1].GetResponseTrailers() != nil {
				last = "response_trailers"
			}
			if last != wantLast || len(msgs) != map[string]int{"response_headers": 2, "response_trailers": 3}[wantLast] {
				t.Errorf("stream %d: %d messages ending with %s, want the stream closed after %s", i, len(msgs), last, wantLast)
			}
		}
		if s := r.h.Stats(); s.StreamsClosedEarly != 2 {
			t.Errorf("StreamsClosedEarly = %d, want 2 (after the headers answer, after the trailers answer)", s.StreamsClosedEarly)
		}
	})
	t.Run("empty trailers option and upstream trailers", func(t *testing.T) {
		r := newRig(t, func(req *extprocv3.ProcessingRequest) (*extprocv3.ProcessingResponse, error) { return cont(req), nil },
			envoyharness.WithEmptyResponseTrailers(true))
		get(t, r.h.URL()+"/")
		get(t, r.h.URL()+"/trailers")
		for i, wantTrailer := range []bool{false, true} {
			rec := r.proc.stream(t, i)
			waitEnded(t, rec)
			msgs := rec.messages()
			last := msgs[len(msgs)-1].GetResponseTrailers()
			if last == nil {
				t.Fatalf("stream %d: last message %v, want response_trailers", i, msgs[len(msgs)-1])
			}
			got := headerOf(last.GetTrailers(), "x-upstream-trailer")
			if wantTrailer && got != "a" && got != "b" || !wantTrailer && got != "" {
				t.Errorf("stream %d: trailer x-upstream-trailer = %q, want upstream's id: %v", i, got, wantTrailer)
			}
		}
		if s := r.h.Stats(); s.StreamsClosedEarly != 2 {
			t.Errorf("StreamsClosedEarly = %d, want 2 (after each trailers answer)", s.StreamsClosedEarly)
		}
	})
}

func TestModeOverrideStreamsTheResponseBody(t *testing.T) {
	var mu sync.Mutex
	var body strings.Builder
	r := newRig(t, func(req *extprocv3.ProcessingRequest) (*extprocv3.ProcessingResponse, error) {
		switch x := req.GetRequest().(type) {
		case *extprocv3.ProcessingRequest_ResponseHeaders:
			resp := cont(req)
			resp.ModeOverride = &filterv3.ProcessingMode{ResponseBodyMode: filterv3.ProcessingMode_STREAMED,
				ResponseTrailerMode: filterv3.ProcessingMode_SEND}
			return resp, nil
		case *extprocv3.ProcessingRequest_ResponseBody:
			mu.Lock()
			body.Write(x.ResponseBody.GetBody())
			mu.Unlock()
		}
		return cont(req), nil
	})
	resp, err := http.Get(r.h.URL() + "/sse")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = resp.Body.Close() }()
	testutil.Poll(5*time.Second, func() bool { return r.up[0].Blocked()+r.up[1].Blocked() > 0 })
	r.up[0].Release()
	r.up[1].Release()
	got, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	rec := r.proc.stream(t, 0)
	waitEnded(t, rec)
	mu.Lock()
	defer mu.Unlock()
	if body.String() != string(got) || !strings.Contains(body.String(), "event: endpoint") {
		t.Errorf("processor saw %q, client got %q; want the same SSE body", body.String(), got)
	}
	msgs := rec.messages()
	last := msgs[len(msgs)-1].GetResponseBody()
	if last == nil || !last.GetEndOfStream() {
		t.Errorf("last message %v, want response_body with end_of_stream", msgs[len(msgs)-1])
	}
	if s := r.h.Stats(); s.ModeOverrides != 1 || s.StreamsClosedEarly != 1 {
		t.Errorf("stats %+v, want 1 mode override and a close after the last body chunk", s)
	}
}

func TestDisabledRouteSkipsExtProc(t *testing.T) {
	r := newRig(t, func(req *extprocv3.ProcessingRequest) (*extprocv3.ProcessingResponse, error) { return cont(req), nil })
	resp, _ := get(t, r.h.URL()+"/off/x") // ext_proc disabled on this route
	if resp.StatusCode != 200 {
		t.Errorf("disabled route: %d", resp.StatusCode)
	}
	if s := r.h.Stats(); s.StreamsOpened != 0 || s.FallbackPicks != 1 {
		t.Errorf("stats %+v: a disabled route opens no stream and falls back", s)
	}
}

func TestRouterRepliesGoThroughExtProc(t *testing.T) {
	r := newRig(t, func(req *extprocv3.ProcessingRequest) (*extprocv3.ProcessingResponse, error) { return cont(req), nil })
	resp, body := get(t, r.h.URL()+"/nocluster")
	if resp.StatusCode != 503 || body != "no healthy upstream" {
		t.Errorf("got %d %q, want 503 no healthy upstream", resp.StatusCode, body)
	}
	rec := r.proc.stream(t, 0)
	waitEnded(t, rec)
	msgs := rec.messages()
	if len(msgs) != 2 || headerOf(msgs[1].GetResponseHeaders().GetHeaders(), ":status") != "503" {
		t.Errorf("messages %v, want the local 503 in response_headers", msgs)
	}
}

func TestClientAbortEndsTheStream(t *testing.T) {
	r := newRig(t, func(req *extprocv3.ProcessingRequest) (*extprocv3.ProcessingResponse, error) { return cont(req), nil })
	ctx, cancel := context.WithCancel(context.Background())
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, r.h.URL()+"/block", nil)
	done := make(chan struct{})
	go func() {
		defer close(done)
		if resp, err := http.DefaultClient.Do(req); err == nil {
			_ = resp.Body.Close()
		}
	}()
	testutil.Poll(5*time.Second, func() bool { return r.up[0].Blocked()+r.up[1].Blocked() > 0 })
	cancel()
	<-done
	if got := waitEnded(t, r.proc.stream(t, 0)); got != "eof" && got != "canceled" {
		t.Errorf("ended by %q", got)
	}
	testutil.Poll(5*time.Second, func() bool { return r.up[0].Blocked()+r.up[1].Blocked() == 0 })
	if r.up[0].Blocked()+r.up[1].Blocked() != 0 {
		t.Error("the upstream request was not cancelled with the client")
	}
}

// TestImmediateResponseToAGRPCCaller: a local reply to a gRPC request reaches a real grpc-go
// client as a trailers-only gRPC response, as Envoy's encodeLocalReply makes it: the
// ImmediateResponse's grpc_status when set, else Envoy's HTTP→gRPC mapping (429 becomes
// UNAVAILABLE, which tells the caller nothing about the request cap); the body becomes
// grpc-message; the mutation's headers arrive.
func TestImmediateResponseToAGRPCCaller(t *testing.T) {
	for _, tc := range []struct {
		name string
		gs   *extprocv3.GrpcStatus
		want codes.Code
	}{
		{"grpc_status set", &extprocv3.GrpcStatus{Status: uint32(codes.ResourceExhausted)}, codes.ResourceExhausted},
		{"grpc_status absent", nil, codes.Unavailable},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := newRig(t, func(req *extprocv3.ProcessingRequest) (*extprocv3.ProcessingResponse, error) {
				return &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ImmediateResponse{ImmediateResponse: &extprocv3.ImmediateResponse{
					Status:     &typev3.HttpStatus{Code: typev3.StatusCode_TooManyRequests},
					GrpcStatus: tc.gs,
					Headers: &extprocv3.HeaderMutation{SetHeaders: []*corev3.HeaderValueOption{{
						Header: &corev3.HeaderValue{Key: "grpc-retry-pushback-ms", RawValue: []byte("1000")}, AppendAction: corev3.HeaderValueOption_OVERWRITE_IF_EXISTS_OR_ADD,
					}}},
					Body: []byte(`{"errorCode":"ResourceExhausted"}`),
				}}}, nil
			})
			cc, err := grpc.NewClient(strings.TrimPrefix(r.h.URL(), "http://"), grpc.WithTransportCredentials(insecure.NewCredentials()))
			if err != nil {
				t.Fatal(err)
			}
			defer func() { _ = cc.Close() }()
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			var trl metadata.MD
			_, err = healthpb.NewHealthClient(cc).Check(ctx, &healthpb.HealthCheckRequest{}, grpc.Trailer(&trl))
			st := status.Convert(err)
			if st.Code() != tc.want || st.Message() != `{"errorCode":"ResourceExhausted"}` {
				t.Errorf("call: %v, want %v with the body as message", err, tc.want)
			}
			if got := trl.Get("grpc-retry-pushback-ms"); len(got) != 1 || got[0] != "1000" {
				t.Errorf("grpc-retry-pushback-ms = %q, want the ImmediateResponse's 1000", got)
			}
			if msgs := r.proc.stream(t, 0).messages(); len(msgs) == 0 ||
				!strings.HasPrefix(headerValue(msgs[0].GetRequestHeaders().GetHeaders(), "content-type"), "application/grpc") {
				t.Errorf("ext_proc did not see the gRPC request headers: %v", msgs)
			}
			if r.up[0].Served()+r.up[1].Served() != 0 {
				t.Error("an upstream was reached despite the ImmediateResponse")
			}
		})
	}
}

func headerValue(m *corev3.HeaderMap, key string) string {
	for _, h := range m.GetHeaders() {
		if h.GetKey() == key {
			return string(h.GetRawValue())
		}
	}
	return ""
}

// TestA93ModeSendsWhatGRPCsFilterSends: with GRPCSemantics the harness sends request_headers
// as gRPC's own ext_proc filter does — the application's metadata only (no pseudo headers, no
// content-type, no x-request-id of its own), no source attributes — and an ImmediateResponse
// fails the call with grpc_status (INTERNAL without it) and the details as the message.
func TestA93ModeSendsWhatGRPCsFilterSends(t *testing.T) {
	for _, tc := range []struct {
		name string
		gs   *extprocv3.GrpcStatus
		want codes.Code
	}{
		{"grpc_status set", &extprocv3.GrpcStatus{Status: uint32(codes.ResourceExhausted)}, codes.ResourceExhausted},
		{"grpc_status absent", nil, codes.Internal},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := newRig(t, func(req *extprocv3.ProcessingRequest) (*extprocv3.ProcessingResponse, error) {
				return &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ImmediateResponse{ImmediateResponse: &extprocv3.ImmediateResponse{
					Status:     &typev3.HttpStatus{Code: typev3.StatusCode_TooManyRequests},
					GrpcStatus: tc.gs,
					Body:       []byte(`{"errorCode":"ResourceExhausted"}`),
					Details:    "ResourceExhausted: no free request slot",
				}}}, nil
			}, envoyharness.WithMutationSemantics(envoyharness.GRPCSemantics))
			cc, err := grpc.NewClient(strings.TrimPrefix(r.h.URL(), "http://"), grpc.WithTransportCredentials(insecure.NewCredentials()))
			if err != nil {
				t.Fatal(err)
			}
			defer func() { _ = cc.Close() }()
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			ctx = metadata.AppendToOutgoingContext(ctx, "x-app", "v")
			_, err = healthpb.NewHealthClient(cc).Check(ctx, &healthpb.HealthCheckRequest{})
			if st := status.Convert(err); st.Code() != tc.want || st.Message() != "ResourceExhausted: no free request slot" {
				t.Errorf("call: %v, want %v with the details as message", err, tc.want)
			}
			msgs := r.proc.stream(t, 0).messages()
			if len(msgs) == 0 {
				t.Fatal("no ext_proc message")
			}
			var keys []string
			for _, h := range msgs[0].GetRequestHeaders().GetHeaders().GetHeaders() {
				keys = append(keys, h.GetKey())
			}
			if !slices.Equal(keys, []string{"x-app"}) {
				t.Errorf("request_headers keys = %q, want only the application's [x-app]", keys)
			}
			if a := msgs[0].GetAttributes(); a != nil {
				t.Errorf("attributes = %v, want none (no source.*, no x-request-id sent)", a)
			}
		})
	}
}
