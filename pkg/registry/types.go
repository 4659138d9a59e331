package registry

import (
	"net"
	"strconv"
	"time"
)

// AffinityMode says how a service binds requests to instances.
type AffinityMode string

// Affinity modes. The zero value is not valid; config defaults it to AffinityNone.
const (
	AffinityNone          AffinityMode = "none"
	AffinityCookie        AffinityMode = "cookie"
	AffinityHeader        AffinityMode = "header"
	AffinityMCPStreamable AffinityMode = "mcp-streamable"
	AffinityMCPSSE        AffinityMode = "mcp-sse"
	AffinityHash          AffinityMode = "hash"
)

// Balancing names the algorithm that picks an instance when no session decides it.
type Balancing string

// Balancing algorithms.
const (
	BalanceRoundRobin       Balancing = "round-robin"
	BalanceStickyRoundRobin Balancing = "sticky-round-robin"
	BalanceLeastRequest     Balancing = "least-request"
	BalanceConsistentHash   Balancing = "consistent-hash"
)

// State is an instance's administrative state.
type State string

// Instance states. Active instances take new sessions; standby instances take new sessions only
// when every active instance is full (scale-out); draining instances keep their sessions but take
// no new ones.
const (
	StateActive   State = "active"
	StateStandby  State = "standby"
	StateDraining State = "draining"
)

// Health is an instance's health as seen by active health checks.
type Health string

// Health values. HealthUnknown (no check configured, or no verdict yet) counts as routable.
const (
	HealthUnknown   Health = "unknown"
	HealthHealthy   Health = "healthy"
	HealthUnhealthy Health = "unhealthy"
)

// Match selects the HTTP requests that belong to a service.
type Match struct {
	// Authorities are host names (without port) the service answers; empty means any.
	Authorities []string
	// PathPrefix is the path prefix the service answers; "/" (the default) means any.
	PathPrefix string
}

// Cookie holds the cookie attributes tether sets for cookie and sticky-round-robin affinity.
type Cookie struct {
	Name     string
	Path     string
	Secure   bool
	HTTPOnly bool
	// SameSite is "", "Lax", "Strict" or "None".
	SameSite string
	// SessionLifetime issues a session cookie (no Max-Age: the browser drops it when it
	// closes; Gateway API lifetimeType Session). The session itself still ends at SessionTTL.
	// false issues a permanent cookie with Max-Age = SessionTTL (lifetimeType Permanent).
	SessionLifetime bool
}

// Sticky configures sticky round robin: when the sticky cookie is added to a response.
type Sticky struct {
	// UpstreamCookie, when set, makes tether add its sticky cookie only when the upstream's
	// response sets a cookie of this name (e.g. JSESSIONID). Empty means always.
	UpstreamCookie string
}

// SSE configures MCP HTTP+SSE affinity.
type SSE struct {
	// Path is the SSE endpoint path (default "/sse").
	Path string
	// SessionParam is the query parameter carrying the session id in the endpoint event's URI
	// (default "sessionId"; "session_id" and "sessionid" are also common).
	SessionParam string
}

// MCPHandle configures handle affinity for sessionless MCP (protocol 2026-07-28 and later) on
// an mcp-streamable service: a server that keeps cross-call state mints a handle, clients pass
// it as a tool argument the tool marks with x-mcp-header, and mirror it in the request header
// "Mcp-Param-{Header}". An empty Header turns handle affinity off (sessionless requests are
// balanced freely).
type MCPHandle struct {
	// Header is the x-mcp-header name of the handle parameter: requests carry the handle in
	// "Mcp-Param-" + Header.
	Header string
	// LearnHeader is the response header in which the server announces a handle it minted
	// ("" for none): the handle is bound to the instance that served the response.
	LearnHeader string
	// InstancePrefix: the server embeds its instance id in the handle, "<id><PrefixSeparator>…",
	// and a handle not bound yet is bound to the instance it names.
	InstancePrefix  bool
	PrefixSeparator string
	// MintTools are the tools (Mcp-Name of a tools/call) whose calls mint a handle: they are
	// placed like new sessions, holding a session slot until the response (which must bind a
	// handle, or the slot is freed). Empty: every tools/call without a handle.
	MintTools []string
}

// HealthCheck configures active HTTP health checks for a service's instances.
// A zero Interval disables checks.
type HealthCheck struct {
	Path               string
	Interval           time.Duration
	Timeout            time.Duration
	HealthyThreshold   int
	UnhealthyThreshold int
}

// Enabled reports whether active health checks are configured.
func (h HealthCheck) Enabled() bool { return h.Interval > 0 }

// Service is one application: its routing match, affinity mode, limits and balancing.
// Services are values: the registry hands out copies and never mutates a published one.
type Service struct {
	Name      string
	Match     Match
	Affinity  AffinityMode
	Balancing Balancing
	// SessionsPerInstance is the session-slot quota per instance, 1..200.
	SessionsPerInstance int
	// RequestSlotsPerInstance is the in-flight request quota per instance (default 200).
	RequestSlotsPerInstance int
	// StreamsPerInstance is the quota of long-lived MCP streams per instance (SSE GET streams,
	// subscriptions/listen POSTs), counted apart from request slots so idle listeners cannot
	// take them; 0 counts streams as requests.
	StreamsPerInstance int
	// SessionTTL is a session's total life from creation, 1s..6h.
	SessionTTL time.Duration
	// IdleTimeout ends a session after this long without a request; 0 disables, ≤ SessionTTL.
	IdleTimeout time.Duration
	// MaxLifetime bounds one long-lived stream (e.g. an MCP SSE GET); 0 means unbounded.
	MaxLifetime time.Duration
	// DisableSessionIDReuse refuses a request carrying an expired session id instead of
	// starting a new session under it.
	DisableSessionIDReuse bool
	Cookie                Cookie
	Sticky                Sticky
	// HeaderField is the header carrying the session id for header affinity.
	HeaderField string
	SSE         SSE
	// MCPHandle configures handle affinity for sessionless MCP (mcp-streamable only).
	MCPHandle MCPHandle
	// DCRFile is the path of a data-centric-rules.xml file; empty means none.
	DCRFile string
	// HashBalanceFactor bounds consistent-hash load: no instance above factor × average
	// in-flight. 0 disables bounded load; otherwise ≥ 1.
	HashBalanceFactor float64
	// UpstreamHTTP2 makes Envoy speak HTTP/2 to the instances.
	UpstreamHTTP2 bool
	// FullDuplexBodies streams the service's request and response bodies through tether
	// (ext_proc FULL_DUPLEX_STREAMED, wire.FullDuplexProcessingMode) instead of headers only.
	FullDuplexBodies bool
	ConnectTimeout   time.Duration
	HealthCheck      HealthCheck
}

// Instance is one endpoint of a service.
type Instance struct {
	Service  string
	ID       string
	Address  string
	HTTPPort int
	SIPPort  int
	Weight   uint32
	Zone     string
	State    State
	Health   Health
}

// HTTPAddr returns the instance's HTTP endpoint as host:port, the form Envoy's override_host
// policy expects.
func (i Instance) HTTPAddr() string {
	return net.JoinHostPort(i.Address, strconv.Itoa(i.HTTPPort))
}

// SIPAddr returns the instance's SIP endpoint as host:port, or "" when it has no SIP port.
func (i Instance) SIPAddr() string {
	if i.SIPPort == 0 {
		return ""
	}
	return net.JoinHostPort(i.Address, strconv.Itoa(i.SIPPort))
}

// Healthy reports whether the instance may receive traffic health-wise (unknown counts as healthy).
func (i Instance) Healthy() bool { return i.Health != HealthUnhealthy }

// Routable reports whether requests of existing sessions may go to the instance: it is
// healthy. Draining and standby instances stay routable for the sessions they hold: a standby
// instance holds the sessions scale-out placed on it (every active instance being full), and
// those keep it until they end or it turns unhealthy or is removed. Neither takes a new session
// by Placeable.
func (i Instance) Routable() bool { return i.Healthy() }

// Placeable reports whether new sessions may be placed on the instance without scale-out.
func (i Instance) Placeable() bool { return i.Healthy() && i.State == StateActive }

// Key identifies an instance across services.
type Key struct {
	Service string
	ID      string
}

// Key returns the instance's key.
func (i Instance) Key() Key { return Key{Service: i.Service, ID: i.ID} }
