// Package affinity is tether's decision engine: for each protocol-neutral Request it finds the
// service, extracts the session key (cookie, header field, MCP session id, DCR key), looks the
// session up or places a new one under the per-instance session and request quotas, and returns
// a Decision or a *Reject. It imports no Envoy or gRPC types.
//
// This comment is the engine's contract; the tests in this package check each rule.
//
// # Wiring
//
// New(reg, store) builds an Engine over a registry and a session store and sets itself as the
// store's end handler (session.Store.SetEndHandler): every session that leaves Active through
// this handle frees its slot, and an MCP session terminated through another replica ends this
// replica's open exchanges of it. Run follows registry
// generations (it rebuilds the engine's view when the registry announces one), reloads DCR
// files and runs the sweeper. Decide never rebuilds: it routes by the view Run published last,
// so a registry change reaches requests as soon as Run has applied it (microseconds). Callers
// that must route by a change at once call Sync (without Run, Sync applies it itself); the
// SessionAPI and operator calls Sync before they answer. Package affinitytest wires all of
// this for tests.
//
// # Service resolution
//
// Request.Service names the service when the caller knows it (route metadata, the SIP decision
// endpoint); SIP requests must name it. Otherwise the service is matched by Authority (port
// stripped, case-insensitive; a service without authorities matches any) and the longest
// PathPrefix (a plain string prefix of the path without its query). As with Envoy virtual
// hosts, services naming the authority win over services matching any authority; among those,
// the longest prefix wins, then the lower name. No match → ClassNoService.
//
// # Slots
//
// Every instance has balance.Slots with the service's caps (sessionsPerInstance,
// requestSlotsPerInstance; cap changes apply to later acquisitions). Every admitted HTTP request
// holds one request slot until Decision.End (exactly once, whatever calls it; SIP decisions hold
// none). A request of an existing session whose instance has no free request slot is refused with
// ClassTooManyRequests and RetryAfter (default 1 s); new sessions are only placed on instances
// with a free request slot, so they keep flowing to other instances meanwhile. Leak guard:
// Run's sweeper (every WithSweepInterval, default 1 s) releases, and logs, any decision not Ended
// within WithMaxRequestLifetime (default 1 h). The sweeper also refreshes the idle timer of every
// session that has an exchange in flight, so a long stream (SSE, an MCP GET) counts as use.
//
// An Active session holds one session slot on its instance (sticky-round-robin sessions hold
// none) until it ends: SessionEnded frees it. When an instance is first seen (New, or an
// instance that appears later), its session count starts from the store's per-instance counts
// (session.InstanceCounter) or, for a store without them, its ActiveByInstance, so
// sessions restored from a snapshot keep their slots (even above a lowered cap). Counters of a
// removed instance are kept while sessions or requests still count on them.
//
// # Placement of a new session
//
// balance.Place over the service's instances: healthy active instances with a free session slot
// and a free request slot, the fullest first (so idle instances empty out and can be scaled in);
// only when every active instance is full, a healthy standby instance (scale-out, signalled when
// the session opens that instance, not for later sessions filling it: the WithScaleOutHook
// function gets the service, the standby instance and the desired count and an
// info line is logged); otherwise ClassNoCapacity (503) with RetryAfter. Draining and unhealthy
// instances never take new sessions; draining ones keep serving their existing sessions.
// DesiredInstances is the scale-out gauge: instances holding sessions, plus one when every
// instance in use (active, or standby already holding sessions) is full.
//
// # Affinity modes
//
// Each mode is one descriptor (the mode type, one file mode_<name>.go each): how it decides,
// what it does on the response and at the end of the exchange, which protocols it serves and
// whether the SessionAPI manages its sessions. A request of a protocol its service's mode does
// not serve is refused before anything is placed or stored: ClassBadRequest,
// ProtocolNotSupported (a SIP decision on a cookie, header, MCP or sticky service never makes a
// session and never holds a slot). HTTP: every mode. SIP: none and hash. Config validation
// refuses SIP ports on services whose mode does not serve SIP (Serves).
//
// Adding a mode (say, affinity on a JWT claim) takes: a new file mode_<name>.go holding its
// descriptor (decide, the exchange it leaves on the decision, protocols, SessionAPI support,
// ring/DCR/instance-loss flags); one line in the modes list (mode.go); its
// registry.AffinityMode constant (config accepts it through Affinities, and checks SIP ports
// through Serves); and, if its sessions have a kind of their own, the session.Kind constant,
// the tether.v1 AffinityKind enum value and its pkg/api mapping.
//
// Only instances with the protocol's port are considered: HTTP placement, balancing and
// rebinding skip instances without an HTTP port (SIP-only), SIP decisions and the SIP side of
// the Maglev lookup skip instances without a SIP port (skipped at lookup time, like unhealthy
// ones, so dual-port instances keep the same keys for both protocols).
//
// none: each request is balanced by the service's balancing (round-robin, least-request,
// consistent-hash on the peer address) among healthy active instances with a free request
// slot; sticky-round-robin is described below. Draining instances take no new sessionless
// requests (otherwise they could never drain). All request slots full → ClassTooManyRequests;
// no healthy active instance → ClassNoCapacity.
//
// sticky round robin (balancing sticky-round-robin on a none service, and the HTTP side of a
// hash service without a DCR file): a request without a valid sticky cookie (named
// service.Cookie.Name) is a new request, balanced round robin. When its response comes and
// service.Sticky.UpstreamCookie is "" or the upstream response sets that cookie, a sticky
// session (kind sticky, no session slot, the service's TTL and idle timeout) is bound to the
// instance and Set-Cookie is added (appended) with Max-Age = TTL. A later request whose cookie
// names an Active sticky session goes to its instance while that instance is routable (healthy:
// draining or standby alike); otherwise it is balanced round robin again, the session is
// rebound to the new instance and its cookie re-issued. Unknown, ended or malformed sticky cookies are new
// requests.
//
// cookie: the cookie service.Cookie.Name.
//   - Absent: a new session under a new id (session.NewID, crypto/rand); OnResponse appends
//     "Set-Cookie: name=id; Max-Age=<TTL s>; Path=…[; HttpOnly][; Secure][; SameSite=…]",
//     never touching the upstream's cookies.
//   - Present, malformed (not exactly 32 lower-case hex digits) → ClassBadRequest.
//   - Active → its instance (idle timer touched), draining and standby ones included (a
//     session scale-out put on a standby instance keeps it while it lasts: the seeds'
//     scale-out opens "a new instance", it does not lend one); instance unhealthy or removed →
//     the session is placed anew under the same id on another instance and its session slot
//     moves (rebind: placed as a new session among the other instances, the old instance
//     never counted, its slot freed once the move is stored).
//   - Expired or Terminated record → ClassConflict "SessionIdReuseDisabled" when the record
//     disables reuse, else a new session under the same id (cookie re-issued).
//   - Unknown id (never issued, or purged) → a new session under a NEW id: a client can never
//     choose its id, hence never its instance, in cookie mode.
//
// header: the header service.HeaderField.
//   - Absent (or empty): a new session under a generated id, returned in the same header on the
//     response (overwrite).
//   - Present: 1–64 characters, first a letter, digit or '_', then letters, digits, '_' or '-'
//     (else ClassBadRequest). Active → its instance (rebound like cookies when the instance
//     cannot serve); ended → ClassConflict under disabled reuse, else a new session under the
//     same id; unknown → a new session under the client's id (the seed's semantics: the id names
//     the session, placement is still the engine's).
//
// mcp-streamable (MCP Streamable HTTP, 2025-03-26 … 2025-11-25):
//   - A request whose MCP-Protocol-Version is 2026-07-28 or later, or whose Mcp-Method header is
//     server/discover, is sessionless: balanced freely, nothing learned. The engine sees headers,
//     not bodies: a server/discover without the Mcp-Method header is placed like an initialize
//     (a stateful server answers it without a session id, which frees the slot).
//   - No Mcp-Session-Id: HTTP+SSE-style traffic (GET to service.SSE.Path, or a session query
//     parameter: the configured one, sessionId, session_id or sessionid) → ClassBadRequest
//     "TransportMismatch". Anything else (initialize) is placed like a new session: it takes a
//     session slot provisionally. OnResponse with a 2xx status and an mcp-session-id header
//     (visible ASCII, ≤ 256 bytes) creates the session (kind mcp-streamable) on the instance
//     that served it (Response.ServedHost when it names another instance of the service);
//     otherwise, or if the exchange ends first, the provisional slot is released.
//   - With Mcp-Session-Id: the Active session's instance; unknown, ended, instance removed or
//     not routable → ClassNotFound (404, never 503: the client must re-initialise), and a
//     session whose instance is lost is ended (Terminated).
//   - DELETE with an id is routed; when the upstream answers 2xx (or 404: it forgot the session
//     already) the session is Terminated, its session slot freed and the request slots of its
//     other open exchanges (e.g. a standalone GET stream) released. A 405 (the server does not
//     let clients end sessions) keeps it.
//   - Instance loss (removed or unhealthy in a new registry generation) ends the MCP
//     sessions on it (Terminated) and releases their open exchanges, so clients re-initialise.
//
// mcp-sse (MCP HTTP+SSE, 2024-11-05):
//   - GET to service.SSE.Path: must carry no query ("the first SSE request may not carry query
//     parameters", ClassBadRequest); placed like a new session with a provisional session slot;
//     WantsResponseBody reports true. LearnSession(id), with the id the caller parsed from the
//     first endpoint event, binds it (kind mcp-sse) to the instance; the GET's End ends the
//     session (Terminated) and frees its slot. The stream's request slot is held for its whole
//     life.
//   - Any request with the query parameter service.SSE.SessionParam → the bound instance, else
//     ClassNotFound. Other requests are balanced freely.
//
// hash (converged HTTP/SIP consistent hashing): one Maglev table (balance.NewMaglev, weights
// honoured) per service over all its instances, rebuilt only when the instance set or weights
// change; unhealthy, standby and draining instances are skipped at lookup time, so only their
// keys move and they come back when the instance recovers. With HashBalanceFactor ≥ 1 the
// lookup is bounded by in-flight requests (balance.LookupBounded). Keys:
//   - SIP: the first DCR rule (service.DCRFile via dcr.Watcher, reloaded by Run) that yields a
//     key, else dcr.DefaultSIPKey (From tag and Call-ID). Without Request.SIPMessage a message
//     is assembled from Method, Path (the Request-URI) and Headers. Unparseable →
//     ClassBadRequest. SIP decisions hold no request slot.
//   - HTTP with a DCR file: the DCR key, else the peer host:port (dcr.DefaultHTTPKey); the
//     chosen instance's request slots full → ClassTooManyRequests. HTTP without a DCR file:
//     sticky round robin.
//
// The same key reaches the same instance whichever protocol carries it. A DCR file that cannot
// be loaded is logged and the default keys are used until it loads.
//
// New sessions opened by requests (cookie, header, MCP initialize, SSE GET, handle mints) are
// limited per client bucket when WithNewSessionLimit is given — a creation rate
// (ClassTooManyRequests, NewSessionRateLimited, with RetryAfter) and a ceiling on the sessions
// held at a time (ClientSessionLimit); see NewSessionLimit; with WithProvisionalIdleTimeout a cookie or header
// session created by a request is provisional (ProvisionalAttribute, the short idle timeout)
// until its client's next request with the id promotes it (one store write).
//
// Every request of a session touches its idle timer (session.Store.Touch: no write
// transaction). Writes happen only when sessions are created, rebound or ended.
//
// # Proxyless gRPC clients
//
// A gRPC client configured by tether's xDS picks the instance itself, with its ring_hash
// balancer over the session header (the service's HeaderField, default
// wire.DefaultSessionHeader) and the endpoints tether's EDS gives it; tether's destination
// never reaches that picker. A Request with GRPCRing (its ext_proc filter's calls) is decided
// on the instance the engine's mirror of that ring picks (package ringhash, built on first use
// per registry generation from the instances as pkg/xds serves them: healthy with an HTTP
// port, draining ones off the ring, standby ones in priority 1): the mode runs as for a
// Subset of that one instance — a sessionless call takes a request slot there or is refused
// ClassTooManyRequests naming it, though other instances have room (ClassNoCapacity when the
// ring's instance is a standby one: priority 1, used by the client when no active instance is
// on its ring); a header session is placed there, or rebound there when tether had bound it
// elsewhere. So per-instance counts and caps
// are per backend. Without a value of the header the client hashes at random, and the engine
// balances the call as usual (its count may then be on another instance than the one serving
// it). GRPCRingLookup answers where a key goes. The mirror assumes every endpoint reachable
// by the client (ringhash, "Where a client can differ").
//
// # Rejections
//
//	ClassBadRequest       InvalidSessionId, TransportMismatch, InvalidArgument, InvalidSIPMessage, MissingHashKey, ProtocolNotSupported
//	ClassNotFound         SessionNotFound (MCP)
//	ClassConflict         SessionIdReuseDisabled
//	ClassTooManyRequests  ResourceExhausted (+ RetryAfter)
//	ClassNoCapacity       NoCapacity (+ RetryAfter)
//	ClassNoService        ServiceNotFound
//
// Each class's HTTP status, gRPC code and Retry-After are pkg/wire's table (wire.Lookup).
//
// # SessionAPI
//
// CreateSession, GetSession, UpdateSession, DeleteSession and ListSessions naming a service
// work for the modes whose descriptor says so (cookie and header); MCP services →
// ErrUnsupported (their sessions belong to the MCP client and server), none/sticky/hash →
// ErrUnsupported. CreateSession places the
// session now (a session slot, no request slot; ClassNoCapacity as a *Reject when full); a
// custom id is allowed for header services only (cookie → ErrInvalidArgument); TTL 1s..6h and
// idle timeout 0..TTL, zero values taking the service's defaults. UpdateSession changes an
// Active session only (session.ErrExpired / ErrEnded pass through) and never moves it.
// DeleteSession stops routing at once: the session is Terminated and its slot freed, the next
// request with its id starts a new session (even under disabled reuse), and requests in flight
// finish, releasing their own request slots. Usage reports every instance's counters,
// WaitDrained waits until an instance holds no session and no request, DesiredInstances is the
// scale-out gauge.
package affinity
