// Package config reads, defaults and validates tether's YAML config file (apiVersion tether/v1).
//
// Parse and Load report every problem at once, each with the file, the line, the field path and
// the reason, e.g.
//
//	tether.yaml:14: services[0].sessionsPerInstance: 500 is out of range 1..200
//
// Unknown fields are errors. YAML anchors, aliases and merge keys (<<) are honoured.
package config

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/netip"
	"os"
	"regexp"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"go.yaml.in/yaml/v3"

	"github.com/tether-dev/tether/pkg/affinity"
	"github.com/tether-dev/tether/pkg/quota"
	"github.com/tether-dev/tether/pkg/registry"
	"github.com/tether-dev/tether/pkg/session"
	"github.com/tether-dev/tether/pkg/session/memstore"
	"github.com/tether-dev/tether/pkg/session/redisstore"
	"github.com/tether-dev/tether/pkg/wire"
)

// APIVersion is the only config file version this package reads.
const APIVersion = "tether/v1"

// Config is a parsed, defaulted and validated config file. Field names mirror the YAML keys.
// Parse fills every default below, resolves relative paths (store.snapshotPath,
// services[].dcrFile, auth.tokens[].tokenFile) against the config file's directory, and reads
// token files into Token. A Config is a plain value: it is not safe to mutate while others
// read it, and Parse never shares one between calls.
//
// Defaults and ranges (a field left out of the file takes the default):
//
//	field                                 default                              allowed
//	apiVersion                            (required)                           tether/v1
//	listeners.extProc                     127.0.0.1:9002                       host:port, "" = off
//	listeners.xds                         127.0.0.1:18000                      host:port, "" = off
//	listeners.api                         127.0.0.1:9000                       host:port, "" = off
//	listeners.sip                         127.0.0.1:9060                       host:port, "" = off
//	listeners.allowInsecure               false                                (plain text off loopback)
//	tls.certFile / tls.keyFile            "" (TLS off)                         existing PEM files, both or neither
//	tls.clientCAFile                      "" (no client certificates)          existing PEM file; needs tls.certFile
//	log.format                            text                                 text|json
//	log.level                             info                                 debug|info|warn|error
//	store.snapshotPath                    "" (no snapshots)                    path
//	store.snapshotInterval                30s                                  1s..24h
//	store.retention                       24h                                  0s..720h
//	store.onCorruptSnapshot               fail                                 fail|moveAside
//	store.backend                         memory                               memory|redis
//	store.redis.addresses                 (required with redis)                host:port, one or more
//	store.redis.masterSet                 "" (no Sentinel)                     Sentinel master set name
//	store.redis.db                        0                                    0..15
//	store.redis.keyPrefix                 tether:                              no '{' or '}'
//	store.redis.password / passwordFile   ""                                   at most one
//	store.redis.tls.*                     off                                  files must exist
//	store.redis.touchDelay                1s                                   10ms..10s
//	store.redis.leaseTTL                  10s                                  1s..5m
//	store.redis.degradedFor               15s                                  1s..5m
//	store.redis.ackDurability             none                                 none|aof|replica
//	store.redis.ackReplicas               1 (replicas that must have a write)  1..64 (ackDurability replica)
//	store.redis.ackTimeout                50ms (longest WAIT/WAITAOF)          1ms..< extProc.messageTimeout/4
//	auth.allowInsecure                    false
//	auth.tokens[].name                    (required)                           unique
//	auth.tokens[].token / tokenFile       (exactly one)                        non-empty
//	auth.tokens[].services                (required)                           configured service names or "*"
//	auth.tokens[].access                  read                                 read|write (write implies read)
//	auth.tokens[].notAfter                zero (no expiry)                     RFC 3339 time
//	auth.clients[].name / id              (required)                           unique; id a URI SAN (spiffe://…) or DNS SAN; needs tls.clientCAFile
//	auth.clients[].services / access / notAfter  as auth.tokens[]
//	api.hosts                             [] (IP literals, loopback names, listeners.api's host) host names without port
//	api.origins                           [] (the listener's own origin)       scheme://host[:port], http or https
//	api.maxConnections                    0 (RLIMIT_NOFILE / 5, at most 1024)  0..1000000
//	extProc.destinationHeader             x-gateway-destination-endpoint       lower-case header name
//	extProc.metadataNamespace             envoy.lb                             non-empty
//	extProc.servedHostKey                 x-gateway-destination-endpoint-served non-empty
//	extProc.messageTimeout                500ms                                1ms..1m
//	extProc.maxRequestLifetime            1h                                   1s..24h
//	extProc.firstMessageTimeout           10s                                  1ms..5m
//	extProc.bodyMode                      none                                 none|full-duplex
//	extProc.defaultService                "" (resolve by :authority and :path) a service name
//	shutdown.drainTimeout                 10m                                  0s..24h
//	shutdown.handoff                      false                                true|false (redis: only services with maxLifetime)
//	newSessions.provisionalIdleTimeout    30s                                  0s (off)..1h
//	newSessions.perClientRate             2 (new sessions per second)          0 (off)..10000
//	newSessions.perClientBurst            20                                   1..100000
//	newSessions.trustedNetworks           [127.0.0.0/8, ::1/128]               CIDR prefixes (not limited)
//	newSessions.perClientMaxSessions      40 (sessions held at a time)         0 (off)..100000
//	newSessions.perServiceShare           0.25 (of a service's session slots)  0 (off)..1
//	newSessions.wideBucketFactor          4 (an IPv6 /48 counts as 4 clients)  1..1000
//	newSessions.groupIPv4By24             false (a /24 also counts as 4 clients)
//	envoy.managedListeners                false
//	envoy.listenerAddress                 0.0.0.0:10000                        host:port
//	envoy.adminAddress                    127.0.0.1:9901                       host:port
//	envoy.tls.caFile                      "" (required by bootstrap with tls)  path on Envoy's host
//	envoy.tls.certFile / envoy.tls.keyFile "" (required by bootstrap with tls.clientCAFile) paths on Envoy's host, both or neither
//	envoy.tls.serverName                  "" (no SNI, chain checked only)      DNS name in tether's certificate
//	envoy.replicas[].xds / .extProc       [] (this config's listeners)         host:port, port ≥ 1, not unspecified; unique
//	envoy.replicaMode                     active-active                        active-active|active-standby (needs ≥ 2 replicas)
//	services[].name                       (required)                           [a-z0-9]([-a-z0-9]*[a-z0-9])?, ≤ 63, unique
//	services[].match.authorities          [] (any)                             host names without port
//	services[].match.pathPrefix           /                                    starts with /
//	services[].affinity                   none                                 none|cookie|header|mcp-streamable|mcp-sse|hash
//	services[].balancing                  round-robin (consistent-hash for affinity hash)
//	                                                                           round-robin|sticky-round-robin|least-request|consistent-hash
//	services[].sessionsPerInstance        20                                   1..200
//	services[].requestSlotsPerInstance    200                                  1..10000
//	services[].streamsPerInstance         100 (mcp-streamable, mcp-sse)        0..10000; 0 counts MCP streams as requests
//	services[].sessionTTL                 6h                                   1s..6h
//	services[].idleTimeout                30m (capped at sessionTTL if unset)  0s..6h, ≤ sessionTTL; 0 = off
//	services[].maxLifetime                0s (unbounded)                       0s..24h
//	services[].disableSessionIdReuse      false
//	services[].cookie.name                tether-session                       RFC 6265 token
//	services[].cookie.path                /                                    starts with /
//	services[].cookie.secure              false                                (must be true with sameSite None)
//	services[].cookie.httpOnly            true
//	services[].cookie.sameSite            Lax                                  Lax|Strict|None|"" (attribute left out)
//	services[].cookie.lifetime            permanent                            permanent (Max-Age = sessionTTL)|session (no Max-Age)
//	services[].sticky.upstreamCookie      "" (always add the sticky cookie)    RFC 6265 token
//	services[].headerField                x-tether-session                     5..40 chars: a letter, then letters, digits, - or _
//	services[].sse.path                   /sse                                 starts with /, inside match.pathPrefix
//	services[].sse.sessionParam           sessionId                            sessionId|session_id|sessionid
//	services[].mcpHandle.header           "" (handle affinity off)             an x-mcp-header name (token chars, ≤ 64); mcp-streamable only
//	services[].mcpHandle.learnHeader      Mcp-Handle                           header name, or "" (no learning from responses)
//	services[].mcpHandle.instancePrefix   false                                (handles start with "<instance id><prefixSeparator>")
//	services[].mcpHandle.prefixSeparator  ":"                                  one character not allowed in instance ids
//	services[].mcpHandle.mintTools        [] (any tools/call may mint)         tool names
//	services[].dcrFile                    "" (none)                            existing file
//	services[].hashBalanceFactor          0 (bounded load off)                 0 or ≥ 1
//	services[].upstream.protocol          http1                                http1|http2
//	services[].bodyMode                   "" (extProc.bodyMode)                ""|none|full-duplex
//	services[].upstream.connectTimeout    2s                                   1ms..1m
//	services[].calls.track                false (no call load)                 (affinity none or hash only)
//	services[].calls.capPerInstance       0 (no cap)                           0..1000000; needs calls.track
//	services[].calls.perSourceSetup       0 (auto: capPerInstance/4, ≥ 1; none without a cap) 0..1000000
//	services[].calls.ttl                  2h (an answered call never ended)    1s..48h
//	services[].calls.setupTTL             5m (a decided call never answered)   1s..1h
//	services[].healthCheck.path           /healthz                             starts with /
//	services[].healthCheck.interval       0s (checks off)                      0s or 10ms..1h
//	services[].healthCheck.timeout        1s (capped at interval if unset)     1ms..1m, ≤ interval
//	services[].healthCheck.healthyThreshold   2                                1..100
//	services[].healthCheck.unhealthyThreshold 3                                1..100
//	services[].instances[].id             (required)                           [A-Za-z0-9]([-._A-Za-z0-9]*[A-Za-z0-9])?, ≤ 63, unique in the service
//	services[].instances[].address        (required)                           IP literal, not unspecified; IPv6 with or without brackets, stored in canonical form (2001:db8::1)
//	services[].instances[].ports.http     0 (none)                             0..65535; at least one of http, sip non-zero
//	services[].instances[].ports.sip      0 (none)                             0..65535
//	services[].instances[].weight         1                                    1..1000
//	services[].instances[].zone           ""
//	services[].instances[].state          active                               active|standby|draining
//	discovery.*, services[].discovery.*   see Discovery
//	registry.allowedNetworks              [] (any address not always refused;  CIDR prefixes; see registry.AddressPolicy
//	                                      loopback and link-local refused)
//	runtime.gcHeapFloorMiB                32                                   0 (Go's default pacing)..65536; ignored when GOGC is set
//
// Cross-field rules: when listeners.api is not a loopback address, auth.tokens must be set or
// auth.allowInsecure must be true; when any listener is not a loopback address (an empty host
// or 0.0.0.0 listens on every interface), tls must be set or listeners.allowInsecure must be
// true; two listeners may not share an address (port 0, "pick a free
// port", is exempt); two services may not have the same match; two instances of a service may
// not share an HTTP or SIP endpoint.
//
// MCP Streamable HTTP needs GET, POST and DELETE on one endpoint. A match has no method
// restriction, so every mcp-streamable service accepts all three; should match ever gain
// methods, validation must reject an mcp-streamable service that excludes any of them.
type Config struct {
	APIVersion string    `yaml:"apiVersion"`
	Listeners  Listeners `yaml:"listeners"`
	Log        Log       `yaml:"log"`
	Store      Store     `yaml:"store"`
	Auth       Auth      `yaml:"auth"`
	// API guards the API listener against browsers and floods (see API).
	API     API     `yaml:"api"`
	TLS     TLS     `yaml:"tls"`
	ExtProc ExtProc `yaml:"extProc"`
	// NewSessions bounds what a client can open with requests that never come back.
	NewSessions NewSessions `yaml:"newSessions"`
	Envoy       Envoy       `yaml:"envoy"`
	Discovery   Discovery   `yaml:"discovery"`
	// Autoscaling configures scale events and their webhook (see Autoscaling).
	Autoscaling Autoscaling `yaml:"autoscaling"`
	// Runtime are Go runtime settings tether serve applies at start (see Runtime).
	Runtime Runtime `yaml:"runtime"`
	// RegistryOptions is the registry section: which addresses instances may have.
	RegistryOptions Registry `yaml:"registry"`
	// Shutdown is how tether serve stops (SIGTERM, or POST /v1/replica/drain) without resetting
	// the exchanges it decided (see Shutdown).
	Shutdown Shutdown  `yaml:"shutdown"`
	Services []Service `yaml:"services"`

	// File is the path the config was parsed from, as given to Load or Parse.
	File string `yaml:"-"`
	// Warnings are settings that load but may not do what their author meant (e.g. a hash
	// service some of whose instances have no SIP port: SIP decisions skip them), one line
	// each, "line N: path: message". tether logs them at startup and on reload.
	Warnings []string `yaml:"-"`
}

// Shutdown is the drain tether serve runs before it exits. The ext_proc health service turns
// NOT_SERVING at once, and new side streams are still served for wire.HealthCheckMoveAway
// (Envoy's health check interval × unhealthy threshold + timeout, from the generated
// bootstrap) while Envoy moves them to the other replicas. Exchanges tether has not yet
// answered at their response headers (and MCP SSE streams whose session id it has not yet
// learned) always finish normally. Exchanges past that point are kept until they end, at most
// DrainTimeout, or — at the deadline, or as soon as Envoy moved away with Handoff — their side
// streams are closed with status OK and Envoy carries them on without tether.
type Shutdown struct {
	// DrainTimeout bounds how long answered exchanges keep the replica alive (0: hand them
	// off as soon as Envoy moved away). Like Envoy's own --drain-time-s it may be hours; the
	// Kubernetes manifests derive terminationGracePeriodSeconds from it.
	DrainTimeout time.Duration `yaml:"drainTimeout"`
	// Handoff hands answered exchanges off as soon as Envoy moved away, instead of waiting for
	// them to end. What happens to a handed-off exchange's request slot (at once or at the
	// deadline alike): with store.backend memory it is released with this replica's counts
	// (the other replicas count their own; none learns of it); with store.backend redis it
	// stays leased, as a detached hold every replica counts against the cap (pkg/quota),
	// until the exchange's services[].maxLifetime from its start has passed — Envoy ends the
	// exchange then (the route's max_stream_duration). So on Redis only exchanges of services
	// with a maxLifetime are handed off; the others (and any whose lease lapsed) are kept up
	// to DrainTimeout and then reset.
	Handoff bool `yaml:"handoff"`
}

// DefaultDrainTimeout is shutdown.drainTimeout's default: Envoy's default --drain-time-s.
const DefaultDrainTimeout = 10 * time.Minute

// Listeners are the addresses tether listens on, as host:port. An empty address turns that
// listener off; port 0 picks a free port (for tests; serve logs the bound address).
type Listeners struct {
	// ExtProc serves Envoy's ext_proc gRPC stream.
	ExtProc string `yaml:"extProc"`
	// XDS serves Envoy's aggregated discovery service (gRPC).
	XDS string `yaml:"xds"`
	// API serves the admin endpoints and the SessionAPI (HTTP/JSON and gRPC over h2c).
	API string `yaml:"api"`
	// SIP serves the HTTP decision endpoint Kamailio calls.
	SIP string `yaml:"sip"`
	// AllowInsecure allows a listener that is not loopback to serve without TLS. serve logs a
	// warning for each such listener.
	AllowInsecure bool `yaml:"allowInsecure"`
}

// TLS is the certificate every listener (ext_proc, xDS, API, SIP decide) serves when set.
// The files are read at start and again whenever they change (see pkg/servertls): a rotated
// certificate needs no restart. After Parse the paths are resolved against the config file's
// directory.
type TLS struct {
	// CertFile is the PEM certificate, optionally followed by its chain.
	CertFile string `yaml:"certFile"`
	// KeyFile is the PEM private key of CertFile.
	KeyFile string `yaml:"keyFile"`
	// ClientCAFile, if set, turns on mutual TLS on every listener: clients (Envoy, Kamailio,
	// the CLI) must present a certificate signed by one of its CAs.
	ClientCAFile string `yaml:"clientCAFile"`
}

// Enabled reports whether the listeners serve TLS.
func (t TLS) Enabled() bool { return t.CertFile != "" }

// Log configures tether's own logging.
type Log struct {
	// Format is "text" or "json".
	Format string `yaml:"format"`
	// Level is "debug", "info", "warn" or "error".
	Level string `yaml:"level"`
}

// SlogLevel returns Level as a slog.Level (info for an unknown value, which validation rejects).
func (l Log) SlogLevel() slog.Level {
	switch l.Level {
	case "debug":
		return slog.LevelDebug
	case "warn":
		return slog.LevelWarn
	case "error":
		return slog.LevelError
	}
	return slog.LevelInfo
}

// Session store backends (store.backend).
const (
	// StoreMemory is the embedded go-memdb table of one process (snapshots on disk).
	StoreMemory = "memory"
	// StoreRedis is Redis (≥ 7) or Valkey shared by every replica pointing at it.
	StoreRedis = "redis"
)

// Store configures the session store.
type Store struct {
	// Backend is StoreMemory (default) or StoreRedis. With redis, every tether replica that
	// uses the same Redis and key prefix shares sessions, session slots (exact placement in
	// the store) and request slots (leases), so an Envoy may use any replica.
	Backend string `yaml:"backend"`
	// Redis configures the redis backend.
	Redis RedisStore `yaml:"redis"`
	// SnapshotPath is where the session table is snapshotted; "" means no snapshots. After
	// Parse a relative path is already joined to the config file's directory.
	SnapshotPath string `yaml:"snapshotPath"`
	// SnapshotInterval is the time between periodic snapshots.
	SnapshotInterval time.Duration `yaml:"snapshotInterval"`
	// Retention is how long ended (Expired/Terminated) session records are kept.
	Retention time.Duration `yaml:"retention"`
	// OnCorruptSnapshot is what serve does when the snapshot file exists but cannot be
	// trusted (checksum, format or content): SnapshotFail (the default) refuses to start and
	// leaves the file as it is; SnapshotMoveAside renames it to path.corrupt-<time>, logs an
	// error and starts with no sessions.
	OnCorruptSnapshot string `yaml:"onCorruptSnapshot"`
}

// Store.OnCorruptSnapshot values.
const (
	SnapshotFail      = "fail"
	SnapshotMoveAside = "moveAside"
)

// RedisStore is how tether reaches Redis or Valkey. One address is a server (or a Cluster
// seed: a Cluster is detected and its slots followed); with MasterSet the addresses are
// Sentinels. Persistence is Redis's own: run it with appendonly yes; appendfsync always loses
// no acknowledged session on a crash, everysec up to about a second of them — also on a
// redis-server kill -9 while the disk is busy (see examples/replicas/README.md). AckDurability
// makes tether wait for the AOF or for replicas before it acknowledges a session.
type RedisStore struct {
	// Addresses are host:port (required with backend redis).
	Addresses []string `yaml:"addresses"`
	// MasterSet is the Sentinel master set name; "" means no Sentinel.
	MasterSet string `yaml:"masterSet"`
	// Username and Password authenticate (Redis ACL; empty username is "default").
	// PasswordFile, if set, is read instead of Password (relative to the config file).
	Username     string `yaml:"username"`
	Password     string `yaml:"password"`
	PasswordFile string `yaml:"passwordFile"`
	// SentinelPassword authenticates to the Sentinels.
	SentinelPassword string `yaml:"sentinelPassword"`
	// DB is the database number (0..15; a Cluster has only 0).
	DB int `yaml:"db"`
	// KeyPrefix starts every key tether writes (default "tether:"); fleets sharing one Redis
	// use different prefixes. It must not contain '{' or '}' (they delimit Cluster hash tags).
	KeyPrefix string `yaml:"keyPrefix"`
	// TLS connects with TLS when Enabled; CAFile (default: the system roots), ServerName, and
	// CertFile/KeyFile for a client certificate.
	TLS RedisTLS `yaml:"tls"`
	// TouchDelay batches the idle-timer touches (default 1s, 10ms..10s): the error bound of
	// idle expiry and the period of the store writes a busy session costs.
	TouchDelay time.Duration `yaml:"touchDelay"`
	// LeaseTTL is how long a replica's lease of request slots lives without renewal (default
	// 10s, 1s..5m): a dead replica's slots come back after it; a replica cut off from Redis
	// spends its lease until then. It is also the TTL of the session-slot reservations of MCP
	// initializes, SSE GETs and handle mints still waiting for their session id: a dead
	// replica's reservations free their slots after it.
	LeaseTTL time.Duration `yaml:"leaseTTL"`
	// DegradedFor is the fail-static window (default 15s, 1s..5m; pkg/quota): while Redis
	// cannot be reached, a replica keeps routing the sessions it knows and admits requests
	// within the request slots it held — never more — for this long after its last lease
	// renewal; then it admits none and ends the exchanges still on the lapsed lease. Redis
	// keeps a lease max(leaseTTL, degradedFor): it is also how long a dead replica's request
	// slots stay taken, and how long nothing new is lent after Redis lost its data.
	DegradedFor time.Duration `yaml:"degradedFor"`
	// HealthLeaseTTL is the TTL of the lease that elects the one replica running health checks
	// (default 5s, 1s..5m): when it dies, another checks within HealthLeaseTTL × 1.1 (pkg/health).
	HealthLeaseTTL time.Duration `yaml:"healthLeaseTTL"`
	// AckDurability is what a write whose loss would lose an acknowledged session (a create, a
	// promotion or other update, a move) waits for before tether acknowledges it (default
	// none; redisstore.AckDurability): none — the primary ran it; aof — it is fsynced to the
	// primary's append-only file (Redis must run appendonly yes and appendfsync always: serve
	// refuses to start otherwise, and each such write checks it again on its connection, with
	// WAITAOF where Redis ≥ 7.2 or Valkey has it); replica — AckReplicas replicas have it
	// (WAIT on the write's connection). A write that cannot be acknowledged within AckTimeout
	// answers 503 StoreUnavailable with Retry-After (a new session is ended again when Redis
	// lets it). Measured cost and losses: examples/replicas/README.md, "Persistence".
	AckDurability string `yaml:"ackDurability"`
	// AckReplicas is how many replicas must acknowledge each such write with ackDurability
	// replica (default 1, 1..64).
	AckReplicas int `yaml:"ackReplicas"`
	// AckTimeout is the longest a write waits for its acknowledgement (WAIT/WAITAOF timeout;
	// default 50ms, at least 1ms, shorter than extProc.messageTimeout/4).
	AckTimeout time.Duration `yaml:"ackTimeout"`
	// RegistryResync is how often a replica checks the shared registry layer's version (default
	// 5s, 100ms..5m): a replica that missed a change message has it within this (pkg/fleet).
	RegistryResync time.Duration `yaml:"registryResync"`
}

// RedisTLS is the client TLS of the redis backend.
type RedisTLS struct {
	Enabled    bool   `yaml:"enabled"`
	CAFile     string `yaml:"caFile"`
	CertFile   string `yaml:"certFile"`
	KeyFile    string `yaml:"keyFile"`
	ServerName string `yaml:"serverName"`
}

// Auth configures authentication of the SessionAPI and admin endpoints.
type Auth struct {
	// AllowInsecure allows a non-loopback api listener without tokens.
	AllowInsecure bool `yaml:"allowInsecure"`
	// Tokens are the accepted bearer tokens.
	Tokens []Token `yaml:"tokens"`
	// Clients are TLS client identities (certificates tls.clientCAFile verifies) with the
	// same scopes as tokens: the API can run on mutual TLS alone.
	Clients []Client `yaml:"clients"`
}

// Enabled reports whether any caller must authenticate (tokens or client identities).
func (a Auth) Enabled() bool { return len(a.Tokens) > 0 || len(a.Clients) > 0 }

// Client is one TLS client identity and what it may do. A request whose verified client
// certificate has ID among its subject alternative names (a URI SAN such as a SPIFFE ID
// spiffe://example.org/ops, or a DNS SAN) and no Authorization header is this client.
type Client struct {
	Name string `yaml:"name"`
	// ID is the SAN: a URI (with a scheme, e.g. spiffe://…) or a DNS name.
	ID string `yaml:"id"`
	// Services and Access are as a Token's.
	Services []string `yaml:"services"`
	Access   string   `yaml:"access"`
	// NotAfter, if set, is when the identity stops being accepted.
	NotAfter time.Time `yaml:"notAfter"`
}

func (c *Client) setDefaults() { c.Access = AccessRead }

// API guards the API listener. A browser page can reach a loopback API too: Hosts and Origins
// name who may. A request whose Host is not an IP literal, a loopback name (localhost,
// *.localhost), listeners.api's own host or one of Hosts is refused unless it authenticates (a
// DNS-rebinding page has the victim's network position, not a token); a request with an
// Origin other than the listener's own (the dashboard's) or one of Origins is refused.
type API struct {
	// Hosts are further host names (without port) clients use to reach the API, e.g. a
	// Kubernetes Service name or a load balancer's name.
	Hosts []string `yaml:"hosts"`
	// Origins are further browser origins ("https://ops.example.com") allowed to call the
	// API; the API sends no CORS headers, so only pages of these origins that reach it
	// same-origin (e.g. through a reverse proxy) benefit.
	Origins []string `yaml:"origins"`
	// MaxConnections caps the connections the API listener holds; at the cap a new one evicts
	// the longest idle, silent or slow-body one (pkg/connlimit). 0: a fifth of the process's
	// descriptor limit, at most 1024.
	MaxConnections int `yaml:"maxConnections"`
	// StoreTimeout bounds each session-store call a SessionAPI call makes (default
	// DefaultAPIStoreTimeout, 2s; 10ms..30s). The request path's store calls keep their own,
	// much shorter bound (a quarter of extProc.messageTimeout, inside the decision deadline of
	// four fifths of it), because Envoy gives up on a decision at messageTimeout; an operator's
	// create, read or delete has no such deadline, and on a loaded machine or a slow Redis a
	// request path's bound would answer it 503 StoreUnavailable for want of a few hundred
	// milliseconds. A gRPC caller's own deadline, if sooner, still applies.
	StoreTimeout time.Duration `yaml:"storeTimeout"`
}

// DefaultAPIStoreTimeout is api.storeTimeout's default: the bound of each session-store call
// of a SessionAPI call, sixteen times the request path's default (extProc.messageTimeout 500 ms
// / 4) and far below the API's write timeout (60 s).
const DefaultAPIStoreTimeout = 2 * time.Second

// Access levels of a token.
const (
	AccessRead  = "read"
	AccessWrite = "write"
)

// Token is one bearer token and what it may do.
type Token struct {
	Name string `yaml:"name"`
	// Token is the secret. After Parse it is set even when the file named TokenFile (its
	// content, trimmed of surrounding white space).
	Token string `yaml:"token"`
	// TokenFile is the file the token was read from (resolved against the config file's
	// directory), or "".
	TokenFile string `yaml:"tokenFile"`
	// Services are the service names the token may touch; "*" means all.
	Services []string `yaml:"services"`
	// Access is AccessRead or AccessWrite (write implies read).
	Access string `yaml:"access"`
	// NotAfter, if set, is when the token stops being accepted (RFC 3339); open status
	// streams authenticated with it end then.
	NotAfter time.Time `yaml:"notAfter"`
}

// LogValue keeps the secret out of logs.
func (t Token) LogValue() slog.Value {
	return slog.GroupValue(
		slog.String("name", t.Name),
		slog.Any("services", t.Services),
		slog.String("access", t.Access),
	)
}

// NewSessions bounds the sessions a client opens through the data plane (SessionAPI creates are
// not limited), per client bucket (an IPv4 address, an IPv6 /64; an IPv6 /48 — and with
// groupIPv4By24 an IPv4 /24 — is also a bucket of wideBucketFactor clients; requests without a
// usable source address share one bucket): a creation rate (perClientRate, perClientBurst)
// and a ceiling on the sessions held at a time, returning clients' included
// (perClientMaxSessions, and never more than perServiceShare of a service's slots). See
// affinity.NewSessionLimit and the README's "What an anonymous client can take".
type NewSessions struct {
	// ProvisionalIdleTimeout is the idle timeout of a session created by a request until its
	// client comes back with the id (then the service's idleTimeout applies); 0 turns it off.
	ProvisionalIdleTimeout time.Duration `yaml:"provisionalIdleTimeout"`
	// PerClientRate is how many new sessions per second one client address may open (a token
	// bucket, PerClientBurst deep); 0 turns the limit off. Over it: 429 with Retry-After.
	PerClientRate  float64 `yaml:"perClientRate"`
	PerClientBurst int     `yaml:"perClientBurst"`
	// TrustedNetworks are CIDR prefixes whose clients are not limited (e.g. a NAT of your own).
	TrustedNetworks []string `yaml:"trustedNetworks"`
	// PerClientMaxSessions is the most sessions of one service one client bucket holds at a
	// time; 0 turns the ceiling off. Over it: 429 ClientSessionLimit.
	PerClientMaxSessions int `yaml:"perClientMaxSessions"`
	// PerServiceShare is the largest fraction of a service's session slots (sessions per
	// instance × instances) one client bucket may hold; 0 turns it off.
	PerServiceShare float64 `yaml:"perServiceShare"`
	// WideBucketFactor is how many clients an IPv6 /48 (and, with GroupIPv4By24, an IPv4 /24)
	// counts as, for the rate and the ceiling alike.
	WideBucketFactor int  `yaml:"wideBucketFactor"`
	GroupIPv4By24    bool `yaml:"groupIPv4By24"`
}

// Limit returns the engine's limit of these settings.
func (n NewSessions) Limit() affinity.NewSessionLimit {
	return affinity.NewSessionLimit{PerSecond: n.PerClientRate, Burst: n.PerClientBurst, Trusted: n.Trusted(),
		MaxSessions: n.PerClientMaxSessions, ServiceShare: n.PerServiceShare, WideFactor: n.WideBucketFactor,
		GroupIPv4By24: n.GroupIPv4By24}
}

// Trusted returns TrustedNetworks parsed (validation has checked them).
func (n NewSessions) Trusted() []netip.Prefix {
	out := make([]netip.Prefix, 0, len(n.TrustedNetworks))
	for _, s := range n.TrustedNetworks {
		if p, err := netip.ParsePrefix(s); err == nil {
			out = append(out, p.Masked())
		}
	}
	return out
}

// ExtProc configures the ext_proc server and the ext_proc filter tether generates for Envoy.
type ExtProc struct {
	// DestinationHeader carries the chosen instance (ip:port) to Envoy's override_host policy.
	DestinationHeader string `yaml:"destinationHeader"`
	// MetadataNamespace is the dynamic-metadata namespace for the destination.
	MetadataNamespace string `yaml:"metadataNamespace"`
	// ServedHostKey is the metadata key under which Envoy reports the host it really used.
	ServedHostKey string `yaml:"servedHostKey"`
	// MessageTimeout is written into the Envoy ext_proc filter config.
	MessageTimeout time.Duration `yaml:"messageTimeout"`
	// MaxRequestLifetime bounds an exchange that is not a stream: one still open this long is
	// reset (Envoy resets the downstream stream), counted and logged; its request slot is freed
	// when the exchange really ends, never before. Streams (SSE responses, MCP streams) are
	// bounded by their service's maxLifetime instead (0: unbounded, as Envoy's route).
	MaxRequestLifetime time.Duration `yaml:"maxRequestLifetime"`
	// FirstMessageTimeout closes an ext_proc stream that sends nothing for this long after it
	// opened (Envoy sends request_headers at once; only broken or hostile clients wait).
	FirstMessageTimeout time.Duration `yaml:"firstMessageTimeout"`
	// BodyMode is how the ext_proc filter shows bodies to tether, for every service that does
	// not choose its own (services[].bodyMode): BodyModeNone (headers only; the default) or
	// BodyModeFullDuplex (FULL_DUPLEX_STREAMED request and response bodies, trailers SEND:
	// every chunk passes through tether unchanged). Full duplex is what Envoy Gateway's
	// EnvoyExtensionPolicy needs to send response trailers, and what the Gateway API Inference
	// Extension's endpoint-picker protocol requires; it costs a round trip per chunk.
	BodyMode string `yaml:"bodyMode"`
	// DefaultService is the service of ext_proc streams that name none (no x-tether-service
	// initial metadata): an endpoint-picker attachment (Gateway API Inference Extension
	// InferencePool.endpointPickerRef, Envoy Gateway EnvoyExtensionPolicy, an Istio
	// EnvoyFilter), where the data plane's ext_proc filter is tether's alone and the pool is one
	// tether service. "" resolves such streams by :authority and :path. A name the registry
	// does not know (config, API or discovery) answers 404 ServiceNotFound.
	DefaultService string `yaml:"defaultService"`
	// GRPCClientTarget is this ext_proc listener as proxyless gRPC clients dial it, a gRPC
	// target URI (e.g. dns:///tether.tether-system.svc.cluster.local:9002). Set, tether's xDS
	// gives gRPC clients (gRFC A93) its ext_proc filter, so their calls get tether's slots and
	// rejections; the clients' bootstrap must list exactly this target in
	// allowed_grpc_services (deploy/grpc). "" (the default): gRPC clients get hashing only.
	GRPCClientTarget string `yaml:"grpcClientTarget"`
}

// Cookie lifetimes (services[].cookie.lifetime).
const (
	CookiePermanent = "permanent"
	CookieSession   = "session"
)

// Body modes of the ext_proc filter (extProc.bodyMode, services[].bodyMode).
const (
	BodyModeNone       = "none"
	BodyModeFullDuplex = "full-duplex"
)

// Envoy configures what tether generates for Envoy.
type Envoy struct {
	// ManagedListeners makes tether serve LDS/RDS with the ext_proc filter and one route per
	// service.
	ManagedListeners bool `yaml:"managedListeners"`
	// ListenerAddress is the data-plane listener address (host:port).
	ListenerAddress string `yaml:"listenerAddress"`
	// AdminAddress is Envoy's admin address (host:port).
	AdminAddress string `yaml:"adminAddress"`
	// TLS is how the generated bootstrap's Envoy reaches tether's ext_proc and xDS listeners
	// when tls is set. Its paths are files on Envoy's host, used as written.
	TLS EnvoyTLS `yaml:"tls"`
	// Replicas lists every tether replica the generated bootstrap's Envoy may use; empty means
	// this config's own listeners.xds and listeners.extProc. With two or more, the bootstrap's
	// control-plane clusters list them all, health-checked and with outlier detection.
	Replicas []Replica `yaml:"replicas"`
	// ReplicaMode is ReplicasActiveActive (every replica takes traffic: needs a store the
	// replicas share) or ReplicasActiveStandby (replicas[0] active, the others priority-1
	// standbys, for replicas that share nothing). See envoy/README.md.
	ReplicaMode string `yaml:"replicaMode"`
}

// Replica is one tether replica's addresses as Envoy reaches them.
type Replica struct {
	// XDS is the replica's ADS listener, host:port.
	XDS string `yaml:"xds"`
	// ExtProc is the replica's ext_proc listener, host:port.
	ExtProc string `yaml:"extProc"`
}

// Envoy.ReplicaMode values.
const (
	ReplicasActiveActive  = "active-active"
	ReplicasActiveStandby = "active-standby"
)

// EnvoyTLS are the files of Envoy's side of TLS to tether.
type EnvoyTLS struct {
	// CAFile is the CA Envoy trusts for tether's certificate.
	CAFile string `yaml:"caFile"`
	// CertFile and KeyFile are Envoy's client certificate, needed when tls.clientCAFile is set.
	CertFile string `yaml:"certFile"`
	KeyFile  string `yaml:"keyFile"`
	// ServerName is sent as SNI and must be a DNS name in tether's certificate; "" checks the
	// chain only.
	ServerName string `yaml:"serverName"`
}

// Service is one application behind Envoy. See Config for defaults and ranges.
type Service struct {
	Name                    string                `yaml:"name"`
	Match                   Match                 `yaml:"match"`
	Affinity                registry.AffinityMode `yaml:"affinity"`
	Balancing               registry.Balancing    `yaml:"balancing"`
	SessionsPerInstance     int                   `yaml:"sessionsPerInstance"`
	RequestSlotsPerInstance int                   `yaml:"requestSlotsPerInstance"`
	// StreamsPerInstance caps the long-lived MCP streams per instance (SSE GET streams,
	// subscriptions/listen POSTs) apart from the request slots; MCP modes only.
	StreamsPerInstance    int           `yaml:"streamsPerInstance"`
	SessionTTL            time.Duration `yaml:"sessionTTL"`
	IdleTimeout           time.Duration `yaml:"idleTimeout"`
	MaxLifetime           time.Duration `yaml:"maxLifetime"`
	DisableSessionIDReuse bool          `yaml:"disableSessionIdReuse"`
	Cookie                Cookie        `yaml:"cookie"`
	Sticky                Sticky        `yaml:"sticky"`
	HeaderField           string        `yaml:"headerField"`
	SSE                   SSE           `yaml:"sse"`
	MCPHandle             MCPHandle     `yaml:"mcpHandle"`
	// DCRFile is the data-centric-rules.xml path, already resolved against the config file's
	// directory; "" means none.
	DCRFile           string   `yaml:"dcrFile"`
	HashBalanceFactor float64  `yaml:"hashBalanceFactor"`
	Upstream          Upstream `yaml:"upstream"`
	// BodyMode overrides extProc.bodyMode for this service's routes ("" inherits it).
	BodyMode    string      `yaml:"bodyMode"`
	Calls       Calls       `yaml:"calls"`
	HealthCheck HealthCheck `yaml:"healthCheck"`
	Instances   []Instance  `yaml:"instances"`
	// Discovery is where more instances come from (see Discovery for its fields).
	Discovery ServiceDiscovery `yaml:"discovery"`
}

// SourceSetup is the per-source limit on calls in setup of these settings (calls.Limits).
func (c Calls) SourceSetup() int {
	switch {
	case c.PerSourceSetup > 0:
		return c.PerSourceSetup
	case c.CapPerInstance > 0:
		return max(1, c.CapPerInstance/4)
	}
	return 0
}

// Calls configures a SIP service's call load (pkg/calls): tether counts the calls each instance
// carries from the proxy's answered/ended reports (examples/converged/kamailio.cfg with
// WITH_CALL_LOAD) and may cap them.
type Calls struct {
	// Track counts calls per instance.
	Track bool `yaml:"track"`
	// CapPerInstance refuses a new call (SIP 503 through the proxy) on an instance already
	// carrying this many; 0 means no cap.
	CapPerInstance int `yaml:"capPerInstance"`
	// PerSourceSetup is the most calls in setup (decided, not answered) one SIP source (its
	// address as the proxy reports it: IPv4 address, IPv6 /64; sources without one share a
	// bucket; newSessions.trustedNetworks are exempt) may hold in the service; 0 is
	// capPerInstance/4 (at least 1), none without a cap. Over it: SIP 503 (SourceCallLimit).
	PerSourceSetup int `yaml:"perSourceSetup"`
	// TTL ends an answered call the proxy never reported ended; SetupTTL a decided call never
	// reported answered.
	TTL      time.Duration `yaml:"ttl"`
	SetupTTL time.Duration `yaml:"setupTTL"`
}

// Match selects the HTTP requests of a service.
type Match struct {
	Authorities []string `yaml:"authorities"`
	PathPrefix  string   `yaml:"pathPrefix"`
}

// Cookie holds the attributes of the affinity cookie.
type Cookie struct {
	Name     string `yaml:"name"`
	Path     string `yaml:"path"`
	Secure   bool   `yaml:"secure"`
	HTTPOnly bool   `yaml:"httpOnly"`
	SameSite string `yaml:"sameSite"`
	// Lifetime is CookiePermanent (Max-Age = sessionTTL) or CookieSession (no Max-Age or
	// Expires: the browser forgets the cookie when it closes). Gateway API lifetimeType.
	Lifetime string `yaml:"lifetime"`
}

// Sticky configures sticky round robin.
type Sticky struct {
	UpstreamCookie string `yaml:"upstreamCookie"`
}

// MCPHandle configures handle affinity for the sessionless requests (MCP 2026-07-28 and later)
// of an mcp-streamable service; see registry.MCPHandle and pkg/affinity's mcp_handle.go.
type MCPHandle struct {
	// Header is the x-mcp-header name of the tool parameter carrying the handle; requests
	// carry it in "Mcp-Param-{Header}". Empty turns handle affinity off.
	Header string `yaml:"header"`
	// LearnHeader is the response header in which the server names a handle it minted.
	LearnHeader string `yaml:"learnHeader"`
	// InstancePrefix: handles start with the minting instance's id and PrefixSeparator.
	InstancePrefix  bool   `yaml:"instancePrefix"`
	PrefixSeparator string `yaml:"prefixSeparator"`
	// MintTools are the tools whose calls mint handles (empty: any tools/call without one).
	MintTools []string `yaml:"mintTools"`
}

// SSE configures MCP HTTP+SSE affinity.
type SSE struct {
	Path         string `yaml:"path"`
	SessionParam string `yaml:"sessionParam"`
}

// Upstream protocols.
const (
	ProtocolHTTP1 = "http1"
	ProtocolHTTP2 = "http2"
)

// Upstream configures how Envoy talks to the instances.
type Upstream struct {
	Protocol       string        `yaml:"protocol"`
	ConnectTimeout time.Duration `yaml:"connectTimeout"`
}

// HealthCheck configures active HTTP health checks; Interval 0 turns them off.
type HealthCheck struct {
	Path               string        `yaml:"path"`
	Interval           time.Duration `yaml:"interval"`
	Timeout            time.Duration `yaml:"timeout"`
	HealthyThreshold   int           `yaml:"healthyThreshold"`
	UnhealthyThreshold int           `yaml:"unhealthyThreshold"`
}

// Instance is one endpoint of a service.
type Instance struct {
	ID      string         `yaml:"id"`
	Address string         `yaml:"address"`
	Ports   Ports          `yaml:"ports"`
	Weight  int            `yaml:"weight"`
	Zone    string         `yaml:"zone"`
	State   registry.State `yaml:"state"`
}

// Ports are an instance's ports; 0 means none.
type Ports struct {
	HTTP int `yaml:"http"`
	SIP  int `yaml:"sip"`
}

// defaulter is implemented by the types whose fields have defaults; the decoder calls
// setDefaults on every value before it reads the file's fields into it.
type defaulter interface{ setDefaults() }

func (c *Config) setDefaults() {
	c.Listeners = Listeners{
		ExtProc: "127.0.0.1:9002",
		XDS:     "127.0.0.1:18000",
		API:     "127.0.0.1:9000",
		SIP:     "127.0.0.1:9060",
	}
	c.Log = Log{Format: "text", Level: "info"}
	c.Store = Store{SnapshotInterval: memstore.DefaultSnapshotInterval, Retention: session.DefaultRetention, OnCorruptSnapshot: SnapshotFail,
		Backend: StoreMemory, Redis: RedisStore{KeyPrefix: redisstore.DefaultKeyPrefix, TouchDelay: redisstore.DefaultTouchDelay, LeaseTTL: quota.DefaultTTL,
			DegradedFor: quota.DefaultDegradedFor, HealthLeaseTTL: 5 * time.Second, RegistryResync: 5 * time.Second,
			AckDurability: string(redisstore.AckNone), AckReplicas: redisstore.DefaultAckReplicas, AckTimeout: redisstore.DefaultAckTimeout}}
	c.ExtProc = ExtProc{
		DestinationHeader:   wire.DestinationHeader,
		MetadataNamespace:   wire.LBNamespace,
		ServedHostKey:       wire.ServedHostKey,
		MessageTimeout:      wire.DefaultMessageTimeout,
		MaxRequestLifetime:  affinity.DefaultMaxRequestLifetime,
		BodyMode:            BodyModeNone,
		FirstMessageTimeout: 10 * time.Second,
	}
	c.NewSessions = NewSessions{ProvisionalIdleTimeout: 30 * time.Second, PerClientRate: 2, PerClientBurst: 20,
		TrustedNetworks: []string{"127.0.0.0/8", "::1/128"}, PerClientMaxSessions: 40, PerServiceShare: 0.25, WideBucketFactor: 4}
	c.API = API{StoreTimeout: DefaultAPIStoreTimeout}
	c.Envoy = Envoy{ListenerAddress: "0.0.0.0:10000", AdminAddress: "127.0.0.1:9901", ReplicaMode: ReplicasActiveActive}
	c.Discovery = defaultDiscovery()
	c.Autoscaling.setDefaults()
	c.Runtime = Runtime{GCHeapFloorMiB: DefaultGCHeapFloorMiB}
	c.Shutdown = Shutdown{DrainTimeout: DefaultDrainTimeout}
}

// Registry configures what the registry accepts from every layer: the config file's
// instances, the admin API's registrations, discovery sources and the registrations replicas
// share in Redis.
type Registry struct {
	// AllowedNetworks are the CIDR prefixes instance addresses must be in; empty allows every
	// address except loopback and link-local ones. Loopback and link-local addresses need a
	// prefix inside their range (127.0.0.1/32, ::1/128, fe80::/64 …). Whatever is listed, cloud
	// metadata addresses, multicast, broadcast, unspecified addresses, the generated bootstrap's
	// Envoy admin port and tether's own listener ports are refused (registry.AddressPolicy).
	AllowedNetworks []string `yaml:"allowedNetworks"`
}

// AddressPolicy returns the registry's address policy of this config: registry.allowedNetworks,
// with the ports of envoy.adminAddress, listeners.* and envoy.replicas[] reserved (a listener
// on port 0 reserves nothing here; serve adds the bound port).
func (c *Config) AddressPolicy(bound ...registry.ReservedPort) *registry.AddressPolicy {
	var allowed []netip.Prefix
	for _, n := range c.RegistryOptions.AllowedNetworks {
		if p, err := netip.ParsePrefix(n); err == nil {
			allowed = append(allowed, p)
		}
	}
	ls := map[string]string{
		"envoy.adminAddress": c.Envoy.AdminAddress,
		"listeners.extProc":  c.Listeners.ExtProc,
		"listeners.xds":      c.Listeners.XDS,
		"listeners.api":      c.Listeners.API,
		"listeners.sip":      c.Listeners.SIP,
	}
	for i, r := range c.Envoy.Replicas {
		ls[fmt.Sprintf("envoy.replicas[%d].xds", i)] = r.XDS
		ls[fmt.Sprintf("envoy.replicas[%d].extProc", i)] = r.ExtProc
	}
	return registry.NewAddressPolicy(allowed, append(registry.ReservedPorts(ls), bound...))
}

// DefaultGCHeapFloorMiB is runtime.gcHeapFloorMiB's default.
const DefaultGCHeapFloorMiB = 32

// Runtime are the Go runtime settings of tether serve, read at start (a change needs a restart).
type Runtime struct {
	// GCHeapFloorMiB is a floor, in MiB, under the garbage collector's heap goal (pkg/gcfloor):
	// while the live heap is small, GC runs once per about this much allocation instead of
	// once per live-heap-size, at the cost of up to this much more heap. 0 keeps Go's default
	// pacing. The GOGC environment variable, when set, overrides it (tether then leaves the
	// GC percentage to Go); GOMEMLIMIT still caps the heap under the floor.
	GCHeapFloorMiB int `yaml:"gcHeapFloorMiB"`
}

func (t *Token) setDefaults() { t.Access = AccessRead }

func (s *Service) setDefaults() {
	*s = Service{
		Match:                   Match{PathPrefix: "/"},
		Affinity:                registry.AffinityNone,
		SessionsPerInstance:     20,
		RequestSlotsPerInstance: 200,
		StreamsPerInstance:      100,
		SessionTTL:              6 * time.Hour,
		IdleTimeout:             30 * time.Minute,
		Cookie:                  Cookie{Name: "tether-session", Path: "/", HTTPOnly: true, SameSite: "Lax", Lifetime: CookiePermanent},
		HeaderField:             "x-tether-session",
		SSE:                     SSE{Path: "/sse", SessionParam: "sessionId"},
		MCPHandle:               MCPHandle{LearnHeader: "Mcp-Handle", PrefixSeparator: ":"},
		Upstream:                Upstream{Protocol: ProtocolHTTP1, ConnectTimeout: 2 * time.Second},
		Calls:                   Calls{TTL: 2 * time.Hour, SetupTTL: 5 * time.Minute},
		HealthCheck: HealthCheck{
			Path:               "/healthz",
			Timeout:            time.Second,
			HealthyThreshold:   2,
			UnhealthyThreshold: 3,
		},
		Discovery: defaultServiceDiscovery(),
	}
}

func (i *Instance) setDefaults() { *i = Instance{Weight: 1, State: registry.StateActive} }

// Load reads and parses the config file at path. See Parse.
func Load(path string) (*Config, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read config: %w", err)
	}
	return Parse(data, path)
}

var yamlLineErr = regexp.MustCompile(`^yaml: line (\d+): (.*)$`)

// notUTF8 reports whether data is not UTF-8 text, and the line of the first offending byte:
// a UTF-16 or UTF-32 byte-order mark (line 1), or an invalid sequence.
func notUTF8(data []byte) (int, bool) {
	for _, bom := range [][]byte{{0xfe, 0xff}, {0xff, 0xfe}, {0, 0, 0xfe, 0xff}} {
		if bytes.HasPrefix(data, bom) {
			return 1, true
		}
	}
	if utf8.Valid(data) {
		return 0, false
	}
	for i := 0; i < len(data); {
		r, n := utf8.DecodeRune(data[i:])
		if r == utf8.RuneError && n <= 1 {
			return bytes.Count(data[:i], []byte("\n")) + 1, true
		}
		i += n
	}
	return 1, true
}

// Parse decodes, defaults and validates one YAML document. filename is used in error messages
// and as the base for relative paths (its directory); files the config names (dcrFile,
// tokenFile) must exist. On failure the error is an Errors value listing every problem, one
// per line, as "file:line: field.path: message". The file must be UTF-8 (a UTF-16 or UTF-32
// file, which YAML would read, is refused: its line numbers would not be the file's lines).
func Parse(data []byte, filename string) (*Config, error) {
	errs := newErrList(filename)
	if line, bad := notUTF8(data); bad {
		errs.add(line, "", "a config file must be UTF-8 text (found a UTF-16/32 byte-order mark or a byte sequence that is not UTF-8)")
		return nil, errs.result()
	}
	var doc yaml.Node
	dec := yaml.NewDecoder(bytes.NewReader(data))
	if err := dec.Decode(&doc); err != nil && !errors.Is(err, io.EOF) {
		if m := yamlLineErr.FindStringSubmatch(err.Error()); m != nil {
			line, _ := strconv.Atoi(m[1])
			errs.add(line, "", "%s", m[2])
		} else {
			errs.add(0, "", "%s", strings.TrimPrefix(err.Error(), "yaml: "))
		}
		return nil, errs.result()
	}
	var extra yaml.Node
	if err := dec.Decode(&extra); err == nil {
		errs.add(extra.Line, "", "a config file holds one YAML document; found another")
	}
	cfg := &Config{File: filename}
	cfg.setDefaults()
	d := &decoder{errs: errs, lines: map[string]int{}}
	if doc.Kind == yaml.DocumentNode && len(doc.Content) == 1 {
		if root := resolve(doc.Content[0]); root.Kind != yaml.MappingNode && !isNull(root) {
			errs.add(root.Line, "", "a config file must be a YAML mapping, got %s", describe(root))
			return nil, errs.result()
		}
		d.decode("", doc.Content[0], cfg)
	}
	v := &validator{cfg: cfg, lines: d.lines, errs: errs}
	v.validate()
	if err := errs.result(); err != nil {
		return nil, err
	}
	return cfg, nil
}
