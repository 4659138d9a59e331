// Package envoyharness is an Envoy-faithful stand-in for tests: an HTTP front on loopback that,
// per request, runs an ext_proc stream against tether exactly as Envoy's
// envoy.filters.http.ext_proc filter does with tether's configuration, resolves the
// destination like the override_host load-balancing policy against the endpoints it is given
// (from xDS in the end-to-end tests), and proxies to real upstream HTTP servers. README.md
// lists what is modelled and what is not.
package envoyharness

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	filterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/tether-dev/tether/pkg/wire"
	"github.com/tether-dev/tether/pkg/xds"
)

// Option configures a Harness.
type Option func(*Harness)

// WithMessageTimeout sets message_timeout (default 500 ms, tether's extProc.messageTimeout).
func WithMessageTimeout(d time.Duration) Option { return func(h *Harness) { h.messageTimeout = d } }

// WithStatusOnError sets status_on_error (default 503).
func WithStatusOnError(code int) Option { return func(h *Harness) { h.statusOnError = code } }

// WithCloseMode sets how ext_proc streams end (default CloseEnvoy).
func WithCloseMode(m CloseMode) Option { return func(h *Harness) { h.closeMode = m } }

// WithStreamCloseOptimization turns Envoy ≥1.37's early close
// (envoy.reloadable_features.ext_proc_stream_close_optimization, default on) on or off. Off, a
// stream ends only when the HTTP exchange ends (filter destruction).
func WithStreamCloseOptimization(on bool) Option {
	return func(h *Harness) { h.closeOptimization = on }
}

// WithBodyBeforeHeadersAnswer makes the harness treat the response_headers answer as arriving
// only after the whole response body (up to the 1 MiB buffer limit, waiting at most 2 s) has
// reached it — the timing of a small, fast response on a busy processor — instead of whenever
// it arrives. With bodies NONE and response trailers SEND, Envoy ≥ 1.37 then closes the side
// stream right after that answer when the body had no trailers: this option makes that case
// deterministic in tests.
func WithBodyBeforeHeadersAnswer(on bool) Option { return func(h *Harness) { h.bodyFirst = on } }

// WithEmptyResponseTrailers makes the harness send an empty response_trailers message at the
// end of a response body that had no trailers, as Envoy releases before 1.2x did when
// response_trailer_mode was SEND. Current Envoy (and the default here) sends trailers only
// when the upstream sent some; the stream then ends at filter destruction.
func WithEmptyResponseTrailers(on bool) Option { return func(h *Harness) { h.emptyTrailers = on } }

// WithProcessingMode replaces the filter's processing_mode (default: the wire contract's
// headers SEND, bodies NONE, request trailers SKIP, response trailers SEND).
func WithProcessingMode(m *filterv3.ProcessingMode) Option {
	return func(h *Harness) { h.mode = proto.Clone(m).(*filterv3.ProcessingMode) }
}

// WithKeepalive sets the HTTP/2 keepalive of the harness's connections to the ext_proc server
// (default wire.KeepaliveInterval and wire.KeepaliveTimeout, the generated bootstrap's
// connection_keepalive on the ext_proc cluster; interval 0 sends no pings). grpc-go's client
// raises intervals below 10 s to 10 s.
func WithKeepalive(interval, timeout time.Duration) Option {
	return func(h *Harness) { h.keepalive, h.keepaliveTimeout = interval, timeout }
}

// WithAllowModeOverride sets allow_mode_override (default true).
func WithAllowModeOverride(on bool) Option { return func(h *Harness) { h.allowModeOverride = on } }

// WithNamespaces sets metadata_options receiving and forwarding untyped namespaces (default
// [envoy.lb] both). An empty receiving list drops all dynamic metadata, as Envoy does.
func WithNamespaces(receiving, forwarding []string) Option {
	return func(h *Harness) { h.receiving, h.forwarding = receiving, forwarding }
}

// WithOverrideHost sets the override_host sources and selected_host_key: metadata namespace
// and key, the header, and the served-host key (defaults envoy.lb,
// x-gateway-destination-endpoint, x-gateway-destination-endpoint, and
// x-gateway-destination-endpoint-served).
func WithOverrideHost(namespace, metadataKey, header, servedKey string) Option {
	return func(h *Harness) {
		h.override.metadataNS, h.override.metadataKey, h.override.header = namespace, metadataKey, header
		h.servedKey = servedKey
	}
}

// WithServiceMetadataKey sets the gRPC initial metadata key naming the service (default
// x-tether-service).
func WithServiceMetadataKey(k string) Option { return func(h *Harness) { h.serviceKey = k } }

// WithMutationSemantics sets whose reading of append_action applies to header mutations
// (default EnvoySemantics; GRPCSemantics for a proxyless gRPC data plane, gRFC A93).
func WithMutationSemantics(sem Semantics) Option { return func(h *Harness) { h.semantics = sem } }

// WithLogger sets the logger (default discards).
func WithLogger(l *slog.Logger) Option { return func(h *Harness) { h.log = l } }

// Harness is the Envoy stand-in. Its methods are safe for concurrent use.
type Harness struct {
	log               *slog.Logger
	vhosts            []VirtualHost
	earlyRemove       []string
	endpoints         EndpointSource
	cluster           *cluster
	clusterActive     []string
	clusterStandby    []string
	healthCheck       *HealthCheck
	retry             retryPolicy
	messageTimeout    time.Duration
	statusOnError     int
	closeMode         CloseMode
	closeOptimization bool
	emptyTrailers     bool
	bodyFirst         bool
	mode              *filterv3.ProcessingMode
	allowModeOverride bool
	receiving         []string
	forwarding        []string
	serviceKey        string
	servedKey         string
	override          overrideHost
	semantics         Semantics
	keepalive         time.Duration
	keepaliveTimeout  time.Duration

	transport  *http.Transport
	transport2 *http.Transport // HTTP/2 prior knowledge, for HTTP/2 clusters
	ln         net.Listener
	srv        *http.Server
	stats      counters
}

// WithEarlyHeaderRemoval removes these request headers before routing and before ext_proc,
// as the connection manager's early_header_mutation_extensions do (tether's generated config
// removes the destination header).
func WithEarlyHeaderRemoval(names ...string) Option {
	return func(h *Harness) { h.earlyRemove = append(h.earlyRemove, names...) }
}

// New starts a harness on 127.0.0.1 with a random port, talking ext_proc to extProcAddr
// (host:port; with WithExtProcCluster, to that cluster's hosts), routing with vhosts and taking
// cluster membership from endpoints. With a health-checked cluster it returns once every host
// had its first check (at most 30 s), as Envoy initializes such a cluster.
func New(extProcAddr string, endpoints EndpointSource, vhosts []VirtualHost, opts ...Option) (*Harness, error) {
	h := &Harness{
		log:               slog.New(slog.DiscardHandler),
		vhosts:            vhosts,
		endpoints:         endpoints,
		messageTimeout:    500 * time.Millisecond,
		statusOnError:     503,
		closeMode:         CloseEnvoy,
		closeOptimization: true,
		mode: &filterv3.ProcessingMode{
			RequestHeaderMode:   filterv3.ProcessingMode_SEND,
			ResponseHeaderMode:  filterv3.ProcessingMode_SEND,
			RequestBodyMode:     filterv3.ProcessingMode_NONE,
			ResponseBodyMode:    filterv3.ProcessingMode_NONE,
			RequestTrailerMode:  filterv3.ProcessingMode_SKIP,
			ResponseTrailerMode: filterv3.ProcessingMode_SEND,
		},
		allowModeOverride: true,
		retry:             retryPolicyOf(xds.ExtProcRetryPolicy()),
		keepalive:         wire.KeepaliveInterval,
		keepaliveTimeout:  wire.KeepaliveTimeout,
		receiving:         []string{"envoy.lb"},
		forwarding:        []string{"envoy.lb"},
		serviceKey:        "x-tether-service",
		servedKey:         "x-gateway-destination-endpoint-served",
		override: overrideHost{
			metadataNS: "envoy.lb", metadataKey: "x-gateway-destination-endpoint",
			header: "x-gateway-destination-endpoint",
		},
	}
	for _, o := range opts {
		o(h)
	}
	active := h.clusterActive
	if extProcAddr != "" {
		active = append([]string{extProcAddr}, active...)
	}
	cl, err := newCluster(active, h.clusterStandby, h.healthCheck, h.keepalive, h.keepaliveTimeout)
	if err != nil {
		return nil, err
	}
	for _, hs := range cl.hosts {
		if _, err := hs.pool.dial(); err != nil {
			_ = cl.close()
			return nil, err
		}
	}
	ictx, icancel := context.WithTimeout(context.Background(), 30*time.Second)
	err = cl.start(ictx)
	icancel()
	if err != nil {
		_ = cl.close()
		return nil, err
	}
	h.cluster = cl
	h.transport = &http.Transport{
		Proxy:               nil,
		DialContext:         (&net.Dialer{Timeout: 2 * time.Second}).DialContext,
		MaxIdleConns:        1000,
		MaxIdleConnsPerHost: 1000,
		IdleConnTimeout:     30 * time.Second,
		DisableCompression:  true,
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		_ = h.cluster.close()
		return nil, fmt.Errorf("envoyharness: listen: %w", err)
	}
	// Upstream HTTP/2 without TLS (prior knowledge), for clusters whose protocol options say
	// HTTP/2 (gRPC upstreams).
	h.transport2 = h.transport.Clone()
	h.transport2.Protocols = new(http.Protocols)
	h.transport2.Protocols.SetUnencryptedHTTP2(true)
	h.ln = ln
	h.srv = &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}
	// Downstream HTTP/1.1 and HTTP/2 with prior knowledge (h2c), as a codec_type AUTO listener
	// without TLS accepts: gRPC clients dial it directly.
	h.srv.Protocols = new(http.Protocols)
	h.srv.Protocols.SetHTTP1(true)
	h.srv.Protocols.SetUnencryptedHTTP2(true)
	go func() { _ = h.srv.Serve(ln) }()
	return h, nil
}

// URL returns the data-plane base URL, http://127.0.0.1:port.
func (h *Harness) URL() string { return "http://" + h.ln.Addr().String() }

// Close stops the listener, open exchanges and the ext_proc connection.
func (h *Harness) Close() error {
	err := h.srv.Close()
	h.transport.CloseIdleConnections()
	h.transport2.CloseIdleConnections()
	if cerr := h.cluster.close(); err == nil {
		err = cerr
	}
	return err
}

// Stats counts what the harness did, like Envoy's ext_proc and cluster stats.
type Stats struct {
	Requests uint64
	// LocalReplies counts responses the harness generated itself (ImmediateResponse, errors,
	// no route, no upstream).
	LocalReplies uint64
	// ImmediateResponses counts ImmediateResponse messages applied.
	ImmediateResponses uint64
	StreamsOpened      uint64
	// StreamsClosedEarly counts streams closed after the last expected response (close
	// optimization) rather than at the end of the exchange.
	StreamsClosedEarly uint64
	MessageTimeouts    uint64
	// StreamErrors counts streams that ended with a non-OK status while the exchange needed
	// them (onGrpcError).
	StreamErrors uint64
	// StreamsClosedByServer counts streams the server ended with OK before the exchange was
	// done (onGrpcClose: processing continues without ext_proc).
	StreamsClosedByServer uint64
	SpuriousMessages      uint64
	// RejectedMutations counts header mutations ignored by the mutation rules.
	RejectedMutations uint64
	// MutationErrors counts responses whose mutations were refused with an error.
	MutationErrors uint64
	// DroppedMetadata counts dynamic metadata namespaces dropped (not in receiving_namespaces).
	DroppedMetadata uint64
	// ModeOverrides counts mode_override messages honoured.
	ModeOverrides uint64
	// FallbackPicks counts requests whose override_host list had no entry in the cluster, so
	// the fallback policy chose silently.
	FallbackPicks uint64
	// UpstreamErrors counts upstream connection failures (local reply 503).
	UpstreamErrors uint64
	// FullDuplexChunksLost counts FULL_DUPLEX_STREAMED response chunks sent to a processor
	// that then closed the stream with OK without answering them: Envoy keeps no copy, so
	// they never reach the client.
	FullDuplexChunksLost uint64
	// Retries counts side stream retries (the grpc_service retry_policy).
	Retries uint64
}

type counters struct {
	requests, localReplies, immediate, opened, closedEarly, timeouts, streamErrors, closedByServer,
	spurious, rejectedMutations, mutationErrors, droppedMetadata, modeOverrides, fallback, upstreamErrors,
	fullDuplexLost, retries atomic.Uint64
}

// Stats returns a snapshot of the counters.
func (h *Harness) Stats() Stats {
	c := &h.stats
	return Stats{
		Requests: c.requests.Load(), LocalReplies: c.localReplies.Load(), ImmediateResponses: c.immediate.Load(),
		StreamsOpened: c.opened.Load(), StreamsClosedEarly: c.closedEarly.Load(), MessageTimeouts: c.timeouts.Load(),
		StreamErrors: c.streamErrors.Load(), StreamsClosedByServer: c.closedByServer.Load(),
		SpuriousMessages: c.spurious.Load(), RejectedMutations: c.rejectedMutations.Load(),
		MutationErrors: c.mutationErrors.Load(), DroppedMetadata: c.droppedMetadata.Load(),
		ModeOverrides: c.modeOverrides.Load(), FallbackPicks: c.fallback.Load(), UpstreamErrors: c.upstreamErrors.Load(),
		FullDuplexChunksLost: c.fullDuplexLost.Load(), Retries: c.retries.Load(),
	}
}

func (h *Harness) route(host, path string) *Route { return matchRoute(h.vhosts, host, path) }

func (h *Harness) http1Trailers(cluster string) bool {
	t, ok := h.endpoints.(HTTP1Trailers)
	return ok && t.HTTP1Trailers(cluster)
}

// ServeHTTP runs one downstream request through the modelled filter chain: ext_proc, then the
// router with the override_host cluster.
func (h *Harness) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	h.stats.requests.Add(1)
	// Envoy streams the request and the response independently. Without full duplex, Go's
	// HTTP/1 server consumes and closes the unread request body when the response starts: the
	// response then waits for the whole request body, and the upstream transport, still
	// reading that body (its final EOF check), fails and closes the upstream connection,
	// cutting the response mid-stream.
	_ = http.NewResponseController(w).EnableFullDuplex()
	// In full duplex the server no longer consumes the request body when the response starts;
	// consume and close it before returning, as that path did. (Left to the server, an unread
	// body reaches EOF only after it aborted its background read, which starts a second one,
	// and the next request on the connection panics with "invalid concurrent Body.Read call".)
	defer func() { _ = r.Body.Close() }()
	ex := &exchange{h: h, w: w, r: r, ctx: r.Context(), md: map[string]*structpb.Struct{},
		mode: proto.Clone(h.mode).(*filterv3.ProcessingMode)}
	defer ex.destroy()
	ex.run()
}

// exchange is one downstream request: Envoy's ActiveStream plus the ext_proc filter instance.
type exchange struct {
	h     *Harness
	w     http.ResponseWriter
	r     *http.Request
	ctx   context.Context
	route *Route
	req   headerMap
	md    map[string]*structpb.Struct // StreamInfo dynamic metadata
	mode  *filterv3.ProcessingMode

	grpc bool // a gRPC request: local replies are trailers-only gRPC responses
	// requestPump and responsePump are closed when the FULL_DUPLEX_STREAMED body pumps
	// (fullduplex.go) have stopped.
	requestPump, responsePump chan struct{}
	stream                    *sideStream
	// firstMsg is the side stream's first message, kept for the retry policy; retries counts
	// the retries done; answered is set at the first answer (no retry after it).
	firstMsg *extprocv3.ProcessingRequest
	retries  int
	answered bool
	// requestBody feeds the upstream request with the chunks the processor streams back
	// (FULL_DUPLEX_STREAMED request body); nil otherwise.
	requestBody io.ReadCloser
	complete    bool // processing_complete_: ext_proc is out of the picture
	// sentRequestAttrs / headersSent: per-direction attribute bookkeeping and whether the
	// downstream response has started.
	sentRequestAttrs bool
	headersSent      bool
	// upCancel cancels the upstream request: a side-stream failure seen by a watcher (bodies
	// NONE) or a spurious request-body answer (full duplex) interrupts the upstream at once.
	upCancel context.CancelFunc
	// reqSpurious is set by the full-duplex request-body forwarder when the processor's answer
	// to a request_body chunk is spurious.
	reqSpurious atomic.Bool
	// dropTrailers: the upstream's trailers never reach the filter (HTTP/1 without
	// enable_trailers).
	dropTrailers bool
}

// upstreamTrailers is what the filter chain sees of the upstream's trailers.
func (ex *exchange) upstreamTrailers(upstream *http.Response) http.Header {
	if upstream == nil || ex.dropTrailers {
		return nil
	}
	return upstream.Trailer
}

func (ex *exchange) run() {
	h, r := ex.h, ex.r
	upCtx, upCancel := context.WithCancel(ex.ctx)
	defer upCancel()
	ex.upCancel = upCancel
	ex.req.add(":authority", r.Host)
	ex.req.add(":path", r.URL.RequestURI())
	ex.req.add(":method", r.Method)
	ex.req.add(":scheme", "http")
	ex.req.fromHTTP(r.Header)
	ex.grpc = isGRPC(ex.req.first("content-type"))
	for _, name := range h.earlyRemove {
		ex.req.remove(strings.ToLower(name))
	}
	if h.semantics != GRPCSemantics { // gRPC's filter has no connection manager (a93.go)
		if ex.req.first("x-forwarded-proto") == "" {
			ex.req.add("x-forwarded-proto", "http")
		}
		if ex.req.first("x-request-id") == "" {
			ex.req.add("x-request-id", newRequestID())
		}
	}
	hasBody := r.ContentLength != 0
	ex.route = h.route(r.Host, r.URL.Path)
	if ex.route != nil && ex.route.Disabled {
		ex.complete = true
	}
	if ex.route != nil && ex.route.ProcessingMode != nil {
		ex.mode = proto.Clone(ex.route.ProcessingMode).(*filterv3.ProcessingMode) // mergePerRouteConfig
	}

	if !ex.complete && ex.mode.GetRequestHeaderMode() != filterv3.ProcessingMode_SKIP {
		if !ex.open() {
			return
		}
		sent := ex.req.proto()
		if h.semantics == GRPCSemantics {
			sent = a93Headers(&ex.req)
		}
		msg := &extprocv3.ProcessingRequest{
			Request: &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: &extprocv3.HttpHeaders{
				Headers: sent, EndOfStream: !hasBody,
			}},
			MetadataContext: ex.forwardedMetadata(),
			Attributes:      ex.requestAttributes(),
			ProtocolConfig: &extprocv3.ProtocolConfiguration{
				RequestBodyMode: ex.mode.GetRequestBodyMode(), ResponseBodyMode: ex.mode.GetResponseBodyMode(),
			},
		}
		var resp *extprocv3.ProcessingResponse
		var ok bool
		if hasBody && ex.fullDuplex(true) {
			resp, ok = ex.fullDuplexRequestHeaders(msg)
		} else {
			resp, ok = ex.call(msg, true)
		}
		if !ok {
			return
		}
		if resp != nil {
			switch rr := resp.GetResponse().(type) {
			case *extprocv3.ProcessingResponse_RequestHeaders:
				ex.setDynamicMetadata(resp)
				cr := rr.RequestHeaders.GetResponse()
				if !ex.mutate(cr.GetHeaderMutation(), &ex.req) {
					return
				}
				if cr.GetClearRouteCache() {
					ex.route = h.route(ex.req.first(":authority"), pathOnly(ex.req.first(":path")))
				}
			default:
				ex.spurious()
				return
			}
			// closeGrpcStreamIfLastRespReceived for request headers.
			if (!hasBody || (ex.mode.GetRequestBodyMode() == filterv3.ProcessingMode_NONE &&
				ex.mode.GetRequestTrailerMode() != filterv3.ProcessingMode_SEND)) && ex.encodingNeedsNothing() {
				ex.closeEarly()
			}
		}
	}

	if ex.route == nil {
		ex.routerReply(http.StatusNotFound, "", "route_not_found")
		return
	}
	eps := h.endpoints.Endpoints(ex.route.Cluster)
	addr, fallback := h.override.pick(ex.route.Cluster, eps, ex.md, &ex.req)
	if fallback {
		h.stats.fallback.Add(1)
	}
	if addr == "" {
		ex.routerReply(http.StatusServiceUnavailable, "no healthy upstream", "no_healthy_upstream")
		return
	}
	ex.setMetadataKey(h.override.metadataNS, h.servedKey, addr) // selected_host_key

	start := time.Now()
	upReq, err := http.NewRequestWithContext(upCtx, r.Method, "http://"+addr+ex.req.first(":path"), r.Body)
	if err != nil {
		ex.routerReply(http.StatusBadRequest, "bad request", "invalid_path")
		return
	}
	upReq.ContentLength = r.ContentLength
	if !hasBody {
		upReq.Body = http.NoBody
	} else if ex.requestBody != nil {
		upReq.Body, upReq.ContentLength = ex.requestBody, -1 // the chunks tether streams back
		ex.req.remove("content-length")
	}
	upReq.Host = ex.req.first(":authority")
	for _, e := range ex.req.entries {
		if !strings.HasPrefix(e.key, ":") {
			upReq.Header.Add(e.key, e.value)
		}
	}
	tr := h.transport
	if p, ok := h.endpoints.(UpstreamProtocols); ok && p.UpstreamHTTP2(ex.route.Cluster) {
		tr = h.transport2
	}
	resp, err := tr.RoundTrip(upReq)
	if err != nil {
		if ex.ctx.Err() != nil {
			return // the client went away: the filter is destroyed
		}
		if ex.reqSpurious.Load() {
			// A spurious request_body answer (full duplex): Envoy fails closed with a local
			// reply that does not go through ext_proc again (Filter::onReceiveMessage marks
			// processing complete; guard ext_proc_fail_close_spurious_resp), so the processor
			// never sees a response_headers message for it.
			ex.fail(h.statusOnError, "ext_proc_error_spurious_message")
			return
		}
		h.stats.upstreamErrors.Add(1)
		ex.routerReply(http.StatusServiceUnavailable, "upstream connect error or disconnect/reset before headers",
			"upstream_reset_before_response_started")
		return
	}
	defer func() { _ = resp.Body.Close() }()
	// Envoy's HTTP/1 codec drops chunked trailers unless the cluster's
	// http_protocol_options.enable_trailers is set (source/common/http/http1/codec_impl.cc,
	// ClientConnectionImpl: trailers are parsed only with enable_trailers): neither ext_proc
	// nor the client sees them.
	ex.dropTrailers = tr == h.transport && !h.http1Trailers(ex.route.Cluster)
	noBody := resp.Body == http.NoBody || r.Method == http.MethodHead ||
		resp.StatusCode == http.StatusNoContent || resp.StatusCode == http.StatusNotModified
	var respHdr headerMap
	respHdr.add(":status", strconv.Itoa(resp.StatusCode))
	respHdr.fromHTTP(resp.Header)
	respHdr.add("x-envoy-upstream-service-time", strconv.FormatInt(time.Since(start).Milliseconds(), 10))
	ex.respond(&respHdr, resp.Body, noBody, resp)
}

// routerReply is a local reply generated by the router (no route, no host, upstream failure).
// Unlike an ImmediateResponse it runs through the encoder filters, so ext_proc sees it.
func (ex *exchange) routerReply(status int, body, details string) {
	ex.h.stats.localReplies.Add(1)
	var hdr headerMap
	hdr.add(":status", strconv.Itoa(status))
	if body != "" {
		hdr.add("content-type", "text/plain")
		hdr.add("content-length", strconv.Itoa(len(body)))
	}
	if ex.grpc {
		body = grpcLocalReply(&hdr, httpToGRPCStatus(status), body)
	}
	ex.h.log.Debug("router local reply", "status", status, "details", details)
	ex.respond(&hdr, io.NopCloser(strings.NewReader(body)), body == "", nil)
}

// respond runs the response through ext_proc (response_headers, body, trailers) and writes it.
func (ex *exchange) respond(hdr *headerMap, body io.Reader, noBody bool, upstream *http.Response) {
	if !ex.complete && ex.stream != nil && ex.fullDuplex(false) && ex.mode.GetResponseHeaderMode() != filterv3.ProcessingMode_SKIP {
		ex.fullDuplexRespond(hdr, body, noBody, upstream)
		return
	}
	if !ex.complete && ex.stream != nil && ex.mode.GetResponseHeaderMode() != filterv3.ProcessingMode_SKIP {
		msg := &extprocv3.ProcessingRequest{
			Request: &extprocv3.ProcessingRequest_ResponseHeaders{ResponseHeaders: &extprocv3.HttpHeaders{
				Headers: hdr.proto(), EndOfStream: noBody,
			}},
			MetadataContext: ex.forwardedMetadata(),
		}
		// Bodies NONE with trailers SEND: Envoy ≥ 1.37 also closes the side stream after the
		// headers answer when the whole body (and no trailers) arrived while it was pending.
		var ra *readAhead
		if !noBody && ex.h.closeOptimization && !ex.h.emptyTrailers && ex.mode.GetResponseBodyMode() == filterv3.ProcessingMode_NONE &&
			ex.mode.GetResponseTrailerMode() == filterv3.ProcessingMode_SEND {
			ra = newReadAhead(body)
			body = ra
		}
		resp, ok := ex.call(msg, true)
		if !ok {
			return
		}
		if resp != nil {
			switch rr := resp.GetResponse().(type) {
			case *extprocv3.ProcessingResponse_ResponseHeaders:
				ex.setDynamicMetadata(resp)
				if !ex.mutate(rr.ResponseHeaders.GetResponse().GetHeaderMutation(), hdr) {
					return
				}
			default:
				ex.spurious()
				return
			}
			if noBody || (ex.mode.GetResponseBodyMode() == filterv3.ProcessingMode_NONE &&
				ex.mode.GetResponseTrailerMode() != filterv3.ProcessingMode_SEND) {
				ex.closeEarly()
			} else if ra != nil && ex.mode.GetResponseBodyMode() == filterv3.ProcessingMode_NONE && ex.wholeBodyArrived(ra, upstream) {
				ex.closeEarly() // isLastResponseAfterHeaderResp
			}
		}
	}
	status, _ := strconv.Atoi(hdr.first(":status"))
	if status < 100 {
		status = http.StatusBadGateway
	}
	for _, e := range hdr.entries {
		if !strings.HasPrefix(e.key, ":") {
			ex.w.Header().Add(e.key, e.value)
		}
	}
	ex.w.WriteHeader(status)
	ex.headersSent = true
	fl, _ := ex.w.(http.Flusher)
	if fl != nil && !noBody {
		// The connection manager encodes the headers to the codec as soon as the filter chain
		// lets them through (filter_manager.cc, FilterManager::encodeHeaders →
		// filter_manager_callbacks_.encodeHeaders), before any body: a client sees "200" at
		// once, and a failure later is "200 then reset". Go's server would hold them until the
		// first body write.
		fl.Flush()
	}
	if noBody {
		return
	}
	streamed := !ex.complete && ex.stream != nil && ex.mode.GetResponseBodyMode() == filterv3.ProcessingMode_STREAMED
	var w *watcher
	if !streamed && !ex.complete && ex.stream != nil {
		// Body mode NONE: no answer is expected while the body passes, but a side-stream failure
		// resets the downstream at once (onGrpcError → sendLocalReply after the response
		// started → reset), whether or not another body chunk ever comes, and a spurious message
		// fails closed the same way. Either interrupts the upstream read. An OK close
		// (onGrpcClose) lets the body go on.
		w = ex.stream.watch(func(r recvResult) {
			if errors.Is(r.err, io.EOF) {
				ex.h.stats.closedByServer.Add(1) // counted when it happens; applied at stop
				return
			}
			ex.upCancel()
		})
	}
	endWatch := func() {
		if w == nil {
			return
		}
		resp, out, got := w.stop()
		w = nil
		if got {
			ex.unsolicited(resp, out)
		}
	}
	defer endWatch()
	buf := make([]byte, 32<<10)
	for {
		n, err := body.Read(buf)
		if n > 0 {
			chunk := buf[:n]
			if streamed && !ex.complete {
				out, ok := ex.bodyChunk(chunk, false)
				if !ok {
					panic(http.ErrAbortHandler)
				}
				chunk = out
			}
			if _, werr := ex.w.Write(chunk); werr != nil {
				return // the client went away
			}
			if fl != nil {
				fl.Flush()
			}
		}
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			endWatch() // a side-stream failure that cut the read resets with its own count
			if ex.ctx.Err() == nil {
				ex.h.log.Debug("upstream body read failed", "error", err)
				panic(http.ErrAbortHandler) // Envoy resets the downstream stream
			}
			return
		}
	}
	endWatch()
	trailers := ex.upstreamTrailers(upstream)
	sendTrailers := ex.mode.GetResponseTrailerMode() == filterv3.ProcessingMode_SEND
	switch {
	case ex.complete || ex.stream == nil:
	case len(trailers) > 0 && sendTrailers:
		var th headerMap
		th.fromHTTP(trailers)
		if !ex.trailersCall(&th) {
			panic(http.ErrAbortHandler)
		}
		trailers = toHTTP(&th)
	case streamed:
		if _, ok := ex.bodyChunk(nil, true); !ok {
			panic(http.ErrAbortHandler)
		}
	case sendTrailers && ex.h.emptyTrailers:
		var th headerMap
		if !ex.trailersCall(&th) {
			panic(http.ErrAbortHandler)
		}
	}
	for k, vs := range trailers {
		for _, v := range vs {
			ex.w.Header().Add(http.TrailerPrefix+k, v)
		}
	}
}

// wholeBodyArrived is ProcessorState::isLastResponseAfterHeaderResp for bodies NONE: the
// whole response body had arrived while the headers answer was pending, and it had no
// trailers. With WithBodyBeforeHeadersAnswer the harness first lets the body arrive.
func (ex *exchange) wholeBodyArrived(ra *readAhead, upstream *http.Response) bool {
	complete := ra.complete()
	if ex.h.bodyFirst {
		complete = ra.waitComplete(2 * time.Second)
	}
	return complete && len(ex.upstreamTrailers(upstream)) == 0
}

// bodyChunk sends one STREAMED response_body chunk and applies the answer.
func (ex *exchange) bodyChunk(chunk []byte, eos bool) ([]byte, bool) {
	msg := &extprocv3.ProcessingRequest{
		Request: &extprocv3.ProcessingRequest_ResponseBody{ResponseBody: &extprocv3.HttpBody{
			Body: chunk, EndOfStream: eos,
		}},
		MetadataContext: ex.forwardedMetadata(),
	}
	resp, ok := ex.call(msg, false)
	if !ok {
		return nil, false
	}
	if resp == nil { // the server closed the stream with OK: pass the rest through
		return chunk, true
	}
	rb, isBody := resp.GetResponse().(*extprocv3.ProcessingResponse_ResponseBody)
	if !isBody {
		ex.spurious()
		return nil, false
	}
	ex.setDynamicMetadata(resp)
	if bm := rb.ResponseBody.GetResponse().GetBodyMutation(); bm != nil {
		switch m := bm.GetMutation().(type) {
		case *extprocv3.BodyMutation_Body:
			chunk = m.Body
		case *extprocv3.BodyMutation_ClearBody:
			if m.ClearBody {
				chunk = nil
			}
		}
	}
	if eos {
		ex.closeEarly()
	}
	return chunk, true
}

// trailersCall sends response_trailers and applies the answer's header mutation.
func (ex *exchange) trailersCall(th *headerMap) bool {
	msg := &extprocv3.ProcessingRequest{
		Request: &extprocv3.ProcessingRequest_ResponseTrailers{ResponseTrailers: &extprocv3.HttpTrailers{
			Trailers: th.proto(),
		}},
		MetadataContext: ex.forwardedMetadata(),
	}
	resp, ok := ex.call(msg, false)
	if !ok {
		return false
	}
	if resp == nil {
		return true
	}
	rt, isTrailers := resp.GetResponse().(*extprocv3.ProcessingResponse_ResponseTrailers)
	if !isTrailers {
		ex.spurious()
		return false
	}
	ex.setDynamicMetadata(resp)
	if _, err := applyMutation(rt.ResponseTrailers.GetHeaderMutation(), th, ex.h.semantics); err != nil {
		ex.h.stats.mutationErrors.Add(1)
		return false
	}
	ex.closeEarly()
	return true
}

// open starts the side stream on a host the ext_proc cluster picks; a connect failure is
// retried per the retry policy on another pick (cluster.go); on failure it answers
// status_on_error.
func (ex *exchange) open() bool {
	for {
		err := ex.openOn(ex.h.cluster.pick())
		if err == nil {
			return true
		}
		if !ex.retryAfter(err) {
			ex.h.stats.streamErrors.Add(1)
			ex.localReply(ex.h.statusOnError, "", "ext_proc_error_gRPC_error_14", nil, nil)
			return false
		}
	}
}

func (ex *exchange) openOn(hs *host) error {
	service := ""
	if ex.route != nil {
		service = ex.route.Service
	}
	st, err := openSideStream(hs.pool, service, ex.h.serviceKey, ex.h.closeMode, ex.fullDuplex(true))
	if err != nil {
		return err
	}
	ex.h.stats.opened.Add(1)
	hs.opened.Add(1)
	ex.stream = st
	return nil
}

// retryAfter reports whether a side stream that failed with err before any answer is retried
// (the retry policy's conditions and attempts left); if so it waits the back-off first.
func (ex *exchange) retryAfter(err error) bool {
	rp := ex.h.retry
	if ex.retries >= rp.retries || !rp.retriable(classify(err)) {
		return false
	}
	ex.retries++
	ex.h.stats.retries.Add(1)
	t := time.NewTimer(rp.backoff(ex.retries))
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ex.ctx.Done():
		return false
	}
}

// retryStream replays the first message on a new side stream after the current one failed
// with err before any answer, when the retry policy allows (the router retries the async
// stream while no response headers came; the filter buffered the message for it). ok false:
// no retry, the failure stands.
func (ex *exchange) retryStream(err error) bool {
	if ex.answered || ex.firstMsg == nil || ex.requestPump != nil {
		return false
	}
	for ex.retryAfter(err) {
		ex.stream.close()
		if err = ex.openOn(ex.h.cluster.pick()); err != nil {
			continue
		}
		if err = ex.stream.send(ex.firstMsg); err != nil && !errors.Is(err, io.EOF) {
			continue
		}
		return true
	}
	return false
}

// call sends msg and waits for its answer. ok false means the exchange is over (a local reply
// was sent, or the downstream is gone, or headers were sent and the stream must be reset). A
// nil response with ok true means processing continues without ext_proc (stream closed OK).
// inHeaders reports a headers message, the only state where mode_override applies.
func (ex *exchange) call(msg *extprocv3.ProcessingRequest, inHeaders bool) (*extprocv3.ProcessingResponse, bool) {
	h := ex.h
	if ex.firstMsg == nil {
		ex.firstMsg = msg
	}
	if err := ex.stream.send(msg); err != nil && !errors.Is(err, io.EOF) {
		h.stats.streamErrors.Add(1)
		ex.fail(h.statusOnError, "ext_proc_error_gRPC_error_send")
		return nil, false
	}
	return ex.answer(inHeaders, ex.messageTimeout(isRequestMessage(msg)))
}

// messageTimeout is the timer armed for an answer in one direction. Envoy arms none when
// that direction's body mode is FULL_DUPLEX_STREAMED — headers and trailers answers included
// (processor_state.cc, ProcessorState::onStartProcessorCall skips the timer in that body
// mode) — so a full-duplex route never sees a 504 from message_timeout.
func (ex *exchange) messageTimeout(request bool) time.Duration {
	if ex.fullDuplex(request) {
		return noTimeout
	}
	return ex.h.messageTimeout
}

func isRequestMessage(msg *extprocv3.ProcessingRequest) bool {
	switch msg.GetRequest().(type) {
	case *extprocv3.ProcessingRequest_RequestHeaders, *extprocv3.ProcessingRequest_RequestBody,
		*extprocv3.ProcessingRequest_RequestTrailers:
		return true
	}
	return false
}

// answer waits up to timeout for the processor's next answer and applies what every answer
// may carry (mode_override in headers answers, ImmediateResponse). ok and a nil response mean
// what they mean for call.
func (ex *exchange) answer(inHeaders bool, timeout time.Duration) (*extprocv3.ProcessingResponse, bool) {
	h := ex.h
	deadline := time.Now().Add(timeout) // the filter's timer runs across the router's retries
	for {
		resp, out, err := ex.stream.await(ex.ctx, timeout)
		if out == streamFailed && !ex.reqSpurious.Load() && ex.retryStream(err) {
			timeout = max(time.Until(deadline), time.Millisecond)
			continue
		}
		if out == gotResponse {
			ex.answered = true
		}
		switch out {
		case timedOut:
			h.stats.timeouts.Add(1)
			ex.fail(http.StatusGatewayTimeout, "ext_proc_error_per-message_timeout_exceeded")
			return nil, false
		case streamFailed:
			if ex.reqSpurious.Load() {
				// The request-body forwarder closed the stream on a spurious answer
				// (counted there): fail closed as for any spurious message.
				ex.fail(h.statusOnError, "ext_proc_error_spurious_message")
				return nil, false
			}
			h.stats.streamErrors.Add(1)
			ex.fail(h.statusOnError, "ext_proc_error_gRPC_error: "+err.Error())
			return nil, false
		case streamClosed:
			h.stats.closedByServer.Add(1)
			ex.complete = true
			ex.stream.close()
			return nil, true
		case downstreamGone:
			return nil, false
		}
		if resp.GetOverrideMessageTimeout() != nil {
			// max_message_timeout defaults to 0, so Envoy ignores the extension and keeps
			// waiting for the answer under the original timer (restarted here: a model
			// simplification).
			continue
		}
		if inHeaders && h.allowModeOverride && resp.GetModeOverride() != nil {
			ex.applyModeOverride(resp.GetModeOverride())
		}
		if imm := resp.GetImmediateResponse(); imm != nil {
			ex.setDynamicMetadata(resp)
			h.stats.immediate.Add(1)
			ex.complete = true
			ex.stream.close()
			if ex.headersSent {
				panic(http.ErrAbortHandler) // response started: Envoy resets the stream
			}
			ex.localReply(int(imm.GetStatus().GetCode()), string(imm.GetBody()), imm.GetDetails(), imm.GetHeaders(), imm.GetGrpcStatus())
			return nil, false
		}
		return resp, true
	}
}

// fail ends ext_proc processing with an error: a local reply if the response has not started,
// else a reset of the downstream stream.
func (ex *exchange) fail(status int, details string) {
	ex.complete = true
	ex.stream.close()
	if ex.headersSent {
		panic(http.ErrAbortHandler)
	}
	ex.localReply(status, "", details, nil, nil)
}

// spurious handles an answer of the wrong kind: fail closed (failure_mode_allow false,
// envoy.reloadable_features.ext_proc_fail_close_spurious_resp).
func (ex *exchange) spurious() {
	ex.h.stats.spurious.Add(1)
	ex.fail(ex.h.statusOnError, "ext_proc_error_spurious_message")
}

// unsolicited applies what arrived while no answer was expected (a watcher's event): an OK
// close ends processing (onGrpcClose); an error status or a message fails the exchange as
// Envoy would (onGrpcError; a spurious message).
func (ex *exchange) unsolicited(resp *extprocv3.ProcessingResponse, out outcome) {
	switch {
	case out == streamClosed: // counted by the watcher
		ex.complete = true
		ex.stream.close()
	case out == streamFailed:
		ex.h.stats.streamErrors.Add(1)
		ex.fail(ex.h.statusOnError, "ext_proc_error_gRPC_error")
	case resp != nil:
		ex.spurious()
	}
}

func (ex *exchange) mutate(m *extprocv3.HeaderMutation, hdr *headerMap) bool {
	ignored, err := applyMutation(m, hdr, ex.h.semantics)
	ex.h.stats.rejectedMutations.Add(uint64(ignored))
	if err != nil {
		ex.h.stats.mutationErrors.Add(1)
		ex.fail(ex.h.statusOnError, err.Error())
		return false
	}
	return true
}

// applyModeOverride follows Envoy's effectiveModeOverride: DEFAULT header and trailer modes
// leave the current value, body modes are always taken.
func (ex *exchange) applyModeOverride(o *filterv3.ProcessingMode) {
	ex.h.stats.modeOverrides.Add(1)
	m := ex.mode
	if o.GetRequestHeaderMode() != filterv3.ProcessingMode_DEFAULT {
		m.RequestHeaderMode = o.GetRequestHeaderMode()
	}
	if o.GetResponseHeaderMode() != filterv3.ProcessingMode_DEFAULT {
		m.ResponseHeaderMode = o.GetResponseHeaderMode()
	}
	if o.GetRequestTrailerMode() != filterv3.ProcessingMode_DEFAULT {
		m.RequestTrailerMode = o.GetRequestTrailerMode()
	}
	if o.GetResponseTrailerMode() != filterv3.ProcessingMode_DEFAULT {
		m.ResponseTrailerMode = o.GetResponseTrailerMode()
	}
	m.RequestBodyMode = o.GetRequestBodyMode()
	m.ResponseBodyMode = o.GetResponseBodyMode()
}

// encodingNeedsNothing is ProcessorState::noExternalProcess for the response direction.
func (ex *exchange) encodingNeedsNothing() bool {
	return ex.mode.GetResponseHeaderMode() == filterv3.ProcessingMode_SKIP &&
		ex.mode.GetResponseBodyMode() == filterv3.ProcessingMode_NONE &&
		ex.mode.GetResponseTrailerMode() != filterv3.ProcessingMode_SEND
}

// closeEarly is closeGrpcStreamIfLastRespReceived.
func (ex *exchange) closeEarly() {
	if !ex.h.closeOptimization || ex.stream == nil || ex.complete {
		return
	}
	ex.h.stats.closedEarly.Add(1)
	ex.complete = true
	ex.stream.close()
}

// destroy is the filter's onDestroy: the side stream ends when the HTTP exchange does.
func (ex *exchange) destroy() {
	if ex.stream != nil {
		ex.stream.close()
	}
	if ex.requestPump != nil {
		_ = ex.r.Body.Close() // unblocks the pump's read of a body the client never finished
		<-ex.requestPump
	}
	if ex.responsePump != nil {
		<-ex.responsePump
	}
}

// localReply is Envoy's sendLocalReply for an ImmediateResponse or an ext_proc error: it does
// not pass through ext_proc again. grpcStatus is ImmediateResponse.grpc_status (nil when
// absent); it matters only for gRPC requests (see grpcLocalReply).
func (ex *exchange) localReply(status int, body, details string, mut *extprocv3.HeaderMutation, grpcStatus *extprocv3.GrpcStatus) {
	ex.h.stats.localReplies.Add(1)
	if status < 200 {
		status = http.StatusOK // Envoy replaces codes below 200 with its default
	}
	var hdr headerMap
	hdr.add(":status", strconv.Itoa(status))
	if body != "" {
		hdr.add("content-type", "text/plain")
	}
	if mut != nil {
		if ignored, err := applyMutation(mut, &hdr, ex.h.semantics); err != nil {
			ex.h.stats.mutationErrors.Add(1) // logged by Envoy; the reply still goes out
		} else {
			ex.h.stats.rejectedMutations.Add(uint64(ignored))
		}
	}
	if ex.grpc && ex.h.semantics == GRPCSemantics {
		code, msg := a93Status(grpcStatus, details)
		hdr = headerMap{}
		body = grpcLocalReply(&hdr, code, msg)
		status = http.StatusOK
	} else if ex.grpc {
		code := httpToGRPCStatus(status)
		if grpcStatus != nil {
			code = int(grpcStatus.GetStatus())
		}
		body = grpcLocalReply(&hdr, code, body)
		status = http.StatusOK
	}
	for _, e := range hdr.entries {
		if !strings.HasPrefix(e.key, ":") {
			ex.w.Header().Add(e.key, e.value)
		}
	}
	if !ex.grpc {
		ex.w.Header().Set("Content-Length", strconv.Itoa(len(body)))
	}
	ex.h.log.Debug("local reply", "status", status, "details", details, "grpc", ex.grpc)
	ex.w.WriteHeader(status)
	ex.headersSent = true
	_, _ = io.WriteString(ex.w, body)
}

// isGRPC is Grpc::Common::isGrpcRequestHeaders: content-type application/grpc or
// application/grpc+<codec>.
func isGRPC(contentType string) bool {
	ct, _, _ := strings.Cut(contentType, ";")
	ct = strings.TrimSpace(strings.ToLower(ct))
	return ct == "application/grpc" || strings.HasPrefix(ct, "application/grpc+")
}

// grpcLocalReply turns a local reply to a gRPC request into a trailers-only gRPC response, as
// Envoy's Utility::encodeLocalReply does: :status 200, content-type application/grpc,
// grpc-status (kept if a mutation already set it, else code), the body percent-encoded into
// grpc-message, and no body. It returns the body to write ("").
func grpcLocalReply(hdr *headerMap, code int, body string) string {
	hdr.set(":status", "200")
	hdr.set("content-type", "application/grpc")
	if hdr.first("grpc-status") == "" {
		hdr.set("grpc-status", strconv.Itoa(code))
	}
	if body != "" {
		hdr.set("grpc-message", percentEncode(body))
	}
	hdr.remove("content-length")
	return ""
}

// httpToGRPCStatus is Envoy's Grpc::Utility::httpToGrpcStatus, used when a local reply to a
// gRPC request names no grpc_status.
func httpToGRPCStatus(status int) int {
	switch status {
	case 400:
		return 13 // INTERNAL
	case 401:
		return 16 // UNAUTHENTICATED
	case 403:
		return 7 // PERMISSION_DENIED
	case 404:
		return 12 // UNIMPLEMENTED
	case 429, 502, 503, 504:
		return 14 // UNAVAILABLE
	default:
		return 2 // UNKNOWN
	}
}

// percentEncode is Envoy's PercentEncoding::encode for grpc-message: bytes outside printable
// ASCII and '%' become %XX.
func percentEncode(s string) string {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c < ' ' || c > '~' || c == '%' {
			fmt.Fprintf(&b, "%%%02X", c)
			continue
		}
		b.WriteByte(c)
	}
	return b.String()
}

// setDynamicMetadata is Filter::setDynamicMetadata: namespaces not allow-listed in
// receiving_namespaces are dropped; allowed ones are merged into the stream's metadata.
func (ex *exchange) setDynamicMetadata(resp *extprocv3.ProcessingResponse) {
	dm := resp.GetDynamicMetadata()
	if dm == nil {
		return
	}
	for ns, v := range dm.GetFields() {
		allowed := false
		for _, r := range ex.h.receiving {
			if r == ns {
				allowed = true
				break
			}
		}
		if !allowed {
			ex.h.stats.droppedMetadata.Add(1)
			continue
		}
		st := ex.md[ns]
		if st == nil {
			st = &structpb.Struct{Fields: map[string]*structpb.Value{}}
			ex.md[ns] = st
		}
		for k, fv := range v.GetStructValue().GetFields() {
			st.Fields[k] = fv
		}
	}
}

func (ex *exchange) setMetadataKey(ns, key, value string) {
	st := ex.md[ns]
	if st == nil {
		st = &structpb.Struct{Fields: map[string]*structpb.Value{}}
		ex.md[ns] = st
	}
	st.Fields[key] = structpb.NewStringValue(value)
}

// forwardedMetadata is Filter::addDynamicMetadata: the forwarding namespaces present now.
func (ex *exchange) forwardedMetadata() *corev3.Metadata {
	out := &corev3.Metadata{}
	for _, ns := range ex.h.forwarding {
		if st, ok := ex.md[ns]; ok {
			if out.FilterMetadata == nil {
				out.FilterMetadata = map[string]*structpb.Struct{}
			}
			out.FilterMetadata[ns] = proto.Clone(st).(*structpb.Struct)
		}
	}
	return out
}

// requestAttributes are the request_attributes source.address, source.port and request.id,
// sent once with the first request-direction message.
func (ex *exchange) requestAttributes() map[string]*structpb.Struct {
	if ex.sentRequestAttrs {
		return nil
	}
	ex.sentRequestAttrs = true
	if ex.h.semantics == GRPCSemantics {
		return a93Attributes(&ex.req)
	}
	fields := map[string]*structpb.Value{
		"request.id": structpb.NewStringValue(ex.req.first("x-request-id")),
	}
	if _, port, err := net.SplitHostPort(ex.r.RemoteAddr); err == nil {
		fields["source.address"] = structpb.NewStringValue(ex.r.RemoteAddr)
		if p, err := strconv.Atoi(port); err == nil {
			fields["source.port"] = structpb.NewNumberValue(float64(p))
		}
	}
	return map[string]*structpb.Struct{"envoy.filters.http.ext_proc": {Fields: fields}}
}

func toHTTP(h *headerMap) http.Header {
	out := http.Header{}
	for _, e := range h.entries {
		out.Add(e.key, e.value)
	}
	return out
}

func pathOnly(p string) string {
	if i := strings.IndexAny(p, "?#"); i >= 0 {
		return p[:i]
	}
	return p
}

func newRequestID() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	return fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:16])
}
