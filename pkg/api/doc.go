// Package api serves tether's operator and application API on one listener: the read-only admin
// endpoints, the SessionAPI and the instance admin API, each both as gRPC (the tether.v1 protos
// in proto/tether/v1, generated into pkg/api/gen/tether/v1) and as HTTP/JSON, guarded by
// bearer-token auth. gRPC status codes and HTTP status codes appear only in this package.
//
// One handler (Server.Handler) serves everything: HTTP/2 requests with content type
// application/grpc go to the gRPC server, the rest to the HTTP routes. Configure the
// http.Server with EnableH2C so grpc-go clients with insecure credentials can connect.
//
// HTTP routes (bodies and answers are protojson of the tether.v1 messages: lowerCamelCase
// fields, enums by name, durations like "3600s", RFC 3339 timestamps):
//
//	GET    /healthz                                  200 "ok" (no auth)
//	GET    /readyz                                   200, or 503 naming the failed check (no auth)
//	GET    /v1/services                              services the caller may read, with their settings
//	GET    /v1/services/{service}                    one service's settings
//	POST   /v1/services/{service}/sessions           CreateSession (body CreateSessionRequest) → 201 Session
//	GET    /v1/services/{service}/sessions           ListSessions: ?limit=&pageToken=&status=&instance=&id=
//	GET    /v1/services/{service}/sessions/{id}      GetSession → Session
//	PUT    /v1/services/{service}/sessions/{id}      UpdateSession (body UpdateSessionRequest; PATCH too) → Session
//	DELETE /v1/services/{service}/sessions/{id}      DeleteSession → {}
//	GET    /v1/services/{service}/instances          ListInstances (with slot usage)
//	POST   /v1/services/{service}/instances          RegisterInstance (body Instance) → 201 Instance
//	GET    /v1/services/{service}/instances/{id}     one Instance
//	DELETE /v1/services/{service}/instances/{id}     DeregisterInstance → {}
//	PUT    /v1/services/{service}/instances/{id}/state  SetInstanceState (body {"state": ...}) → Instance
//	PUT    /v1/services/{service}/instances/{id}/health SetInstanceHealth (body {"health": "unhealthy"}) → Instance
//	POST   /v1/services/{service}/instances/{id}/drain  DrainInstance (body {"timeout": "30s"})
//
// With store.backend redis the instance admin calls change the registry layer every replica
// shares (pkg/fleet): a registration, deregistration, state or health verdict made through one replica is
// served by all; a config-file instance cannot be deregistered then (400), and with Redis
// unreachable the calls answer 503 and change nothing.
//
// Errors have one model on HTTP, wire.ErrorBody {"errorCode": "...", "errorMessage": "...",
// "status": "<gRPC code name>"}. errorCode is tether's stable code, the same on every surface
// (ext_proc, the SIP decision endpoint, this API): an engine rejection's own (NoCapacity,
// SessionIdReuseDisabled, …), a rejection class's (SessionNotFound, ServiceNotFound, Conflict,
// InvalidArgument), InternalServerError, else the gRPC code's name. On gRPC the same code is
// the Reason of a google.rpc.ErrorInfo detail in domain wire.ErrorDomain, on every error. The
// HTTP status follows the google.rpc.Code mapping of status:
//
//	InvalidArgument 400, FailedPrecondition 400, Unauthenticated 401 (with WWW-Authenticate),
//	PermissionDenied 403, NotFound 404, AlreadyExists 409, ResourceExhausted 429 (with
//	Retry-After), Internal 500, Unavailable 503 (with Retry-After when no instance can take a
//	new session), DeadlineExceeded 504.
//
// Engine rejections take their code from pkg/wire's one table, so a class is answered alike
// here, by ext_proc and by the SIP decision endpoint: no capacity is 503 / UNAVAILABLE, a
// conflict 409 / ALREADY_EXISTS. Retryable rejections carry Retry-After on HTTP and a
// google.rpc.RetryInfo detail on gRPC, both in whole seconds rounded up.
//
// Auth: with tokens configured, every call but /healthz and /readyz needs "Authorization:
// Bearer <token>" (gRPC: "authorization" metadata). A token reaches the services it names (or
// all with "*") for read (Get, List, admin views) or write (everything). Authorization is
// checked before the service is looked up, so a scoped token learns nothing about other
// services. With no tokens every caller may do everything; CheckListenerSecurity refuses that
// on a non-loopback listener unless auth.allowInsecure is set.
//
// Browsers: the HTTP/JSON routes refuse what only a web page would send (browser.go): a
// state-changing call without a token unless it carries wire.ClientHeader (and, with a body,
// Content-Type application/json), an Origin other than the listener's own or WithOrigins', and,
// unless the request authenticates, a Host that does not name the listener (DNS rebinding).
package api
