package affinity

import (
	"context"
	"fmt"
	"time"

	"github.com/tether-dev/tether/pkg/dcr"
	"github.com/tether-dev/tether/pkg/registry"
	"github.com/tether-dev/tether/pkg/wire"
)

// Protocol is the protocol carrying a request.
type Protocol string

// Protocols.
const (
	ProtocolHTTP Protocol = "http"
	ProtocolSIP  Protocol = "sip"
)

// Request is a protocol-neutral view of one request the engine decides on. It holds no Envoy
// or gRPC types. The engine never modifies a Request.
type Request struct {
	// Service is the service name when the caller already knows it (route metadata, SIP
	// decision endpoint); empty means the engine resolves it from Authority and Path.
	Service  string
	Protocol Protocol
	Method   string
	// Authority is the HTTP :authority (host[:port]); unused for SIP.
	Authority string
	// Path is the HTTP :path including the query string, or the SIP Request-URI.
	Path string
	// Headers maps lower-case header names to their values in order. When nil, HeaderSource
	// (if set) holds the headers instead.
	Headers map[string][]string
	// HeaderSource, used when Headers is nil, looks headers up in the caller's own form (the
	// ext_proc server passes Envoy's header list, so no map is built per request).
	HeaderSource HeaderSource
	// Peer is the client's address as "ip:port" (Envoy's source.address), if known.
	Peer string
	// Subset, when non-empty, restricts the request to the instances whose HTTP endpoint
	// (ip:port, Instance.HTTPAddr) it lists — the Gateway API Inference Extension's subset hint
	// (envoy.lb.subset_hint). New sessions and sessionless requests are placed among them; an
	// existing session whose instance is not listed is rebound to one that is; when no listed
	// instance can serve, Decide rejects with ClassNoCapacity (503).
	Subset []string
	// SIPMessage is the raw SIP message for SIP requests (e.g. Kamailio's $mb); may be nil
	// when only Headers and Path are given.
	SIPMessage []byte
	// SIP, when non-nil, is SIPMessage already parsed (dcr.ParseSIPRequest): the engine
	// extracts the key from it instead of parsing SIPMessage again. The caller must not use it
	// for a different message.
	SIP *dcr.SIPMessage
	// GRPCRing marks a call from a proxyless gRPC client configured by tether's xDS (its own
	// ext_proc filter, gRFC A93): the client's ring_hash balancer, not tether, picks the
	// instance, so the engine decides the call on the instance the mirror of that ring picks
	// for the call's session header (package doc, "Proxyless gRPC clients").
	GRPCRing bool
	// HashKey, for a SIP request to a hash service, is a key decided earlier — a dialog's key
	// carried back by its in-dialog failover token — used instead of extracting one from the
	// message. Other modes ignore it.
	HashKey string
}

// Header returns the first value of the lower-case header name, or "".
func (r *Request) Header(name string) string {
	v, _ := headerValue(r.Headers, r.HeaderSource, name, 0)
	return v
}

// HeaderMap returns the request's headers as lower-case name → values: Headers, or a map
// built from HeaderSource (for rules that may read any header).
func (r *Request) HeaderMap() map[string][]string {
	if r.Headers == nil && r.HeaderSource != nil {
		return r.HeaderSource.HeaderMap()
	}
	return r.Headers
}

// HeaderSource is a set of headers looked up by lower-case name without building a map.
// Pseudo headers (":path", ":status", …) are not part of it. Implementations must be safe for
// concurrent reads.
type HeaderSource interface {
	// HeaderValue returns the i-th value (from 0, in order) of the lower-case header name.
	HeaderValue(name string, i int) (string, bool)
	// HeaderMap returns every header as lower-case name → values in order.
	HeaderMap() map[string][]string
}

// headerValue is the i-th value of name in m, or in src when m is nil.
func headerValue(m map[string][]string, src HeaderSource, name string, i int) (string, bool) {
	if m == nil && src != nil {
		return src.HeaderValue(name, i)
	}
	if v := m[name]; i < len(v) {
		return v[i], true
	}
	return "", false
}

// HeaderValue is one header to add to the response the client receives.
type HeaderValue struct {
	Name  string
	Value string
	// Append adds the value beside existing ones (e.g. Set-Cookie); false overwrites.
	Append bool
}

// Response is a protocol-neutral view of the upstream's response headers.
type Response struct {
	Status int
	// Headers maps lower-case header names to their values in order. When nil, HeaderSource
	// (if set) holds the headers instead.
	Headers map[string][]string
	// HeaderSource, used when Headers is nil, looks headers up in the caller's own form.
	HeaderSource HeaderSource
	// ServedHost is the host:port the data plane reports it actually used (Envoy's
	// selected_host_key metadata); empty when unknown.
	ServedHost string
}

// Header returns the first value of the lower-case header name, or "".
func (r *Response) Header(name string) string {
	v, _ := headerValue(r.Headers, r.HeaderSource, name, 0)
	return v
}

// Class is the kind of rejection; wire.Lookup maps it to its HTTP status, gRPC code and
// retry hint at every protocol boundary.
type Class = wire.Class

// Rejection classes (see wire.Class).
const (
	ClassBadRequest      = wire.ClassBadRequest
	ClassNotFound        = wire.ClassNotFound
	ClassConflict        = wire.ClassConflict
	ClassTooManyRequests = wire.ClassTooManyRequests
	ClassNoCapacity      = wire.ClassNoCapacity
	ClassNoService       = wire.ClassNoService
)

// Reject is the error Decide returns when a request must not be forwarded. Callers get it with
// errors.As; any other error is an internal failure.
type Reject struct {
	Class Class
	// Code is a stable machine-readable code, e.g. "ResourceExhausted", "SessionNotFound".
	Code string
	// Message explains the rejection to a human.
	Message string
	// RetryAfter is a hint for ClassTooManyRequests and ClassNoCapacity (0 means none).
	RetryAfter time.Duration
}

func (r *Reject) Error() string { return fmt.Sprintf("%s: %s", r.Code, r.Message) }

// Decision is the engine's answer for an admitted request: where it goes and what the exchange
// may still learn. A Decision holds one request slot on Instance until End is called.
//
// A Decision is used by the one goroutine that handles the exchange; End is safe to call from
// any goroutine and any number of times (only the first call releases).
type Decision interface {
	// Instance is the chosen instance.
	Instance() registry.Instance
	// SessionID is the session the request belongs to ("" when none, e.g. a new MCP session
	// before the server assigned its id, or a service without affinity).
	SessionID() string
	// NewSession reports whether this request created the session.
	NewSession() bool
	// OnResponse is called with the upstream's response headers. It returns headers to add to
	// the client's response (Set-Cookie, a generated header-field id) and learns what the
	// response teaches (an Mcp-Session-Id binding).
	OnResponse(resp Response) []HeaderValue
	// WantsResponseBody reports whether the response body must be shown to LearnSession (the
	// MCP SSE GET that will announce its session id in its first endpoint event).
	WantsResponseBody() bool
	// LearnSession binds a session id discovered in a response body (MCP SSE endpoint event)
	// to the instance that served it.
	LearnSession(id string) error
	// End marks the end of the exchange and releases the request slot exactly once.
	End()
	// HandOff is End for an exchange that goes on without tether: its ext_proc side stream
	// is handed off to the data plane (a drain). The request slot stays taken until the
	// exchange must have ended — its service's maxLifetime from its start, which the data
	// plane enforces as the route's max_stream_duration: with shared slots as a detached
	// hold every replica counts (pkg/quota), after this process is gone; with this process's
	// own counters it is released (they end with the process; another process counting the
	// instance does not learn of it). A session the exchange learned (MCP SSE) is not ended:
	// the stream goes on. It fails and changes nothing when the slot cannot be kept that long
	// (shared slots and a service without maxLifetime, a lapsed lease, Redis unreachable, the
	// decision already ended): the exchange must then stay with tether, and End ends it.
	HandOff(ctx context.Context) error
	// OnExpire names who ends the exchange when it outlives its limit (the engine's request
	// lifetime; for a stream, an SSE response, the service's maxLifetime): the sweeper calls
	// x.Expire once, and the slot stays held until End. Without an Expirer an exchange past
	// its limit is only counted and logged.
	OnExpire(x Expirer)
}

// Expirer ends an exchange that outlived its limit (pkg/extproc resets it). Expire is called
// at most once, on the engine's sweeper goroutine; it must not block and must not call the
// Engine.
type Expirer interface {
	Expire()
}
