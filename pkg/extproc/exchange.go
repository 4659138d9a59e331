package extproc

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"strconv"
	"strings"
	"sync"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	filterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/tether-dev/tether/pkg/affinity"
	"github.com/tether-dev/tether/pkg/wire"
)

// attributesKey is the key of ProcessingRequest.attributes that holds the filter's
// request_attributes.
const attributesKey = wire.ExtProcFilterName

// exchange is the state of one ext_proc stream. It is used by the stream's goroutine only,
// except Expire (the engine's sweeper), which shares the stream's sending side under sendMu.
type exchange struct {
	srv      *Server
	stream   extprocv3.ExternalProcessor_ProcessServer
	sendMu   sync.Mutex
	expired  bool // guarded by sendMu: the exchange was reset; nothing more is sent
	seen     bool // request_headers received
	decision affinity.Decision
	chosen   string // decision's instance as ip:port
	service  string
	grpc     bool // a gRPC request: rejections carry grpc_status
	// proxyless: gRPC's own ext_proc filter (gRFC A93) runs this exchange; the status message
	// the application sees is the ImmediateResponse's details, which then carry the code.
	proxyless bool
	route     *preEncoded // the request_headers answer, pre-encoded
	// Bodies in FULL_DUPLEX_STREAMED mode (from the stream's protocol_config): every chunk is
	// answered with itself as a StreamedBodyResponse.
	fullDuplexRequest, fullDuplexResponse bool
	sse                                   *sseScanner // non-nil while looking for the MCP SSE endpoint event
	// answeredResponse: the response_headers answer is out (handoff.go).
	answeredResponse bool
	// handoff is closed to hand the exchange off (handoff.go); set when it registers.
	handoff     chan struct{}
	handoffOnce sync.Once
}

// errExpired ends the stream of an exchange that outlived its limit.
var errExpired = status.Error(codes.DeadlineExceeded, "ext_proc: the exchange outlived its limit and was reset")

// send sends one answer on the stream, unless the exchange was reset by Expire (then the stream
// ends with errExpired).
func (ex *exchange) send(resp *extprocv3.ProcessingResponse) error {
	ex.sendMu.Lock()
	defer ex.sendMu.Unlock()
	if ex.expired {
		return errExpired
	}
	if ex.route != nil && resp == ex.route.ProcessingResponse {
		return ex.stream.SendMsg(ex.route) // pre-encoded (codec.go)
	}
	if p := ex.srv.cont.preEncoded(resp); p != nil {
		return ex.stream.SendMsg(p)
	}
	return ex.stream.Send(resp)
}

// Expire implements affinity.Expirer: the engine found the exchange open past its limit. An
// ImmediateResponse is sent at once (from another goroutine: Expire must not block): Envoy
// answers the client with it, or resets the downstream stream if the response has started,
// and closes the side stream; Process then returns and the Decision's End frees the slot.
// Nothing more is sent on the stream, and its next message ends it with DeadlineExceeded.
func (ex *exchange) Expire() {
	go func() {
		ex.sendMu.Lock()
		defer ex.sendMu.Unlock()
		if ex.expired {
			return
		}
		ex.expired = true
		ex.srv.counters.expired.Add(1)
		ex.srv.log.Warn("ext_proc: resetting an exchange that outlived its limit", "service", ex.service, "instance", ex.chosen)
		_ = ex.stream.Send(expiredResponse(ex.replyKind()))
	}()
}

// end releases the decision, if any, exactly once.
func (ex *exchange) end() {
	if ex.sse != nil {
		ex.srv.counters.learnFailures.Add(1) // the stream ended before the endpoint event
		ex.sse = nil
	}
	if ex.decision != nil {
		ex.decision.End()
		ex.decision = nil
	}
}

// handle answers one ProcessingRequest. done reports that the stream must end after resp is
// sent (an ImmediateResponse). A non-nil error ends the stream with that gRPC status.
func (ex *exchange) handle(ctx context.Context, stream extprocv3.ExternalProcessor_ProcessServer, req *extprocv3.ProcessingRequest) (resp *extprocv3.ProcessingResponse, done bool, err error) {
	if pc := req.GetProtocolConfig(); pc != nil {
		// Envoy sends the effective body modes (per-route overrides applied) with the first
		// message of the stream.
		ex.fullDuplexRequest = pc.GetRequestBodyMode() == filterv3.ProcessingMode_FULL_DUPLEX_STREAMED
		ex.fullDuplexResponse = pc.GetResponseBodyMode() == filterv3.ProcessingMode_FULL_DUPLEX_STREAMED
	}
	switch r := req.GetRequest().(type) {
	case *extprocv3.ProcessingRequest_RequestHeaders:
		return ex.requestHeaders(ctx, stream, req, r.RequestHeaders)
	case *extprocv3.ProcessingRequest_ResponseHeaders:
		ex.answeredResponse = true
		return ex.responseHeaders(ctx, req, r.ResponseHeaders), false, nil
	case *extprocv3.ProcessingRequest_ResponseBody:
		ex.responseBody(ctx, r.ResponseBody)
		if ex.fullDuplexResponse {
			return passThrough(r.ResponseBody, false), false, nil
		}
		return ex.srv.cont.responseBody, false, nil
	case *extprocv3.ProcessingRequest_RequestBody:
		if ex.fullDuplexRequest {
			return passThrough(r.RequestBody, true), false, nil
		}
		return ex.srv.cont.requestBody, false, nil
	case *extprocv3.ProcessingRequest_RequestTrailers:
		return ex.srv.cont.requestTrailers, false, nil
	case *extprocv3.ProcessingRequest_ResponseTrailers:
		return ex.srv.cont.responseTrailers, false, nil
	default:
		ex.srv.counters.protocolErrors.Add(1)
		return nil, false, status.Error(codes.InvalidArgument, "ext_proc: message without a request")
	}
}

func (ex *exchange) requestHeaders(ctx context.Context, stream extprocv3.ExternalProcessor_ProcessServer, req *extprocv3.ProcessingRequest, h *extprocv3.HttpHeaders) (*extprocv3.ProcessingResponse, bool, error) {
	s := ex.srv
	if ex.seen {
		s.counters.protocolErrors.Add(1)
		return nil, false, status.Error(codes.FailedPrecondition, "ext_proc: second request_headers on one stream")
	}
	ex.seen = true

	areq := affinity.Request{Protocol: affinity.ProtocolHTTP, Service: streamMetadata(stream, s.serviceKey)}
	if areq.Service == "" {
		areq.Service = s.defaultService
	}
	areq.Subset = subsetHint(req.GetMetadataContext())
	sawMethod := false
	for _, hv := range h.GetHeaders().GetHeaders() {
		switch hv.GetKey() {
		case ":method":
			areq.Method = headerValueOf(hv)
			sawMethod = true
		case ":path":
			areq.Path = headerValueOf(hv)
		case ":authority":
			areq.Authority = headerValueOf(hv)
		}
	}
	areq.HeaderSource = (*envoyHeaders)(h.GetHeaders())
	areq.Peer = peerFromAttributes(req.GetAttributes())
	ex.service = areq.Service
	dataPlane := streamMetadata(stream, wire.DataPlaneMetadataKey)
	ex.proxyless = isProxylessGRPC(dataPlane, sawMethod)
	// A gRPC client configured by tether's xDS picks the instance with the ring tether serves
	// it: the engine decides on that ring's pick. (A filter configured elsewhere balances by
	// a configuration tether does not know.)
	areq.GRPCRing = dataPlane == wire.DataPlaneGRPC
	if !sawMethod {
		// gRPC's filter sends no pseudo headers; its request.path is the full method and
		// request.host the channel's authority (when configured; tether's xDS does).
		a := req.GetAttributes()[attributesKey].GetFields()
		areq.Method, areq.Path, areq.Authority = "POST", a["request.path"].GetStringValue(), a["request.host"].GetStringValue()
	}
	ex.grpc = ex.proxyless || isGRPCRequest(areq.Header("content-type"))

	// The decision's deadline: every store call it makes ends by it, well inside the
	// message_timeout Envoy waits for this answer.
	dctx, cancel := context.WithTimeout(ctx, s.decisionTimeout)
	d, err := s.engine.Decide(dctx, areq)
	cancel()
	if err != nil {
		var rej *affinity.Reject
		switch {
		case errors.As(err, &rej):
			s.counters.reject(rej.Class)
			if s.log.Enabled(ctx, slog.LevelDebug) {
				s.log.DebugContext(ctx, "request rejected", "service", areq.Service, "authority", areq.Authority,
					"path", areq.Path, "code", rej.Code, "class", int(rej.Class),
					"mcp_method", areq.Header("mcp-method"), "mcp_name", areq.Header("mcp-name"))
			}
			return rejectResponse(rej, ex.replyKind()), true, nil
		case ctx.Err() != nil:
			// Envoy went away while the engine was deciding; nothing to answer.
			return nil, false, status.FromContextError(ctx.Err()).Err()
		default:
			s.counters.engineErrors.Add(1)
			s.log.ErrorContext(ctx, "engine failed to decide", "service", areq.Service, "authority", areq.Authority,
				"path", areq.Path, "error", err)
			return internalErrorResponse(ex.replyKind()), true, nil
		}
	}
	ex.decision = d
	s.counters.decisions.Add(1)
	inst := d.Instance()
	ex.route = s.routeResponse(inst.Address, inst.HTTPPort)
	ex.chosen = ex.route.addr
	d.OnExpire(ex) // after the fields Expire reads
	if s.log.Enabled(ctx, slog.LevelDebug) {
		s.log.DebugContext(ctx, "request routed", "service", d.Instance().Service, "instance", d.Instance().ID,
			"endpoint", ex.chosen, "session", d.SessionID(), "new_session", d.NewSession(),
			"mcp_method", areq.Header("mcp-method"), "mcp_name", areq.Header("mcp-name"))
	}
	return ex.route.ProcessingResponse, false, nil
}

// maxCachedRoutes bounds the route-answer cache (one entry per instance address seen).
const maxCachedRoutes = 4096

// routeKey is an instance's HTTP endpoint, the key of the route-answer cache.
type routeKey struct {
	host string
	port int
}

// routeResponse returns the request_headers answer sending a request to host:port (its addr
// is that endpoint as ip:port): the destination header (overwrite) and the envoy.lb dynamic
// metadata. Answers are built once per endpoint and shared by every stream: gRPC only reads a
// message it sends (protobuf marshalling is safe for concurrent use), and nothing modifies
// them after construction.
func (s *Server) routeResponse(host string, port int) *preEncoded {
	k := routeKey{host, port}
	if r, ok := s.routes.Load(k); ok {
		return r.(*preEncoded)
	}
	addr := net.JoinHostPort(host, strconv.Itoa(port)) // registry.Instance.HTTPAddr
	r := &extprocv3.ProcessingResponse{
		Response: &extprocv3.ProcessingResponse_RequestHeaders{RequestHeaders: &extprocv3.HeadersResponse{
			Response: &extprocv3.CommonResponse{HeaderMutation: &extprocv3.HeaderMutation{
				SetHeaders: []*corev3.HeaderValueOption{overwriteHeader(s.destHeader, addr)},
			}},
		}},
		DynamicMetadata: &structpb.Struct{Fields: map[string]*structpb.Value{
			s.namespace: structpb.NewStructValue(&structpb.Struct{Fields: map[string]*structpb.Value{
				s.destHeader: structpb.NewStringValue(addr),
			}}),
		}},
	}
	if s.cachedRoutes.Add(1) > maxCachedRoutes { // instances churned a lot: start over
		s.routes.Clear()
		s.cachedRoutes.Store(1)
	}
	actual, _ := s.routes.LoadOrStore(k, newPreEncoded(r, addr))
	return actual.(*preEncoded)
}

func (ex *exchange) responseHeaders(ctx context.Context, req *extprocv3.ProcessingRequest, h *extprocv3.HttpHeaders) *extprocv3.ProcessingResponse {
	s := ex.srv
	d := ex.decision
	if d == nil {
		return s.cont.responseHeaders // no admitted request on this stream: nothing to add
	}
	ar := affinity.Response{HeaderSource: (*envoyHeaders)(h.GetHeaders())}
	for _, hv := range h.GetHeaders().GetHeaders() {
		if hv.GetKey() == ":status" {
			ar.Status, _ = strconv.Atoi(headerValueOf(hv))
			break
		}
	}
	ar.ServedHost = servedHost(req.GetMetadataContext(), s.namespace, s.servedKey)
	if ar.ServedHost != "" && ar.ServedHost != ex.chosen {
		s.counters.mismatches.Add(1)
		if ok, held := s.mismatchLog.allow(time.Now(), mismatchLogEvery); ok {
			s.log.WarnContext(ctx, "served host differs from the chosen instance", "service", d.Instance().Service,
				"instance", d.Instance().ID, "chosen", ex.chosen, "served", ar.ServedHost, "session", d.SessionID(),
				"sinceLastLogged", held)
		}
	}
	add := d.OnResponse(ar)
	learn := d.WantsResponseBody() && !h.GetEndOfStream() && ar.Status >= 200 && ar.Status < 300
	if learn && ex.fullDuplexResponse {
		// The body comes anyway, chunk by chunk; no mode_override (Envoy ignores it in full
		// duplex mode).
		ex.sse = newSSEScanner(s.sseLimit)
		learn = false
	}
	stream := learn
	if len(add) == 0 && !stream {
		return s.cont.responseHeaders
	}
	hr := &extprocv3.HeadersResponse{Response: &extprocv3.CommonResponse{}}
	resp := &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ResponseHeaders{ResponseHeaders: hr}}
	if len(add) > 0 {
		m := &extprocv3.HeaderMutation{SetHeaders: make([]*corev3.HeaderValueOption, 0, len(add))}
		for _, hv := range add {
			m.SetHeaders = append(m.SetHeaders, headerOption(strings.ToLower(hv.Name), hv.Value, hv.Append))
		}
		hr.Response.HeaderMutation = m
	}
	if stream {
		ex.sse = newSSEScanner(s.sseLimit)
		s.counters.bodiesStreamed.Add(1)
		resp.ModeOverride = streamedResponseBodyMode()
	}
	return resp
}

// continueResponses are the plain CONTINUE answers, built and encoded once per server and
// shared by every stream (gRPC only reads what it sends; nothing modifies them).
type continueResponses struct {
	responseHeaders, responseBody, requestBody, requestTrailers, responseTrailers *extprocv3.ProcessingResponse
	// encoded holds the same answers pre-encoded (codec.go), in field order.
	encoded [5]*preEncoded
}

func newContinueResponses() continueResponses {
	c := continueResponses{
		responseHeaders: &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ResponseHeaders{
			ResponseHeaders: &extprocv3.HeadersResponse{Response: &extprocv3.CommonResponse{}}}},
		responseBody: &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ResponseBody{
			ResponseBody: &extprocv3.BodyResponse{Response: &extprocv3.CommonResponse{}}}},
		requestBody: &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_RequestBody{
			RequestBody: &extprocv3.BodyResponse{Response: &extprocv3.CommonResponse{}}}},
		requestTrailers: &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_RequestTrailers{
			RequestTrailers: &extprocv3.TrailersResponse{}}},
		responseTrailers: &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ResponseTrailers{
			ResponseTrailers: &extprocv3.TrailersResponse{}}},
	}
	for i, r := range []*extprocv3.ProcessingResponse{c.responseHeaders, c.responseBody, c.requestBody, c.requestTrailers, c.responseTrailers} {
		c.encoded[i] = newPreEncoded(r, "")
	}
	return c
}

// preEncoded returns the pre-encoded form of resp when it is one of the shared answers.
func (c *continueResponses) preEncoded(resp *extprocv3.ProcessingResponse) *preEncoded {
	for _, p := range c.encoded {
		if p.ProcessingResponse == resp {
			return p
		}
	}
	return nil
}

func (ex *exchange) responseBody(ctx context.Context, b *extprocv3.HttpBody) {
	if ex.sse == nil {
		return
	}
	s := ex.srv
	data, found, gaveUp := ex.sse.feed(b.GetBody())
	switch {
	case found:
		ex.sse = nil
		param, id := sessionIDFromEndpoint(data, ex.decision)
		if id == "" {
			s.counters.learnFailures.Add(1)
			s.log.WarnContext(ctx, "SSE endpoint event without a session id", "service", ex.decision.Instance().Service,
				"endpoint", data, "param", param)
			return
		}
		if err := ex.decision.LearnSession(id); err != nil {
			s.counters.learnFailures.Add(1)
			s.log.WarnContext(ctx, "could not bind SSE session", "service", ex.decision.Instance().Service,
				"instance", ex.decision.Instance().ID, "error", err)
			return
		}
		s.counters.learned.Add(1)
		if s.log.Enabled(ctx, slog.LevelDebug) {
			s.log.DebugContext(ctx, "SSE session learned", "service", ex.decision.Instance().Service,
				"instance", ex.decision.Instance().ID)
		}
	case gaveUp:
		ex.sse = nil
		s.counters.learnFailures.Add(1)
		s.log.WarnContext(ctx, "no SSE endpoint event within the scan limit", "service", ex.decision.Instance().Service,
			"instance", ex.decision.Instance().ID, "limit", s.sseLimit)
	}
	if b.GetEndOfStream() && ex.sse != nil {
		ex.sse = nil
		s.counters.learnFailures.Add(1)
	}
}

// streamedResponseBodyMode is the mode_override that streams this response's body through
// ext_proc (wire.StreamedResponseBodyMode).
func streamedResponseBodyMode() *filterv3.ProcessingMode {
	return envoyMode(wire.StreamedResponseBodyMode())
}

// envoyMode converts a wire processing mode (whose values are Envoy's enum values).
func envoyMode(m wire.ProcessingMode) *filterv3.ProcessingMode {
	return &filterv3.ProcessingMode{
		RequestHeaderMode:   filterv3.ProcessingMode_HeaderSendMode(m.RequestHeaders),
		ResponseHeaderMode:  filterv3.ProcessingMode_HeaderSendMode(m.ResponseHeaders),
		RequestBodyMode:     filterv3.ProcessingMode_BodySendMode(m.RequestBody),
		ResponseBodyMode:    filterv3.ProcessingMode_BodySendMode(m.ResponseBody),
		RequestTrailerMode:  filterv3.ProcessingMode_HeaderSendMode(m.RequestTrailers),
		ResponseTrailerMode: filterv3.ProcessingMode_HeaderSendMode(m.ResponseTrailers),
	}
}

// headerMapOf turns Envoy's header list into lower-case name → values, handing pseudo headers
// (":method", ":status", …) to pseudo instead. All values share one string and the value
// slices one backing array: two allocations besides the map, whatever the header count.
func headerMapOf(hdrs []*corev3.HeaderValue, pseudo func(k, v string)) map[string][]string {
	n, regular := 0, 0
	for _, hv := range hdrs {
		n += valueLen(hv)
		if !strings.HasPrefix(hv.GetKey(), ":") {
			regular++
		}
	}
	var b strings.Builder // String() hands over its buffer without copying
	b.Grow(n)
	for _, hv := range hdrs {
		if raw := hv.GetRawValue(); len(raw) > 0 {
			b.Write(raw)
		} else {
			b.WriteString(hv.GetValue())
		}
	}
	all := b.String()
	vals := make([]string, regular)
	out := make(map[string][]string, regular) // ≤ 8 entries stay in one small map group
	off, j := 0, 0
	for _, hv := range hdrs {
		l := valueLen(hv)
		v := all[off : off+l]
		off += l
		k := hv.GetKey()
		if strings.HasPrefix(k, ":") {
			pseudo(k, v)
			continue
		}
		k = strings.ToLower(k) // Envoy sends lower-case names; be safe with other clients
		vals[j] = v
		if prev, ok := out[k]; ok {
			out[k] = append(prev[:len(prev):len(prev)], v) // copy: never write into vals
		} else {
			out[k] = vals[j : j+1 : j+1]
		}
		j++
	}
	return out
}

// valueLen is the length of the header's value: raw_value (what Envoy sends by default,
// envoy.reloadable_features.send_header_raw_value) or value.
func valueLen(h *corev3.HeaderValue) int {
	if raw := h.GetRawValue(); len(raw) > 0 {
		return len(raw)
	}
	return len(h.GetValue())
}

// streamMetadata reads one key of the stream's initial metadata: from the headers the
// first-message tap kept (no copy), else from the context.
func streamMetadata(stream extprocv3.ExternalProcessor_ProcessServer, key string) string {
	ctx := stream.Context()
	if g, ok := ctx.Value(silentGuardKey{}).(*silentGuard); ok && g.md != nil {
		if v := g.md[key]; len(v) > 0 {
			return v[0]
		}
		if key == strings.ToLower(key) {
			return ""
		}
	}
	if v := metadata.ValueFromIncomingContext(ctx, key); len(v) > 0 {
		return v[0]
	}
	return ""
}

// peerFromAttributes returns the client as ip:port from the source.address and source.port
// request attributes. Envoy's source.address already includes the port for IP addresses;
// source.port is used when it does not.
func peerFromAttributes(attrs map[string]*structpb.Struct) string {
	a := attrs[attributesKey]
	if a == nil {
		return ""
	}
	addr := a.GetFields()["source.address"].GetStringValue()
	if addr == "" {
		return ""
	}
	if host, port, err := net.SplitHostPort(addr); err == nil && host != "" && port != "" {
		return addr
	}
	pv := a.GetFields()["source.port"]
	var port string
	switch pv.GetKind().(type) {
	case *structpb.Value_NumberValue:
		port = strconv.FormatInt(int64(pv.GetNumberValue()), 10)
	case *structpb.Value_StringValue:
		port = pv.GetStringValue()
	}
	if port == "" || port == "0" {
		return addr
	}
	return net.JoinHostPort(strings.Trim(addr, "[]"), port)
}

// subsetHint reads the endpoint picker's subset hint (wire.SubsetHintNamespace/SubsetHintKey) from
// the metadata context: a list of ip:port strings, or one comma-separated string. nil when
// absent.
func subsetHint(md *corev3.Metadata) []string {
	ns := md.GetFilterMetadata()[wire.SubsetHintNamespace]
	if ns == nil {
		return nil
	}
	v := ns.GetFields()[wire.SubsetHintKey]
	var out []string
	switch k := v.GetKind().(type) {
	case *structpb.Value_ListValue:
		for _, e := range k.ListValue.GetValues() {
			if s := strings.TrimSpace(e.GetStringValue()); s != "" {
				out = append(out, s)
			}
		}
	case *structpb.Value_StringValue:
		for _, s := range strings.Split(k.StringValue, ",") {
			if s = strings.TrimSpace(s); s != "" {
				out = append(out, s)
			}
		}
	}
	return out
}

// servedHost reads namespace/key from the forwarded metadata context.
func servedHost(md *corev3.Metadata, namespace, key string) string {
	ns := md.GetFilterMetadata()[namespace]
	if ns == nil {
		return ""
	}
	return ns.GetFields()[key].GetStringValue()
}

// passThrough answers a FULL_DUPLEX_STREAMED body chunk with the same bytes and end_of_stream:
// the chunk reaches the other side unchanged. The answer shares b's buffer, which gRPC only
// reads while marshalling it.
func passThrough(b *extprocv3.HttpBody, request bool) *extprocv3.ProcessingResponse {
	br := &extprocv3.BodyResponse{Response: &extprocv3.CommonResponse{BodyMutation: &extprocv3.BodyMutation{
		Mutation: &extprocv3.BodyMutation_StreamedResponse{StreamedResponse: &extprocv3.StreamedBodyResponse{
			Body: b.GetBody(), EndOfStream: b.GetEndOfStream(),
		}},
	}}}
	if request {
		return &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_RequestBody{RequestBody: br}}
	}
	return &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ResponseBody{ResponseBody: br}}
}
