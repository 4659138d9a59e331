// Package session holds tether's session table as the engine sees it: the Session type, the
// Store contract (with its errors, filter, end events and optional capabilities) and the rules
// every backend applies. The backends are their own packages: pkg/session/memstore (go-memdb,
// one process) and pkg/session/redisstore (Redis or Valkey, shared by replicas).
package session

import (
	"errors"
	"time"
)

// Kind is how a session's id is carried.
type Kind string

// Session kinds.
const (
	KindCookie        Kind = "cookie"
	KindHeader        Kind = "header"
	KindMCPStreamable Kind = "mcp-streamable"
	KindMCPSSE        Kind = "mcp-sse"
	KindMCPHandle     Kind = "mcp-handle" // a sessionless MCP server's handle (registry.MCPHandle)
	KindSticky        Kind = "sticky"     // sticky round robin's cookie
)

// Status is a session's lifecycle status.
type Status string

// Session statuses. Expired sessions lapsed by TTL or idle timeout; Terminated ones were ended
// explicitly (SessionAPI delete, MCP DELETE, SSE stream end, instance loss).
const (
	StatusActive     Status = "Active"
	StatusExpired    Status = "Expired"
	StatusTerminated Status = "Terminated"
)

// Sentinel errors, checked with errors.Is.
var (
	ErrNotFound = errors.New("session not found")
	ErrExists   = errors.New("session already exists")
	ErrExpired  = errors.New("session expired")
	ErrEnded    = errors.New("session ended")
	// ErrReuseDisabled: Create found an ended (or lapsed) record under the id whose
	// DisableReuse is set; the id cannot start a new session.
	ErrReuseDisabled = errors.New("session id reuse disabled")
	// ErrInvalid reports a malformed session or a forbidden change (empty or over-long id,
	// service or instance, a NUL byte in one of them, TTL <= 0, an Update touching an
	// immutable field, an End status other than Expired or Terminated).
	ErrInvalid = errors.New("invalid session")
	// ErrInvalidPageToken reports a List page token this store did not produce.
	ErrInvalidPageToken = errors.New("invalid page token")
)

// Session binds an id to an instance of a service. Sessions are values; the store never hands
// out a pointer into its table.
type Session struct {
	ID       string
	Service  string
	Instance string
	Kind     Kind
	Created  time.Time
	// LastModified changes on create and on every administrative update.
	LastModified time.Time
	// LastSeen is the time of the last request; it drives the idle timeout.
	LastSeen time.Time
	// TTL is the total life from Created.
	TTL time.Duration
	// IdleTimeout ends the session after this long without a request; 0 disables it.
	IdleTimeout  time.Duration
	Status       Status
	DisableReuse bool
	// Ended is when the session stopped being Active (zero while Active).
	Ended      time.Time
	Attributes map[string]string
}

// ExpiresAt returns when the session lapses: the first of Created+TTL and LastSeen+IdleTimeout.
func (s Session) ExpiresAt() time.Time {
	exp := s.Created.Add(s.TTL)
	if s.IdleTimeout > 0 {
		if idle := s.LastSeen.Add(s.IdleTimeout); idle.Before(exp) {
			exp = idle
		}
	}
	return exp
}

// ActiveAt reports whether the session is Active and not lapsed at now.
func (s Session) ActiveAt(now time.Time) bool {
	return s.Status == StatusActive && now.Before(s.ExpiresAt())
}
