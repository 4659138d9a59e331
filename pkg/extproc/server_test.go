package extproc_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"sync"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	filterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"github.com/google/go-cmp/cmp"
	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/testing/protocmp"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/tether-dev/tether/internal/testutil"
	"github.com/tether-dev/tether/pkg/affinity"
	"github.com/tether-dev/tether/pkg/affinity/affinitytest"
	"github.com/tether-dev/tether/pkg/extproc"
	"github.com/tether-dev/tether/pkg/registry"
	"github.com/tether-dev/tether/pkg/wire"
)

func TestRequestHeadersSetsDestinationHeaderAndMetadata(t *testing.T) {
	svc := affinitytest.Service("web", registry.AffinityCookie)
	e := newEnv(t, []registry.Service{svc}, affinitytest.Instances("web", 3))
	st, _ := e.open(t, "web")

	// A client-supplied destination header (a forgery) must be overwritten, never appended.
	got := roundTrip(t, st, reqHeaders("GET", "/", true, "x-gateway-destination-endpoint", "10.9.9.9:22"))
	// First session on empty instances: the fullest with room, ties to the lowest index (i1).
	const addr = "127.0.0.1:8001"
	want := &extprocv3.ProcessingResponse{
		Response: &extprocv3.ProcessingResponse_RequestHeaders{RequestHeaders: &extprocv3.HeadersResponse{
			Response: &extprocv3.CommonResponse{HeaderMutation: &extprocv3.HeaderMutation{
				SetHeaders: []*corev3.HeaderValueOption{{
					Header:       &corev3.HeaderValue{Key: "x-gateway-destination-endpoint", RawValue: []byte(addr)},
					AppendAction: corev3.HeaderValueOption_OVERWRITE_IF_EXISTS_OR_ADD,
				}},
			}},
		}},
		DynamicMetadata: &structpb.Struct{Fields: map[string]*structpb.Value{
			"envoy.lb": structpb.NewStructValue(&structpb.Struct{Fields: map[string]*structpb.Value{
				"x-gateway-destination-endpoint": structpb.NewStringValue(addr),
			}}),
		}},
	}
	if diff := cmp.Diff(want, got, protocmp.Transform()); diff != "" {
		t.Errorf("request_headers answer (-want +got):\n%s", diff)
	}
	if n := requestsInFlight(t, e.f, "web"); n != 1 {
		t.Errorf("requests in flight = %d, want 1 while the stream is open", n)
	}
	closeAndWait(t, st)
	e.counter.waitAllEnded(t)
	if n := requestsInFlight(t, e.f, "web"); n != 0 {
		t.Errorf("requests in flight after EOF = %d, want 0", n)
	}
}

func TestConfigurableNames(t *testing.T) {
	svc := affinitytest.Service("web", registry.AffinityNone)
	e := newEnv(t, []registry.Service{svc}, affinitytest.Instances("web", 1),
		extproc.WithDestinationHeader("x-dest"), extproc.WithMetadataNamespace("tether"),
		extproc.WithServedHostKey("x-dest-served"), extproc.WithServiceMetadataKey("x-svc"))
	st, _ := e.open(t, "") // x-tether-service is not the key any more: resolve by authority/path
	got := roundTrip(t, st, reqHeaders("GET", "/", true))
	v, action, ok := setHeader(got.GetRequestHeaders().GetResponse().GetHeaderMutation(), "x-dest")
	if !ok || v != "127.0.0.1:8001" || action != actionOverwrite {
		t.Errorf("x-dest = %q (%s, present %v), want 127.0.0.1:8001 overwrite", v, action, ok)
	}
	md := got.GetDynamicMetadata().GetFields()["tether"].GetStructValue().GetFields()["x-dest"].GetStringValue()
	if md != "127.0.0.1:8001" {
		t.Errorf("metadata tether/x-dest = %q, want 127.0.0.1:8001", md)
	}
	roundTrip(t, st, respHeaders("200", "127.0.0.1:9999", false)) // wrong served host under the old key: ignored
	if s := e.srv.Stats(); s.ServedHostMismatches != 0 {
		t.Errorf("mismatches = %d under a key the server does not read, want 0", s.ServedHostMismatches)
	}
	closeAndWait(t, st)
}

func TestCookieAffinityOverTheWire(t *testing.T) {
	svc := affinitytest.Service("web", registry.AffinityCookie)
	e := newEnv(t, []registry.Service{svc}, affinitytest.Instances("web", 3))

	st, _ := e.open(t, "web")
	first := destination(roundTrip(t, st, reqHeaders("GET", "/", true)))
	resp := roundTrip(t, st, respHeaders("200", first, false, "set-cookie", "JSESSIONID=up; Path=/"))
	mut := resp.GetResponseHeaders().GetResponse().GetHeaderMutation()
	cookie, action, ok := setHeader(mut, "set-cookie")
	if !ok || action != actionAppend {
		t.Fatalf("set-cookie = %q %s present=%v; want one appended beside the upstream's", cookie, action, ok)
	}
	name, rest, _ := strings.Cut(cookie, "=")
	id, attrs, _ := strings.Cut(rest, ";")
	if name != "tether-session" || len(id) != 32 || !strings.Contains(attrs, "Max-Age=21600") || !strings.Contains(attrs, "HttpOnly") {
		t.Errorf("set-cookie = %q, want tether-session=<32 hex>; Max-Age=21600; ...; HttpOnly", cookie)
	}
	roundTrip(t, st, &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseTrailers{
		ResponseTrailers: &extprocv3.HttpTrailers{}}})
	closeAndWait(t, st)

	for i := range 20 {
		st, _ := e.open(t, "web")
		got := destination(roundTrip(t, st, reqHeaders("GET", fmt.Sprintf("/%d", i), true, "cookie", "a=b; tether-session="+id)))
		if got != first {
			t.Fatalf("request %d with the session cookie went to %s, want %s", i, got, first)
		}
		resp := roundTrip(t, st, respHeaders("200", got, true))
		if _, _, ok := setHeader(resp.GetResponseHeaders().GetResponse().GetHeaderMutation(), "set-cookie"); ok {
			t.Errorf("request %d: an existing session got a new Set-Cookie", i)
		}
		closeAndWait(t, st)
	}
	e.counter.waitAllEnded(t)
	if s := e.srv.Stats(); s.Decisions != 21 || s.ServedHostMismatches != 0 || s.OpenStreams != 0 {
		t.Errorf("stats = %+v, want 21 decisions, 0 mismatches, 0 open streams", s)
	}
}

func TestServedHostMismatchCounted(t *testing.T) {
	svc := affinitytest.Service("web", registry.AffinityHeader)
	e := newEnv(t, []registry.Service{svc}, affinitytest.Instances("web", 2))
	st, _ := e.open(t, "web")
	chosen := destination(roundTrip(t, st, reqHeaders("GET", "/", true)))
	if chosen == "" {
		t.Fatal("no destination")
	}
	resp := roundTrip(t, st, respHeaders("200", "127.0.0.1:8002", false))
	if chosen == "127.0.0.1:8002" {
		t.Fatalf("test assumes the first session lands on i1, got %s", chosen)
	}
	if s := e.srv.Stats(); s.ServedHostMismatches != 1 {
		t.Errorf("ServedHostMismatches = %d, want 1", s.ServedHostMismatches)
	}
	// Header affinity still returns the generated id in the configured header (overwrite).
	id, action, ok := setHeader(resp.GetResponseHeaders().GetResponse().GetHeaderMutation(), "x-tether-session")
	if !ok || action != actionOverwrite || id == "" {
		t.Errorf("x-tether-session = %q %s present=%v, want the generated id, overwrite", id, action, ok)
	}
	closeAndWait(t, st)
}

// TestRejections covers every rejection class as an ImmediateResponse with the JSON body.
func TestRejections(t *testing.T) {
	one := affinitytest.Service("one", registry.AffinityCookie)
	one.SessionsPerInstance = 1
	one.RequestSlotsPerInstance = 1
	noreuse := affinitytest.Service("noreuse", registry.AffinityHeader)
	noreuse.DisableSessionIDReuse = true
	noreuse.Match = registry.Match{PathPrefix: "/noreuse"}
	one.Match = registry.Match{PathPrefix: "/one"}
	sse := affinitytest.Service("sse", registry.AffinityMCPSSE)
	sse.Match = registry.Match{PathPrefix: "/mcp"}
	sse.SSE.Path = "/mcp/sse"
	insts := append(affinitytest.Instances("one", 1), affinitytest.Instances("noreuse", 1)...)
	insts = append(insts, affinitytest.Instances("sse", 1)...)
	e := newEnv(t, []registry.Service{one, noreuse, sse}, insts)

	// Hold the only request slot of "one" with an open session request.
	hold, _ := e.open(t, "one")
	holder := roundTrip(t, hold, reqHeaders("GET", "/one", true))
	cookie, _, _ := setHeader(roundTrip(t, hold, respHeaders("200", destination(holder), false)).
		GetResponseHeaders().GetResponse().GetHeaderMutation(), "set-cookie")
	id, _, _ := strings.Cut(strings.TrimPrefix(cookie, "tether-session="), ";")

	// An expired session under disableSessionIdReuse.
	ended := "ended_session_1"
	if _, err := e.f.Engine.CreateSession(context.Background(), "noreuse", affinity.CreateOptions{ID: ended, TTL: time.Second}); err != nil {
		t.Fatal(err)
	}
	e.f.Clock.Advance(2 * time.Second)

	tests := []struct {
		name       string
		service    string
		req        *extprocv3.ProcessingRequest
		wantStatus int
		wantCode   string
		wantRetry  bool
		wantGRPC   codes.Code // the grpc_status a gRPC request gets
	}{
		{"429 when the session's instance has no request slot", "one",
			reqHeaders("GET", "/one", true, "cookie", "tether-session="+id), 429, "ResourceExhausted", true, codes.ResourceExhausted},
		{"503 when no instance can take a new session", "one",
			reqHeaders("GET", "/one", true), 503, "NoCapacity", true, codes.Unavailable},
		{"400 for a malformed cookie", "one",
			reqHeaders("GET", "/one", true, "cookie", "tether-session=../../etc"), 400, "InvalidSessionId", false, codes.InvalidArgument},
		{"400 for a malformed header id", "noreuse",
			reqHeaders("GET", "/noreuse", true, "x-tether-session", "-bad id-"), 400, "InvalidSessionId", false, codes.InvalidArgument},
		{"409 for an ended id under disableSessionIdReuse", "noreuse",
			reqHeaders("GET", "/noreuse", true, "x-tether-session", ended), 409, "SessionIdReuseDisabled", false, codes.AlreadyExists},
		{"404 for an unknown MCP SSE session", "sse",
			reqHeaders("POST", "/mcp/messages?sessionId=0123456789abcdef", false), 404, "SessionNotFound", false, codes.NotFound},
		{"404 for an unknown service", "nope",
			reqHeaders("GET", "/", true), 404, "ServiceNotFound", false, codes.NotFound},
		{"404 when no service matches authority and path", "",
			reqHeaders("GET", "/elsewhere", true), 404, "ServiceNotFound", false, codes.NotFound},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			st, _ := e.open(t, tc.service)
			resp := roundTrip(t, st, tc.req)
			imm := resp.GetImmediateResponse()
			if imm == nil {
				t.Fatalf("got %v, want an ImmediateResponse", resp)
			}
			if got := int(imm.GetStatus().GetCode()); got != tc.wantStatus {
				t.Errorf("status = %d, want %d", got, tc.wantStatus)
			}
			ct, ctAction, _ := setHeader(imm.GetHeaders(), "content-type")
			if ct != "application/json" || ctAction != actionOverwrite {
				t.Errorf("content-type = %q (%s), want application/json, overwrite", ct, ctAction)
			}
			ra, raAction, hasRetry := setHeader(imm.GetHeaders(), "retry-after")
			if hasRetry != tc.wantRetry || (hasRetry && (ra != "1" || raAction != actionOverwrite)) {
				t.Errorf("retry-after = %q (%s, present %v), want present=%v with 1, overwrite", ra, raAction, hasRetry, tc.wantRetry)
			}
			var body wire.ErrorBody
			if err := json.Unmarshal(imm.GetBody(), &body); err != nil {
				t.Fatalf("body %q: %v", imm.GetBody(), err)
			}
			if body.ErrorCode != tc.wantCode || body.ErrorMessage == "" {
				t.Errorf("body = %+v, want errorCode %q and a message", body, tc.wantCode)
			}
			if imm.GetDetails() != "tether_"+tc.wantCode {
				t.Errorf("details = %q, want tether_%s", imm.GetDetails(), tc.wantCode)
			}
			// After an ImmediateResponse the server ends the stream with OK.
			if _, err := st.Recv(); !errors.Is(err, io.EOF) {
				t.Errorf("after ImmediateResponse: %v, want the stream closed with OK", err)
			}
			if imm.GetGrpcStatus() != nil {
				t.Errorf("an HTTP request got grpc_status %v", imm.GetGrpcStatus())
			}

			// The same request from a gRPC client carries the class's grpc_status, and the
			// retry delay as gRPC's retry pushback too.
			grpcReq := proto.Clone(tc.req).(*extprocv3.ProcessingRequest)
			hm := grpcReq.GetRequestHeaders().GetHeaders()
			hm.Headers = append(hm.Headers, &corev3.HeaderValue{Key: "content-type", RawValue: []byte("application/grpc")})
			gst, _ := e.open(t, tc.service)
			gimm := roundTrip(t, gst, grpcReq).GetImmediateResponse()
			if got := codes.Code(gimm.GetGrpcStatus().GetStatus()); gimm.GetGrpcStatus() == nil || got != tc.wantGRPC {
				t.Errorf("gRPC request: grpc_status %v, want %v", gimm.GetGrpcStatus(), tc.wantGRPC)
			}
			if got := int(gimm.GetStatus().GetCode()); got != tc.wantStatus {
				t.Errorf("gRPC request: HTTP status %d, want %d (Envoy maps it to 200 + grpc-status)", got, tc.wantStatus)
			}
			pb, pbAction, hasPushback := setHeader(gimm.GetHeaders(), "grpc-retry-pushback-ms")
			if hasPushback != tc.wantRetry || (hasPushback && (pb != "1000" || pbAction != actionOverwrite)) {
				t.Errorf("grpc-retry-pushback-ms = %q (%s, present %v), want present=%v with 1000, overwrite", pb, pbAction, hasPushback, tc.wantRetry)
			}
			if gimm.GetDetails() != "tether_"+tc.wantCode {
				t.Errorf("gRPC request through Envoy: details = %q, want tether_%s (grpc-message is the body)", gimm.GetDetails(), tc.wantCode)
			}

			// The same request from gRPC's own ext_proc filter (gRFC A93), which tether's xDS
			// configures with the data-plane metadata and which sends no content-type: the
			// same grpc_status, and the code leading the details, which become the status
			// message the application sees.
			pst, _ := e.open(t, tc.service, wire.DataPlaneMetadataKey, wire.DataPlaneGRPC)
			pimm := roundTrip(t, pst, tc.req).GetImmediateResponse()
			if got := codes.Code(pimm.GetGrpcStatus().GetStatus()); pimm.GetGrpcStatus() == nil || got != tc.wantGRPC {
				t.Errorf("proxyless gRPC: grpc_status %v, want %v", pimm.GetGrpcStatus(), tc.wantGRPC)
			}
			if d := pimm.GetDetails(); !strings.HasPrefix(d, tc.wantCode+": ") || len(d) <= len(tc.wantCode)+2 {
				t.Errorf("proxyless gRPC: details = %q, want %q and the message", d, tc.wantCode+": ")
			}
		})
	}
	closeAndWait(t, hold)
	e.counter.waitAllEnded(t)
	s := e.srv.Stats()
	want := extproc.RejectCounts{BadRequest: 6, NotFound: 3, Conflict: 3, TooManyRequests: 3, NoCapacity: 3, NoService: 6}
	if diff := cmp.Diff(want, s.Rejects); diff != "" {
		t.Errorf("reject counters (-want +got):\n%s", diff)
	}
	if n := requestsInFlight(t, e.f, "one"); n != 0 {
		t.Errorf("requests in flight = %d, want 0", n)
	}
}

// TestProxylessGRPCRecognisedWithoutMetadata: a request_headers message as gRPC's own ext_proc
// filter (gRFC A93) sends it from a configuration tether did not write — the application's
// metadata only: no pseudo headers, no content-type, no data-plane metadata — still gets a
// gRPC rejection with the code in the status message; the same request with Envoy's pseudo
// headers stays an HTTP rejection.
func TestProxylessGRPCRecognisedWithoutMetadata(t *testing.T) {
	e := newEnv(t, []registry.Service{affinitytest.Service("one", registry.AffinityNone)}, affinitytest.Instances("one", 1))
	a93 := &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: &extprocv3.HttpHeaders{
		Headers: headerMap("x-app", "1"),
	}}}
	for _, tc := range []struct {
		name     string
		req      *extprocv3.ProcessingRequest
		wantGRPC bool
	}{
		{"gRPC's filter", a93, true},
		{"Envoy, HTTP", reqHeaders("GET", "/", true, "x-app", "1"), false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			st, _ := e.open(t, "nope")
			imm := roundTrip(t, st, tc.req).GetImmediateResponse()
			if imm == nil {
				t.Fatal("want an ImmediateResponse")
			}
			if got := imm.GetGrpcStatus() != nil; got != tc.wantGRPC {
				t.Fatalf("grpc_status present = %v, want %v", got, tc.wantGRPC)
			}
			wantDetails := "tether_ServiceNotFound"
			if tc.wantGRPC {
				if c := codes.Code(imm.GetGrpcStatus().GetStatus()); c != codes.NotFound {
					t.Errorf("grpc_status = %v, want NotFound", c)
				}
				wantDetails = "ServiceNotFound: "
			}
			if !strings.HasPrefix(imm.GetDetails(), wantDetails) {
				t.Errorf("details = %q, want prefix %q", imm.GetDetails(), wantDetails)
			}
		})
	}
}

// failingEngine stands in for an engine internal failure, which the real engine cannot be
// made to produce on demand.
type failingEngine struct{}

func (failingEngine) Decide(context.Context, affinity.Request) (affinity.Decision, error) {
	return nil, errors.New("store unavailable")
}

func TestEngineErrorFailsClosedWith500(t *testing.T) {
	f := affinitytest.New(t, []registry.Service{affinitytest.Service("web", registry.AffinityNone)}, affinitytest.Instances("web", 1))
	e := newEnvWith(t, f, failingEngine{})
	st, _ := e.open(t, "web")
	imm := roundTrip(t, st, reqHeaders("GET", "/", true)).GetImmediateResponse()
	if imm.GetStatus().GetCode() != 500 {
		t.Fatalf("got %v, want ImmediateResponse 500", imm)
	}
	var body wire.ErrorBody
	if err := json.Unmarshal(imm.GetBody(), &body); err != nil || body.ErrorCode != "InternalServerError" {
		t.Errorf("body %q (%v), want errorCode InternalServerError", imm.GetBody(), err)
	}
	if s := e.srv.Stats(); s.EngineErrors != 1 {
		t.Errorf("EngineErrors = %d, want 1", s.EngineErrors)
	}
}

// TestDecisionEndedExactlyOnce ends streams every way Envoy (or a broken client) can and checks
// the request slot comes back exactly once.
func TestDecisionEndedExactlyOnce(t *testing.T) {
	svc := affinitytest.Service("web", registry.AffinityCookie)
	ends := []struct {
		name string
		run  func(t *testing.T, e *env)
	}{
		{"half-close after request headers (EOF)", func(t *testing.T, e *env) {
			st, _ := e.open(t, "web")
			roundTrip(t, st, reqHeaders("GET", "/", true))
			closeAndWait(t, st)
		}},
		{"reset after request headers (Canceled)", func(t *testing.T, e *env) {
			st, cancel := e.open(t, "web")
			roundTrip(t, st, reqHeaders("GET", "/", true))
			cancel()
		}},
		{"half-close and reset at once (Envoy's close)", func(t *testing.T, e *env) {
			st, cancel := e.open(t, "web")
			roundTrip(t, st, reqHeaders("GET", "/", true))
			_ = st.CloseSend()
			cancel()
		}},
		{"full exchange with trailers", func(t *testing.T, e *env) {
			st, _ := e.open(t, "web")
			d := destination(roundTrip(t, st, reqHeaders("POST", "/", false)))
			roundTrip(t, st, &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestBody{
				RequestBody: &extprocv3.HttpBody{Body: []byte("x"), EndOfStream: true}}})
			roundTrip(t, st, respHeaders("200", d, false))
			roundTrip(t, st, respBody("hello", false))
			roundTrip(t, st, &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseTrailers{
				ResponseTrailers: &extprocv3.HttpTrailers{}}})
			closeAndWait(t, st)
		}},
		{"second request_headers (protocol error)", func(t *testing.T, e *env) {
			st, _ := e.open(t, "web")
			roundTrip(t, st, reqHeaders("GET", "/", true))
			if err := st.Send(reqHeaders("GET", "/", true)); err != nil {
				t.Fatal(err)
			}
			if _, err := st.Recv(); status.Code(err) != codes.FailedPrecondition {
				t.Errorf("second request_headers: %v, want FailedPrecondition", err)
			}
		}},
		{"empty message (protocol error)", func(t *testing.T, e *env) {
			st, _ := e.open(t, "web")
			roundTrip(t, st, reqHeaders("GET", "/", true))
			if err := st.Send(&extprocv3.ProcessingRequest{}); err != nil {
				t.Fatal(err)
			}
			if _, err := st.Recv(); status.Code(err) != codes.InvalidArgument {
				t.Errorf("empty message: %v, want InvalidArgument", err)
			}
		}},
		{"server stops (stream context ends)", func(t *testing.T, e *env) {
			st, _ := e.open(t, "web")
			roundTrip(t, st, reqHeaders("GET", "/", true))
			e.gs.Stop()
		}},
	}
	for _, tc := range ends {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, []registry.Service{svc}, affinitytest.Instances("web", 2))
			tc.run(t, e)
			if e.counter.decided.Load() != 1 {
				t.Fatalf("decisions = %d, want 1", e.counter.decided.Load())
			}
			e.counter.waitAllEnded(t)
			testutil.Eventually(t, "request slots back to 0", func() bool { return requestsInFlight(t, e.f, "web") == 0 })
			testutil.Eventually(t, "no open stream", func() bool { return e.srv.Stats().OpenStreams == 0 })
		})
	}
}

// TestConcurrentStreams runs many exchanges at once under -race: every slot comes back, every
// decision ends once, counters add up.
func TestConcurrentStreams(t *testing.T) {
	svc := affinitytest.Service("web", registry.AffinityCookie)
	svc.SessionsPerInstance = 200
	e := newEnv(t, []registry.Service{svc}, affinitytest.Instances("web", 4))
	const workers, perWorker = 16, 25
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var cookie string
			for i := range perWorker {
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				st, err := e.client.Process(ctx)
				if err != nil {
					cancel()
					errs <- err
					return
				}
				h := reqHeaders("GET", "/", true)
				if cookie != "" {
					h = reqHeaders("GET", "/", true, "cookie", cookie)
				}
				if err := st.Send(h); err != nil {
					cancel()
					errs <- err
					return
				}
				r1, err := st.Recv()
				if err != nil {
					cancel()
					errs <- err
					return
				}
				_ = st.Send(respHeaders("200", destination(r1), true))
				r2, err := st.Recv()
				if err != nil {
					cancel()
					errs <- fmt.Errorf("worker %d request %d: %w", w, i, err)
					return
				}
				if c, _, ok := setHeader(r2.GetResponseHeaders().GetResponse().GetHeaderMutation(), "set-cookie"); ok {
					cookie, _, _ = strings.Cut(c, ";")
				}
				if i%2 == 0 {
					_ = st.CloseSend()
					_, _ = st.Recv()
				}
				cancel()
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	e.counter.waitAllEnded(t)
	testutil.Eventually(t, "slots back to 0", func() bool { return requestsInFlight(t, e.f, "web") == 0 })
	s := e.srv.Stats()
	if s.Decisions != workers*perWorker || s.Streams != workers*perWorker {
		t.Errorf("stats = %+v, want %d decisions and streams", s, workers*perWorker)
	}
	sessions := 0
	for _, u := range e.f.Usage(t, "web") {
		sessions += u[0]
	}
	if sessions != workers {
		t.Errorf("sessions = %d, want %d (one per worker, reused by its cookie)", sessions, workers)
	}
}

func TestHealthAndDrain(t *testing.T) {
	e := newEnv(t, []registry.Service{affinitytest.Service("web", registry.AffinityNone)}, affinitytest.Instances("web", 1))
	hc := healthpb.NewHealthClient(e.conn)
	check := func(service string) healthpb.HealthCheckResponse_ServingStatus {
		t.Helper()
		r, err := hc.Check(context.Background(), &healthpb.HealthCheckRequest{Service: service})
		if err != nil {
			t.Fatalf("health check %q: %v", service, err)
		}
		return r.GetStatus()
	}
	for _, s := range []string{"", wire.ExtProcServiceName, wire.LivenessService, wire.ReadinessService} {
		if got := check(s); got != healthpb.HealthCheckResponse_SERVING {
			t.Errorf("health(%q) = %v, want SERVING", s, got)
		}
	}
	st, _ := e.open(t, "web")
	roundTrip(t, st, reqHeaders("GET", "/", true))
	e.srv.Drain()
	e.srv.Drain() // idempotent
	for _, s := range []string{"", wire.ExtProcServiceName, wire.ReadinessService} {
		if got := check(s); got != healthpb.HealthCheckResponse_NOT_SERVING {
			t.Errorf("health(%q) while draining = %v, want NOT_SERVING", s, got)
		}
	}
	if got := check(wire.LivenessService); got != healthpb.HealthCheckResponse_SERVING {
		t.Errorf("liveness while draining = %v, want SERVING (the process is alive)", got)
	}
	// Open and new streams are still served while draining.
	roundTrip(t, st, respHeaders("200", "", true))
	closeAndWait(t, st)
	st2, _ := e.open(t, "web")
	if d := destination(roundTrip(t, st2, reqHeaders("GET", "/", true))); d == "" {
		t.Error("a stream opened while draining got no destination")
	}
	closeAndWait(t, st2)
	if !e.srv.Stats().Draining {
		t.Error("Stats().Draining = false after Drain")
	}
}

func TestMessagesWithoutRequestHeadersContinue(t *testing.T) {
	e := newEnv(t, []registry.Service{affinitytest.Service("web", registry.AffinityNone)}, affinitytest.Instances("web", 1))
	st, _ := e.open(t, "web")
	resp := roundTrip(t, st, respHeaders("200", "", false))
	if diff := cmp.Diff(&extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ResponseHeaders{
		ResponseHeaders: &extprocv3.HeadersResponse{Response: &extprocv3.CommonResponse{}}}}, resp, protocmp.Transform()); diff != "" {
		t.Errorf("response_headers without a decision (-want +got):\n%s", diff)
	}
	resp = roundTrip(t, st, respBody("x", true))
	if resp.GetResponseBody() == nil || resp.GetResponseBody().GetResponse().GetBodyMutation() != nil {
		t.Errorf("response_body: got %v, want CONTINUE without mutation", resp)
	}
	closeAndWait(t, st)
}

func TestModeOverrideIsExplicit(t *testing.T) {
	svc := affinitytest.Service("mcp", registry.AffinityMCPSSE)
	e := newEnv(t, []registry.Service{svc}, affinitytest.Instances("mcp", 1))
	st, _ := e.open(t, "mcp")
	d := destination(roundTrip(t, st, reqHeaders("GET", "/sse", true)))
	resp := roundTrip(t, st, respHeaders("200", d, false, "content-type", "text/event-stream"))
	want := &filterv3.ProcessingMode{
		RequestHeaderMode: filterv3.ProcessingMode_SEND, ResponseHeaderMode: filterv3.ProcessingMode_SEND,
		RequestBodyMode: filterv3.ProcessingMode_NONE, ResponseBodyMode: filterv3.ProcessingMode_STREAMED,
		RequestTrailerMode: filterv3.ProcessingMode_SKIP, ResponseTrailerMode: filterv3.ProcessingMode_SEND,
	}
	if diff := cmp.Diff(want, resp.GetModeOverride(), protocmp.Transform()); diff != "" {
		t.Errorf("mode_override (-want +got):\n%s", diff)
	}
	closeAndWait(t, st)
}

// TestSSESessionLearnedFromStreamedBody plays Envoy's side of an MCP HTTP+SSE GET: the
// response body is streamed after the mode override, the endpoint event arrives split over
// chunks, and later POSTs with the announced id reach the same instance until the GET ends.
func TestSSESessionLearnedFromStreamedBody(t *testing.T) {
	tests := []struct {
		name, param, eol string
		chunk            int
	}{
		{"TS style, LF, 1-byte chunks", "sessionId", "\n", 1},
		{"Go style, CRLF, 7-byte chunks", "sessionid", "\r\n", 7},
		{"CR framing, one chunk", "sessionId", "\r", 1 << 10},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			svc := affinitytest.Service("mcp", registry.AffinityMCPSSE)
			svc.SSE.SessionParam = tc.param
			e := newEnv(t, []registry.Service{svc}, affinitytest.Instances("mcp", 3))

			get, cancelGet := e.open(t, "mcp")
			chosen := destination(roundTrip(t, get, reqHeaders("GET", "/sse", true)))
			resp := roundTrip(t, get, respHeaders("200", chosen, false, "content-type", "text/event-stream"))
			if resp.GetModeOverride().GetResponseBodyMode() != filterv3.ProcessingMode_STREAMED {
				t.Fatalf("no STREAMED mode override: %v", resp.GetModeOverride())
			}
			id := "6ba7b8109dad11d180b400c04fd430c8"
			body := ": ok" + tc.eol + tc.eol + "event: endpoint" + tc.eol + "data: /messages?" + tc.param + "=" + id + tc.eol + tc.eol
			for i := 0; i < len(body); i += tc.chunk {
				r := roundTrip(t, get, respBody(body[i:min(i+tc.chunk, len(body))], false))
				if r.GetResponseBody() == nil || r.GetResponseBody().GetResponse().GetBodyMutation() != nil {
					t.Fatalf("chunk %d: got %v, want an unchanged CONTINUE", i, r)
				}
			}
			// The rest of the stream passes untouched.
			roundTrip(t, get, respBody("event: message"+tc.eol+"data: {}"+tc.eol+tc.eol, false))
			if s := e.srv.Stats(); s.SessionsLearned != 1 || s.LearnFailures != 0 {
				t.Fatalf("stats = %+v, want 1 session learned", s)
			}

			for i := range 5 {
				st, _ := e.open(t, "mcp")
				got := destination(roundTrip(t, st, reqHeaders("POST", "/messages?"+tc.param+"="+id, false)))
				if got != chosen {
					t.Fatalf("POST %d went to %q, want the SSE stream's instance %s", i, got, chosen)
				}
				closeAndWait(t, st)
			}
			cancelGet() // the GET stream ends: so does its session
			e.counter.waitAllEnded(t)
			testutil.Eventually(t, "the session ends with its GET stream", func() bool {
				st, _ := e.open(t, "mcp")
				defer closeAndWait(t, st)
				r := roundTrip(t, st, reqHeaders("POST", "/messages?"+tc.param+"="+id, false))
				return r.GetImmediateResponse().GetStatus().GetCode() == 404
			})
		})
	}
}

// TestFullDuplexBodiesPassThrough: with FULL_DUPLEX_STREAMED bodies (announced in the first
// message's protocol_config) every request and response chunk is answered with itself as a
// StreamedBodyResponse, end_of_stream included; no mode_override is sent; MCP SSE still learns
// its session from the first endpoint event; the decision ends exactly once with the stream.
func TestFullDuplexBodiesPassThrough(t *testing.T) {
	svc := affinitytest.Service("mcp", registry.AffinityMCPSSE)
	e := newEnv(t, []registry.Service{svc}, affinitytest.Instances("mcp", 2))
	fullDuplex := &extprocv3.ProtocolConfiguration{
		RequestBodyMode:  filterv3.ProcessingMode_FULL_DUPLEX_STREAMED,
		ResponseBodyMode: filterv3.ProcessingMode_FULL_DUPLEX_STREAMED,
	}
	echoed := func(t *testing.T, r *extprocv3.ProcessingResponse, request bool, want string, eos bool) {
		t.Helper()
		br := r.GetResponseBody()
		if request {
			br = r.GetRequestBody()
		}
		sr := br.GetResponse().GetBodyMutation().GetStreamedResponse()
		if br == nil || sr == nil || string(sr.GetBody()) != want || sr.GetEndOfStream() != eos {
			t.Fatalf("got %v, want the chunk %q (end_of_stream %v) streamed back", r, want, eos)
		}
	}

	get, _ := e.open(t, "mcp")
	h := reqHeaders("GET", "/sse", true)
	h.ProtocolConfig = fullDuplex
	chosen := destination(roundTrip(t, get, h))
	resp := roundTrip(t, get, respHeaders("200", chosen, false, "content-type", "text/event-stream"))
	if resp.GetModeOverride() != nil || resp.GetResponseHeaders() == nil {
		t.Fatalf("response_headers answer %v: want no mode_override in full duplex", resp)
	}
	id := "6ba7b8109dad11d180b400c04fd430c8"
	body := "event: endpoint\ndata: /messages?sessionId=" + id + "\n\n"
	for i := 0; i < len(body); i += 5 {
		chunk := body[i:min(i+5, len(body))]
		echoed(t, roundTrip(t, get, respBody(chunk, false)), false, chunk, false)
	}
	if s := e.srv.Stats(); s.SessionsLearned != 1 || s.BodiesStreamed != 0 {
		t.Fatalf("stats = %+v, want the session learned without a mode override", s)
	}

	// A POST of that session: its request body streams through too.
	post, _ := e.open(t, "mcp")
	ph := reqHeaders("POST", "/messages?sessionId="+id, false)
	ph.ProtocolConfig = fullDuplex
	if got := destination(roundTrip(t, post, ph)); got != chosen {
		t.Fatalf("POST went to %q, want the SSE stream's instance %s", got, chosen)
	}
	for _, c := range []struct {
		b   string
		eos bool
	}{{`{"jsonrpc":`, false}, {`"2.0"}`, false}, {"", true}} {
		r := roundTrip(t, post, &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestBody{
			RequestBody: &extprocv3.HttpBody{Body: []byte(c.b), EndOfStream: c.eos}}})
		echoed(t, r, true, c.b, c.eos)
	}
	roundTrip(t, post, respHeaders("202", chosen, false))
	echoed(t, roundTrip(t, post, respBody("accepted", true)), false, "accepted", true)
	closeAndWait(t, post)

	echoed(t, roundTrip(t, get, respBody("", true)), false, "", true) // the SSE stream ends
	closeAndWait(t, get)
	e.counter.waitAllEnded(t)
	if n := requestsInFlight(t, e.f, "mcp"); n != 0 {
		t.Errorf("requests in flight = %d, want 0", n)
	}
}
