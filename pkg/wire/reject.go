package wire

import (
	"fmt"
	"time"

	"google.golang.org/grpc/codes"
)

// Class is the kind of a rejection: why tether refuses to route a request or to serve an API
// call. Every protocol boundary answers a class the same way, by Rejection.
type Class int

// Rejection classes. The zero value is no class (Lookup answers the internal-error row).
const (
	// ClassBadRequest: a malformed session id or request, or a protocol the service's
	// affinity mode does not serve.
	ClassBadRequest Class = iota + 1
	// ClassNotFound: the session is unknown, e.g. an MCP session that ended or whose instance
	// is gone (the MCP signal to re-initialise), or a SessionAPI id that does not exist.
	ClassNotFound
	// ClassConflict: the id cannot be used in this state, e.g. an ended id under
	// disableSessionIdReuse, or a SessionAPI create of an id that exists.
	ClassConflict
	// ClassTooManyRequests: the session's instance (or every instance) has no free request
	// slot, or the client opened new sessions too fast. Retryable.
	ClassTooManyRequests
	// ClassNoCapacity: no instance can take a new session (or no healthy instance is left).
	// Retryable.
	ClassNoCapacity
	// ClassNoService: no service matches the request, or the named service does not exist.
	ClassNoService
	classEnd
)

// Rejection is how every boundary answers one class.
type Rejection struct {
	// HTTPStatus is the status of ext_proc's immediate response, of the SIP decision endpoint
	// and of the SessionAPI's HTTP/JSON binding.
	HTTPStatus int
	// GRPCCode is the SessionAPI's gRPC status code. The SessionAPI's HTTP binding derives its
	// status from this code by the google.rpc.Code mapping, which gives HTTPStatus again.
	GRPCCode codes.Code
	// Code is the stable error code used when the engine gave none.
	Code string
	// Retryable rejections carry a retry hint: Retry-After in whole seconds on HTTP (see
	// RetryAfterSeconds), a google.rpc.RetryInfo detail on gRPC.
	Retryable bool
}

// rejections is THE table. Decisions taken deliberately:
//
//   - No capacity is 503 Service Unavailable / gRPC UNAVAILABLE with Retry-After everywhere,
//     the SessionAPI included: the condition is the same whoever asks (no instance can take a
//     session right now; scale-out may be under way), it is not the caller's own quota, and
//     503 + Retry-After / UNAVAILABLE is what HTTP clients, gateways and gRPC retry policies
//     treat as "try again later". (The SessionAPI answered 429 before.)
//   - Too many requests (an instance's request slots are full, or a client address opened new
//     sessions too fast) is 429 / RESOURCE_EXHAUSTED with Retry-After: a per-session or
//     per-client limit.
//   - Conflict is 409 / ALREADY_EXISTS: the id exists (possibly ended, with reuse disabled)
//     and cannot name a new session. (The SessionAPI answered 400 FAILED_PRECONDITION before.)
//   - Unknown session and unknown service are both 404 / NOT_FOUND; MCP clients read 404 as
//     "re-initialise".
//   - A protocol the service's mode does not serve (SIP on a cookie service) is a bad request,
//     400 / INVALID_ARGUMENT, code ProtocolNotSupported: a configuration error of the caller,
//     never a session.
var rejections = [classEnd]Rejection{
	ClassBadRequest:      {HTTPStatus: 400, GRPCCode: codes.InvalidArgument, Code: "InvalidArgument"},
	ClassNotFound:        {HTTPStatus: 404, GRPCCode: codes.NotFound, Code: "SessionNotFound"},
	ClassConflict:        {HTTPStatus: 409, GRPCCode: codes.AlreadyExists, Code: "Conflict"},
	ClassTooManyRequests: {HTTPStatus: 429, GRPCCode: codes.ResourceExhausted, Code: "ResourceExhausted", Retryable: true},
	ClassNoCapacity:      {HTTPStatus: 503, GRPCCode: codes.Unavailable, Code: "NoCapacity", Retryable: true},
	ClassNoService:       {HTTPStatus: 404, GRPCCode: codes.NotFound, Code: "ServiceNotFound"},
}

// internal is the answer to an unknown class or an internal failure.
var internal = Rejection{HTTPStatus: 500, GRPCCode: codes.Internal, Code: InternalCode}

// Lookup returns how boundaries answer c; an unknown class gets the internal-error row (500,
// INTERNAL).
func Lookup(c Class) Rejection {
	if c <= 0 || c >= classEnd {
		return internal
	}
	return rejections[c]
}

// Classes returns every rejection class in order (for tests and docs).
func Classes() []Class {
	out := make([]Class, 0, classEnd-1)
	for c := ClassBadRequest; c < classEnd; c++ {
		out = append(out, c)
	}
	return out
}

func (c Class) String() string {
	switch c {
	case ClassBadRequest:
		return "BadRequest"
	case ClassNotFound:
		return "NotFound"
	case ClassConflict:
		return "Conflict"
	case ClassTooManyRequests:
		return "TooManyRequests"
	case ClassNoCapacity:
		return "NoCapacity"
	case ClassNoService:
		return "NoService"
	}
	return fmt.Sprintf("Class(%d)", int(c))
}

// RetryAfterSeconds rounds a retry hint to the whole seconds of a Retry-After header: up, and
// at least 1 (a retryable rejection always tells the client to wait a little).
func RetryAfterSeconds(d time.Duration) int64 {
	s := int64((d + time.Second - 1) / time.Second)
	return max(s, 1)
}

// ErrorBody is the JSON body of every error answer over HTTP — ext_proc's immediate
// responses, the SIP decision endpoint and the SessionAPI's HTTP binding alike. ErrorCode is
// the stable code: for a rejection the engine's (NoCapacity, SessionNotFound, …, else the
// class's Code in the table), so a client reads the same code in the same field on every
// surface; on gRPC the same code is the Reason of a google.rpc.ErrorInfo detail in ErrorDomain.
type ErrorBody struct {
	ErrorCode    string `json:"errorCode"`
	ErrorMessage string `json:"errorMessage"`
	// Status is the gRPC code's name, on the SessionAPI only (its HTTP binding mirrors the gRPC
	// one, whose status the HTTP status follows).
	Status string `json:"status,omitempty"`
}

// ErrorDomain is the google.rpc.ErrorInfo domain of tether's error codes on gRPC.
const ErrorDomain = "tether.dev"

// InternalCode is the one code of an internal failure on every surface (the internal row's).
const InternalCode = "InternalServerError"
