package wire_test

import (
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/tether-dev/tether/pkg/affinity"
	"github.com/tether-dev/tether/pkg/affinity/affinitytest"
	"github.com/tether-dev/tether/pkg/api/apitest"
	tetherv1 "github.com/tether-dev/tether/pkg/api/gen/tether/v1"
	"github.com/tether-dev/tether/pkg/extproc"
	"github.com/tether-dev/tether/pkg/registry"
	"github.com/tether-dev/tether/pkg/sipdecide"
	"github.com/tether-dev/tether/pkg/wire"
)

// answer is what one boundary answered.
type answer struct {
	http  int        // HTTP status (0 on the gRPC surface)
	code  codes.Code // gRPC code (gRPC surface only)
	retry string     // Retry-After header, or the RetryInfo delay in seconds on gRPC
	// errorCode is the stable code: the body's errorCode over HTTP, the ErrorInfo reason
	// (domain wire.ErrorDomain) on gRPC.
	errorCode string
}

// TestEveryRejectionClassOnEverySurface provokes each rejection class through ext_proc, the SIP
// decision endpoint, the SessionAPI's HTTP binding and its gRPC binding, all on one real
// engine, and holds every answer to wire.Lookup: the HTTP status, the gRPC code and a
// Retry-After of 1 s (the engine's default hint) exactly on retryable classes. Every answer
// carries a stable code in the same field (errorCode; ErrorInfo on gRPC), and a condition
// provoked alike on every surface (no capacity, an unknown service, an unknown session) gets
// the same code on each. Pairs a surface cannot produce are listed in cannot, with the reason.
func TestEveryRejectionClassOnEverySurface(t *testing.T) {
	web := affinitytest.Service("web", registry.AffinityCookie) // one session, one request slot
	web.SessionsPerInstance, web.RequestSlotsPerInstance, web.DisableSessionIDReuse = 1, 1, true
	web.Match.PathPrefix = "/web"
	mcp := affinitytest.Service("mcp", registry.AffinityMCPStreamable)
	mcp.Match.PathPrefix = "/mcp"
	hdr := affinitytest.Service("hdr", registry.AffinityHeader)
	hdr.SessionsPerInstance = 1
	hdr.Match.PathPrefix = "/hdr"
	voice := affinitytest.Service("voice", registry.AffinityNone) // SIP round robin, one request slot
	voice.RequestSlotsPerInstance = 1
	voice.Match.PathPrefix = "/voice"
	dark := affinitytest.Service("dark", registry.AffinityHash) // no instances
	dark.Match.PathPrefix = "/dark"
	var insts []registry.Instance
	for _, s := range []string{"web", "mcp", "hdr", "voice"} {
		insts = append(insts, affinitytest.Instances(s, 1)...)
	}
	srv := apitest.Start(t, []registry.Service{web, mcp, hdr, voice, dark}, insts)
	f := srv.Fixture
	ctx := context.Background()

	// State the triggers need. web: an expired session (reuse disabled) and a live one
	// holding the only session slot, whose only request slot a held decision takes.
	expired, err := f.Engine.CreateSession(ctx, "web", affinity.CreateOptions{TTL: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	f.Clock.Advance(2 * time.Second)
	f.Reap(t)
	live, err := f.Engine.CreateSession(ctx, "web", affinity.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	held, err := f.Engine.Decide(ctx, affinitytest.HTTP("web", "GET", "/web", "cookie", "tether-session="+live.ID))
	if err != nil {
		t.Fatal(err)
	}
	defer held.End()
	// hdr: its only session slot taken by "taken". voice: its only request slot held.
	if _, err := f.Engine.CreateSession(ctx, "hdr", affinity.CreateOptions{ID: "taken"}); err != nil {
		t.Fatal(err)
	}
	sipHeld, err := f.Engine.Decide(ctx, affinity.Request{Service: "voice", Protocol: affinity.ProtocolSIP, Method: "INVITE",
		Path: "sip:bob@example.com", Headers: map[string][]string{"from": {"<sip:a@example.com>;tag=1"}, "call-id": {"c1"}}})
	if err != nil {
		t.Fatal(err)
	}
	defer sipHeld.End()

	ep := startExtProc(t, f.Engine)
	sip := httptest.NewServer(sipdecide.NewHandler(f.Engine))
	t.Cleanup(sip.Close)
	grpcc := tetherv1.NewSessionServiceClient(srv.Dial(t))

	type surface struct {
		name    string
		provoke map[wire.Class]func(t *testing.T) answer
		cannot  map[wire.Class]string
	}
	extProc := func(service string, hdrs ...string) func(t *testing.T) answer {
		return func(t *testing.T) answer { return ep.request(t, service, hdrs...) }
	}
	sipDecide := func(path, body string) func(t *testing.T) answer {
		return func(t *testing.T) answer {
			q := "?method=INVITE&ruri=sip:bob@example.com&from=%3Csip:a@example.com%3E%3Btag%3D2&callid=c2"
			if body != "" {
				q = ""
			}
			return httpAnswer(t, "POST", sip.URL+path+q, body)
		}
	}
	apiHTTP := func(method, path, body string) func(t *testing.T) answer {
		return func(t *testing.T) answer {
			return httpAnswer(t, method, srv.URL+path, body, "Content-Type", "application/json")
		}
	}
	apiGRPC := func(call func() error) func(t *testing.T) answer {
		return func(t *testing.T) answer { return grpcAnswer(t, call()) }
	}
	noRequestSlots := "SessionAPI calls take no request slot"
	surfaces := []surface{
		{"ext_proc", map[wire.Class]func(*testing.T) answer{
			wire.ClassBadRequest:      extProc("web", "cookie", "tether-session=not-an-id"),
			wire.ClassNotFound:        extProc("mcp", "mcp-session-id", "gone"),
			wire.ClassConflict:        extProc("web", "cookie", "tether-session="+expired.ID),
			wire.ClassTooManyRequests: extProc("web", "cookie", "tether-session="+live.ID),
			wire.ClassNoCapacity:      extProc("web"),
			wire.ClassNoService:       extProc("nope"),
		}, nil},
		{"sip decide", map[wire.Class]func(*testing.T) answer{
			wire.ClassBadRequest:      sipDecide("/v1/sip/web/decide", ""), // SIP on a cookie service
			wire.ClassTooManyRequests: sipDecide("/v1/sip/voice/decide", ""),
			wire.ClassNoCapacity:      sipDecide("/v1/sip/dark/decide", ""),
			wire.ClassNoService:       sipDecide("/v1/sip/nope/decide", ""),
		}, map[wire.Class]string{
			wire.ClassNotFound: "SIP modes (none, hash) have no session ids to miss",
			wire.ClassConflict: "SIP modes have no session ids to reuse",
		}},
		{"SessionAPI HTTP", map[wire.Class]func(*testing.T) answer{
			wire.ClassBadRequest: apiHTTP("POST", "/v1/services/hdr/sessions", `{"sessionId":"-bad"}`),
			wire.ClassNotFound:   apiHTTP("GET", "/v1/services/hdr/sessions/missing", ""),
			wire.ClassConflict:   apiHTTP("POST", "/v1/services/hdr/sessions", `{"sessionId":"taken"}`),
			wire.ClassNoCapacity: apiHTTP("POST", "/v1/services/hdr/sessions", `{}`),
			wire.ClassNoService:  apiHTTP("POST", "/v1/services/nope/sessions", `{}`),
		}, map[wire.Class]string{wire.ClassTooManyRequests: noRequestSlots}},
		{"SessionAPI gRPC", map[wire.Class]func(*testing.T) answer{
			wire.ClassBadRequest: apiGRPC(func() error {
				_, err := grpcc.CreateSession(ctx, &tetherv1.CreateSessionRequest{Service: "hdr", SessionId: "-bad"})
				return err
			}),
			wire.ClassNotFound: apiGRPC(func() error {
				_, err := grpcc.GetSession(ctx, &tetherv1.GetSessionRequest{Service: "hdr", SessionId: "missing"})
				return err
			}),
			wire.ClassConflict: apiGRPC(func() error {
				_, err := grpcc.CreateSession(ctx, &tetherv1.CreateSessionRequest{Service: "hdr", SessionId: "taken"})
				return err
			}),
			wire.ClassNoCapacity: apiGRPC(func() error {
				_, err := grpcc.CreateSession(ctx, &tetherv1.CreateSessionRequest{Service: "hdr"})
				return err
			}),
			wire.ClassNoService: apiGRPC(func() error {
				_, err := grpcc.CreateSession(ctx, &tetherv1.CreateSessionRequest{Service: "nope"})
				return err
			}),
		}, map[wire.Class]string{wire.ClassTooManyRequests: noRequestSlots}},
	}
	byClass := map[wire.Class]map[string]string{} // class → surface → stable code
	for _, s := range surfaces {
		for _, c := range wire.Classes() {
			provoke, ok := s.provoke[c]
			if !ok {
				if s.cannot[c] == "" {
					t.Errorf("%s: no trigger for %v and no reason why it cannot answer it", s.name, c)
				}
				t.Logf("%s cannot answer %v: %s", s.name, c, s.cannot[c])
				continue
			}
			t.Run(s.name+"/"+c.String(), func(t *testing.T) {
				row := wire.Lookup(c)
				want := answer{http: row.HTTPStatus}
				if s.name == "SessionAPI gRPC" {
					want = answer{code: row.GRPCCode}
				}
				if row.Retryable {
					want.retry = "1"
				}
				got := provoke(t)
				if got.errorCode == "" {
					t.Errorf("answered %+v without a stable code", got)
				}
				if byClass[c] == nil {
					byClass[c] = map[string]string{}
				}
				byClass[c][s.name] = got.errorCode
				if got.errorCode = ""; got != want {
					t.Errorf("answered %+v, want %+v", got, want)
				}
			})
		}
	}
	// The same condition on every surface: the same code in the same field.
	for c, want := range map[wire.Class]string{
		wire.ClassNoCapacity: "NoCapacity", wire.ClassNoService: "ServiceNotFound", wire.ClassNotFound: "SessionNotFound",
	} {
		for _, s := range surfaces {
			if got, ok := byClass[c][s.name]; ok && got != want {
				t.Errorf("%s answers %v with code %q, want %q as on every surface", s.name, c, got, want)
			}
		}
	}
	for _, c := range wire.Classes() {
		t.Logf("%-16v %v", c, byClass[c])
	}
}

func httpAnswer(t *testing.T, method, url, body string, headers ...string) answer {
	t.Helper()
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set(wire.ClientHeader, "test")
	for i := 0; i+1 < len(headers); i += 2 {
		req.Header.Set(headers[i], headers[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	b, err := io.ReadAll(resp.Body)
	_ = resp.Body.Close()
	if err != nil {
		t.Fatal(err)
	}
	var eb wire.ErrorBody
	if err := json.Unmarshal(b, &eb); err != nil {
		t.Errorf("%s %s: body %q is not the error model: %v", method, url, b, err)
	}
	return answer{http: resp.StatusCode, retry: resp.Header.Get("Retry-After"), errorCode: eb.ErrorCode}
}

func grpcAnswer(t *testing.T, err error) answer {
	t.Helper()
	st := status.Convert(err)
	a := answer{code: st.Code()}
	for _, d := range st.Details() {
		if ri, ok := d.(*errdetails.RetryInfo); ok {
			a.retry = strings.TrimSuffix(ri.GetRetryDelay().AsDuration().String(), "s")
		}
		if info, ok := d.(*errdetails.ErrorInfo); ok && info.GetDomain() == wire.ErrorDomain {
			a.errorCode = info.GetReason()
		}
	}
	return a
}

// extProcClient plays Envoy's part of an ext_proc stream against a real server on loopback.
type extProcClient struct {
	c extprocv3.ExternalProcessorClient
}

func startExtProc(t *testing.T, eng extproc.Engine) *extProcClient {
	t.Helper()
	gs := grpc.NewServer()
	extproc.Register(gs, extproc.NewServer(eng))
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = gs.Serve(ln) }()
	conn, err := grpc.NewClient(ln.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close(); gs.Stop() })
	return &extProcClient{c: extprocv3.NewExternalProcessorClient(conn)}
}

// request sends one request_headers for a GET naming service and returns the immediate
// response's status and retry-after (status 0: the request was admitted).
func (e *extProcClient) request(t *testing.T, service string, hdrs ...string) answer {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ctx = metadata.AppendToOutgoingContext(ctx, wire.ServiceMetadataKey, service)
	st, err := e.c.Process(ctx)
	if err != nil {
		t.Fatal(err)
	}
	hv := []*corev3.HeaderValue{
		{Key: ":method", RawValue: []byte("GET")}, {Key: ":path", RawValue: []byte("/" + service)},
		{Key: ":authority", RawValue: []byte("app.example")}, {Key: ":scheme", RawValue: []byte("http")},
	}
	for i := 0; i+1 < len(hdrs); i += 2 {
		hv = append(hv, &corev3.HeaderValue{Key: hdrs[i], RawValue: []byte(hdrs[i+1])})
	}
	if err := st.Send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestHeaders{
		RequestHeaders: &extprocv3.HttpHeaders{Headers: &corev3.HeaderMap{Headers: hv}, EndOfStream: true}}}); err != nil {
		t.Fatal(err)
	}
	resp, err := st.Recv()
	if err != nil {
		t.Fatal(err)
	}
	_ = st.CloseSend()
	ir := resp.GetImmediateResponse()
	if ir == nil {
		return answer{}
	}
	a := answer{http: int(ir.GetStatus().GetCode())}
	var body wire.ErrorBody
	if err := json.Unmarshal(ir.GetBody(), &body); err != nil {
		t.Errorf("ext_proc body %q is not the error model: %v", ir.GetBody(), err)
	}
	a.errorCode = body.ErrorCode
	for _, h := range ir.GetHeaders().GetSetHeaders() {
		if h.GetHeader().GetKey() == wire.RetryAfterHeader {
			a.retry = string(h.GetHeader().GetRawValue())
		}
	}
	return a
}
