// Package redisstore is the session.Store that replicas share, on Redis (≥ 7) or Valkey: exact
// per-instance slot counts (session.SlotStore), a client-side cache with invalidations, batched
// touches and end notifications over pub/sub.
package redisstore

import (
	"cmp"
	"context"
	"crypto/rand"
	"crypto/tls"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/rueidis"

	"github.com/tether-dev/tether/pkg/rediserr"
	"github.com/tether-dev/tether/pkg/session"
)

// Defaults of the Store options.
const (
	DefaultKeyPrefix   = "tether:"
	DefaultTouchDelay  = time.Second
	DefaultCacheTTL    = time.Minute
	DefaultDialTimeout = 5 * time.Second
	// DefaultOpTimeout bounds one store call (a request never waits longer for Redis).
	DefaultOpTimeout = 2 * time.Second
	// maxKnown bounds the sessions a Store remembers for routing while Redis is down.
	maxKnown = 1 << 20
	// redisReapBatch bounds the records one reaper step reads.
	redisReapBatch = 512
	// casAttempts bounds how often a write retries after losing a race on one session.
	casAttempts = 16
)

// Config says how to reach Redis (≥ 7) or Valkey.
type Config struct {
	// Addrs are host:port addresses: one server, the seed nodes of a Cluster (detected by
	// the client), or the Sentinels when MasterSet is set.
	Addrs []string
	// MasterSet names the Sentinel master set; "" means no Sentinel.
	MasterSet string
	// Username and Password authenticate (ACL user; "" user means "default").
	Username, Password string
	// SentinelUsername and SentinelPassword authenticate to the Sentinels.
	SentinelUsername, SentinelPassword string
	// DB selects the database (standalone and Sentinel only; a Cluster has only 0).
	DB int
	// TLS, when non-nil, is used for every connection.
	TLS *tls.Config
	// KeyPrefix starts every key (default DefaultKeyPrefix), so several tether fleets
	// can share one Redis.
	KeyPrefix string
	// DialTimeout bounds connecting (default DefaultDialTimeout).
	DialTimeout time.Duration
	// ClientName names the connections in CLIENT LIST (default DefaultClientName: a replica).
	ClientName string
}

// DefaultClientName is the CLIENT SETNAME of a replica's connections.
const DefaultClientName = "tether"

// Store is the session.Store shared by several tether replicas over Redis or Valkey (the Redis
// protocol, RESP3, with github.com/redis/rueidis: server-assisted client-side caching and
// auto-pipelining).
//
// # Keys
//
// Every key of a service carries the hash tag {service} (after KeyPrefix), so everything one
// change touches lives in one Cluster slot and one script runs atomically on one node:
//
//	P{svc}:s:<id>      hash: the session record (version v, instance, kind, status, times, attributes)
//	P{svc}:exp         zset: id → when the reaper must look at it (ms): ExpiresAt, or Ended+retention
//	P{svc}:ids         zset (score 0): every retained id, for List in id order
//	P{svc}:i:<inst>    zset (score 0): ids of stored-Active sessions bound to the instance
//	P{svc}:n           hash: instance → slot-holding stored-Active sessions (SlotStore)
//	Pservices          zset (score 0): service names (no hash tag: List and the reaper walk it)
//	Preaper            string: the reaper lease (one replica reaps at a time)
//	Pends              pub/sub channel: end notifications to every replica
//
// # Redis Cluster
//
// The client detects a Cluster from the addresses (Config.Addrs: any nodes) and follows its
// slots; nothing is configured. What the layout gives there, measured on three primaries on
// loopback (internal/replicatest TestClusterLayout): a service is one slot, so one service's
// sessions all live on one primary (60 of 60 on one, 0 on the others) and only several
// services spread (12 services: 100/100/40 records); one service's new-session rate is one
// primary's, and one primary's failover is the failover of its services (new sessions of
// theirs get 503 StoreUnavailable until it is over; known sessions keep routing from the
// replica cache). The keys without a hash tag (Pservices, Preaper) are single-key commands
// on whatever node holds them: a service's first write does not wait for Pservices' node
// (registerService), and the reaper pauses while Preaper's node is down. Pends is classic
// pub/sub, which a Cluster broadcasts to every node. Client-side caching tracks each node's connection: a connection lost on any node
// stops vouching for every cached record (the epoch moves on), as on one server. The clock
// (clock.go) is sampled from any one node: a Cluster's nodes must keep their clocks in step
// (NTP), since each script reads its own node's TIME. Acknowledged writes wait on their key's
// primary (ackClient, durability.go), and New checks ackDurability on every primary.
//
// A layout that spreads one service over the nodes — per-instance shards {svc|inst} holding an
// instance's count, reservations and its sessions' records (the cap check atomic in one shard),
// with an id → shard pointer under a per-id tag claimed first with SET NX — is designed but
// not built; examples/replicas/README.md ("Redis Cluster") gives the design, its crash points
// and its cost.
//
// # Consistency
//
// Every change is one Lua script that checks the record's version and writes the record, its
// indexes and its slot count together (compare-and-set; a lost race re-reads and retries), so
// changes are atomic and linearizable on the primary. Expiry is on Redis's clock (clock.go):
// the scripts read TIME and re-check every expiry they act on; a replica's wall clock matters
// only for its local timers, and a replica whose clock is off shifts no expiry.
//
// Get reads through the client-side cache and keeps what it read in the replica cache
// (redis_cache.go): a session that does not change costs no Redis command and no lock, and
// Redis invalidates every replica's copy when it changes (RESP3 tracking). A replica may
// therefore route on a binding changed by another replica up to one invalidation message
// (about one network round trip) late; its own changes it sees at once. When a connection
// breaks, nothing read before is trusted again without a read. Touches are batched (see
// TouchDelay): a session's touches cost one flush per TouchDelay, whatever its request rate.
//
// # Durability
//
// Persistence is Redis's: appendonly yes with appendfsync always loses no acknowledged write on
// a crash; everysec loses up to about one second of them — on a machine crash, and also on a
// redis-server kill -9 while the disk is busy (Redis postpones its AOF writes then);
// appendonly no (RDB snapshots only) loses everything since the last snapshot. Replication to
// replicas (and so a Sentinel failover) is asynchronous: a failover loses what the old primary
// had not yet sent. WithDurability makes creates, updates and moves wait for the AOF or for
// replicas before they are acknowledged (durability.go).
//
// A Store is safe for concurrent use. Run drives the touch flusher, the reaper and the end
// notification subscriber; Close releases the connections.
type Store struct {
	c      rueidis.Client
	prefix string
	origin string // this handle's id, to tell its own end notifications from others'

	clock func() time.Time // the replica's clock (callers' times); see clock.go
	redisClock
	log          *slog.Logger
	retention    time.Duration
	reapInterval time.Duration
	touchDelay   time.Duration
	cacheTTL     time.Duration
	opTimeout    time.Duration
	rsvTTL       time.Duration
	onEnd        atomic.Pointer[func(session.EndEvent)]
	dur          Durability // what acknowledged writes wait for (durability.go)
	durSt        durState

	services sync.Map // service name → struct{}: already in Pservices
	// pendingServices: service name → struct{}: not yet in Pservices (its node was
	// unreachable at the service's first write; Run records it).
	pendingServices sync.Map
	rsvs            sync.Map // reservation member → Reservation: held by this handle (Run renews them)

	// entries is the replica cache (redis_cache.go): hotKey → *cacheEntry, at most maxKnown.
	entries  sync.Map
	nEntries atomic.Int64
	// epoch moves on whenever a connection's tracking is lost: every cached record read
	// before then stops being vouched for. It starts at 1 (0 marks a record not vouched for).
	epoch atomic.Uint64

	touchMu  sync.Mutex
	dirty    []*cacheEntry    // entries with a touch not yet flushed
	goneNew  []*cacheEntry    // entries forgotten since the last sweepGone
	goneOld  []*cacheEntry    // entries forgotten before it: dropped at the next
	touches  map[hotKey]int64 // touches of sessions the cache had no room for, Unix ns
	overflow atomic.Bool      // touches is not empty

	running    atomic.Bool
	subscribed chan struct{}
	subOnce    sync.Once
	// up is false while the last call that needed Redis failed (metrics and logs say so).
	up atomic.Bool
	// unavailable counts calls that failed to reach Redis.
	unavailable atomic.Int64
}

var _ session.Store = (*Store)(nil)

// Option configures a Store.
type Option func(*Store)

// WithClock sets the replica's clock (default time.Now): the times callers pass in (Touch, End,
// a new session's Created and LastSeen) are read on it and translated into Redis's clock, which
// decides every expiry (clock.go). A clock off by a constant amount changes nothing.
func WithClock(now func() time.Time) Option {
	return func(r *Store) {
		if now != nil {
			r.clock = now
		}
	}
}

// WithLogger sets the logger (default: discard).
func WithLogger(l *slog.Logger) Option {
	return func(r *Store) {
		if l != nil {
			r.log = l
		}
	}
}

// WithRetention sets how long ended records stay readable (default DefaultRetention).
func WithRetention(d time.Duration) Option {
	return func(r *Store) {
		if d > 0 {
			r.retention = d
		}
	}
}

// WithReapInterval sets how often Run ends lapsed sessions (default DefaultReapInterval).
func WithReapInterval(d time.Duration) Option {
	return func(r *Store) {
		if d > 0 {
			r.reapInterval = d
		}
	}
}

// WithTouchDelay sets how long touches are batched before they are written (default
// DefaultTouchDelay). It is the error bound of idle expiry (see Store.Touch).
func WithTouchDelay(d time.Duration) Option {
	return func(r *Store) {
		if d > 0 {
			r.touchDelay = d
		}
	}
}

// WithCacheTTL bounds how long a client-side cached record is used without Redis
// confirming it (default DefaultCacheTTL); invalidation normally comes much sooner.
func WithCacheTTL(d time.Duration) Option {
	return func(r *Store) {
		if d > 0 {
			r.cacheTTL = d
		}
	}
}

// WithOpTimeout bounds each store call (default DefaultOpTimeout); tether serve gives it the
// request path's bound. A call whose ctx carries its own bound (session.WithCallTimeout) has
// that one instead.
func WithOpTimeout(d time.Duration) Option {
	return func(r *Store) {
		if d > 0 {
			r.opTimeout = d
		}
	}
}

// New connects to Redis. It fails if no address answers within the dial timeout.
func New(cfg Config, opts ...Option) (*Store, error) {
	if len(cfg.Addrs) == 0 {
		return nil, fmt.Errorf("redis store: no address")
	}
	prefix := cfg.KeyPrefix
	if prefix == "" {
		prefix = DefaultKeyPrefix
	}
	if strings.ContainsAny(prefix, "{}") {
		return nil, fmt.Errorf("redis store: key prefix %q must not contain '{' or '}'", prefix)
	}
	dial := cfg.DialTimeout
	if dial <= 0 {
		dial = DefaultDialTimeout
	}
	origin := make([]byte, 8)
	if _, err := rand.Read(origin); err != nil {
		return nil, fmt.Errorf("redis store: %w", err)
	}
	opt := rueidis.ClientOption{
		InitAddress: cfg.Addrs,
		Username:    cfg.Username,
		Password:    cfg.Password,
		SelectDB:    cfg.DB,
		TLSConfig:   cfg.TLS,
		ClientName:  cmp.Or(cfg.ClientName, DefaultClientName),
		Dialer:      netDialer(dial),
		// Keep auto-pipelining; block writes of a dead connection quickly.
		ConnWriteTimeout: dial,
	}
	if cfg.MasterSet != "" {
		opt.Sentinel = rueidis.SentinelOption{
			MasterSet: cfg.MasterSet,
			Username:  cfg.SentinelUsername,
			Password:  cfg.SentinelPassword,
			TLSConfig: cfg.TLS,
			Dialer:    netDialer(dial),
		}
	}
	r := &Store{
		prefix:       prefix,
		origin:       hex.EncodeToString(origin),
		clock:        time.Now,
		log:          slog.New(slog.DiscardHandler),
		retention:    session.DefaultRetention,
		reapInterval: session.DefaultReapInterval,
		touchDelay:   DefaultTouchDelay,
		cacheTTL:     DefaultCacheTTL,
		opTimeout:    DefaultOpTimeout,
		rsvTTL:       DefaultReservationTTL,
		touches:      map[hotKey]int64{},
		subscribed:   make(chan struct{}),
		dur:          Durability{Mode: AckNone},
	}
	r.epoch.Store(1)
	// The replica cache learns of changes from the client's invalidations.
	opt.OnInvalidations = r.onInvalidations
	c, err := rueidis.NewClient(opt)
	if err != nil {
		return nil, fmt.Errorf("redis store: connecting to %s: %w", strings.Join(cfg.Addrs, ","), err)
	}
	r.c = &boundedClient{Client: c} // every call with a deadline returns by it (see boundedClient)
	r.up.Store(true)
	for _, o := range opts {
		o(r)
	}
	sctx, cancel := context.WithTimeout(context.Background(), dial)
	defer cancel()
	if err := r.checkDurability(sctx); err != nil {
		c.Close()
		return nil, fmt.Errorf("redis store: %w", err)
	}
	if err := r.syncClock(sctx); err != nil {
		// Run samples again; until then nothing can be written either.
		r.log.Warn("redis store: could not read Redis's clock at start", "err", err)
	}
	return r, nil
}

// Close releases the connections. Pending touches not yet flushed are lost (Run flushes them
// when its ctx ends).
func (r *Store) Close() { r.c.Close() }

// Client returns the underlying client (for the shared quota, which keeps its leases in the
// same Redis).
func (r *Store) Client() rueidis.Client { return r.c }

// KeyPrefix returns the prefix every key starts with.
func (r *Store) KeyPrefix() string { return r.prefix }

// Up reports whether the last operation that needed Redis reached it.
func (r *Store) Up() bool { return r.up.Load() }

// UnavailableCount returns how many operations failed to reach Redis since the start.
func (r *Store) UnavailableCount() int64 { return r.unavailable.Load() }

// TouchDelay implements session.Store.
func (r *Store) TouchDelay() time.Duration { return r.touchDelay }

// SetEndHandler implements session.Store.
func (r *Store) SetEndHandler(fn func(session.EndEvent)) {
	if fn == nil {
		r.onEnd.Store(nil)
		return
	}
	r.onEnd.Store(&fn)
}

// ---- keys ----

// tag returns the hash-tagged key stem of a service: P{svc}. A service name holding a brace
// would end the tag early, so such names are hex-encoded (config names never have braces).
func (r *Store) tag(service string) string {
	if strings.ContainsAny(service, "{}") {
		service = "x" + hex.EncodeToString([]byte(service))
	}
	return r.prefix + "{" + service + "}"
}

func (r *Store) keySession(service, id string) string { return r.tag(service) + ":s:" + id }
func (r *Store) keyExp(service string) string         { return r.tag(service) + ":exp" }
func (r *Store) keyIDs(service string) string         { return r.tag(service) + ":ids" }
func (r *Store) keyCounts(service string) string      { return r.tag(service) + ":n" }
func (r *Store) keyInstance(service, inst string) string {
	return r.tag(service) + ":i:" + inst
}
func (r *Store) keyServices() string { return r.prefix + "services" }
func (r *Store) keyReaper() string   { return r.prefix + "reaper" }
func (r *Store) channelEnds() string { return r.prefix + "ends" }

// ---- the record codec ----

// stored is a record as read from Redis: the session plus its version ("" = absent).
type stored struct {
	s session.Session
	v string
}

func (x stored) present() bool { return x.v != "" }

func encodeFields(s session.Session, v int64) []string {
	f := []string{
		"v", strconv.FormatInt(v, 10),
		"inst", s.Instance,
		"kind", string(s.Kind),
		"st", string(s.Status),
		"cr", strconv.FormatInt(s.Created.UnixNano(), 10),
		"mod", strconv.FormatInt(s.LastModified.UnixNano(), 10),
		"seen", strconv.FormatInt(s.LastSeen.UnixNano(), 10),
		"ttl", strconv.FormatInt(int64(s.TTL), 10),
		"idle", strconv.FormatInt(int64(s.IdleTimeout), 10),
		"dr", boolStr(s.DisableReuse),
	}
	if !s.Ended.IsZero() {
		f = append(f, "end", strconv.FormatInt(s.Ended.UnixNano(), 10))
	}
	if len(s.Attributes) > 0 {
		b, _ := json.Marshal(s.Attributes) // a map[string]string always marshals
		f = append(f, "at", string(b))
	}
	return f
}

func boolStr(b bool) string {
	if b {
		return "1"
	}
	return "0"
}

// decodeRecord parses an HGETALL reply. An empty map is an absent record.
func decodeRecord(service, id string, m map[string]string) (stored, error) {
	if len(m) == 0 || m["v"] == "" {
		return stored{}, nil
	}
	num := func(k string) (int64, error) {
		if m[k] == "" {
			return 0, nil
		}
		return strconv.ParseInt(m[k], 10, 64)
	}
	var errs []error
	get := func(k string) int64 {
		n, err := num(k)
		errs = append(errs, err)
		return n
	}
	s := session.Session{
		ID:           id,
		Service:      service,
		Instance:     m["inst"],
		Kind:         session.Kind(m["kind"]),
		Status:       session.Status(m["st"]),
		Created:      nanos(get("cr")),
		LastModified: nanos(get("mod")),
		LastSeen:     nanos(get("seen")),
		TTL:          time.Duration(get("ttl")),
		IdleTimeout:  time.Duration(get("idle")),
		DisableReuse: m["dr"] == "1",
	}
	if e := get("end"); e != 0 {
		s.Ended = nanos(e)
	}
	if at := m["at"]; at != "" {
		if err := json.Unmarshal([]byte(at), &s.Attributes); err != nil {
			errs = append(errs, err)
		}
	}
	if err := errors.Join(errs...); err != nil {
		return stored{}, fmt.Errorf("session %s/%s: malformed record in Redis: %w", service, id, err)
	}
	return stored{s: s, v: m["v"]}, nil
}

// view returns the session as Get reports it at now (a lapsed Active record as Expired).
func view(s session.Session, now time.Time) session.Session {
	if s.Status == session.StatusActive && !now.Before(s.ExpiresAt()) {
		s.Status, s.Ended = session.StatusExpired, s.ExpiresAt()
	}
	return s
}

func (r *Store) retainedView(v session.Session, now time.Time) bool {
	return v.Status == session.StatusActive || now.Before(v.Ended.Add(r.retention))
}

// ms is the index score of a time: milliseconds, rounded down, so an index is never late.
func ms(t time.Time) string { return strconv.FormatInt(t.UnixMilli(), 10) }

// reapAt is when the reaper must look at a record next.
func (r *Store) reapAt(s session.Session) time.Time {
	if s.Status == session.StatusActive {
		return s.ExpiresAt()
	}
	return s.Ended.Add(r.retention)
}

// check wraps a client error that is not a Redis reply (a connection failure), and a Redis
// reply that means "try again later" (rediserr.Transient), as ErrStoreUnavailable and records
// it; other Redis error replies and nil pass through.
func (r *Store) check(err error) error {
	if err == nil {
		r.markUp()
		return nil
	}
	if rueidis.IsRedisNil(err) {
		r.markUp()
		return err
	}
	if rediserr.Transient(err) {
		// LOADING, BUSY, MASTERDOWN, READONLY, TRYAGAIN, CLUSTERDOWN, NOREPLICAS: Redis
		// answers, but not now (it loads its AOF, a script runs long, a failover is under way).
		r.unavailable.Add(1)
		return fmt.Errorf("%w: %w", session.ErrStoreUnavailable, err)
	}
	if _, ok := rueidis.IsRedisErr(err); ok {
		r.markUp()
		return err
	}
	// A cancelled call is the caller's business. A network error (refused, reset, a dial
	// that timed out: net reports those as context.DeadlineExceeded too) means Redis is
	// unreachable. A call that ran out of time otherwise means Redis did not answer in time:
	// unavailable for this call (the caller may retry), but one slow answer does not mark the
	// store down.
	if errors.Is(err, context.Canceled) {
		return err
	}
	if op := (*net.OpError)(nil); !errors.As(err, &op) && errors.Is(err, context.DeadlineExceeded) {
		r.unavailable.Add(1)
		return fmt.Errorf("%w: %w", session.ErrStoreUnavailable, err)
	}
	r.unavailable.Add(1)
	if r.up.CompareAndSwap(true, false) {
		r.log.Error("redis store: Redis unreachable; known sessions keep routing from the local cache, new sessions fail", "err", err)
	}
	return fmt.Errorf("%w: %w", session.ErrStoreUnavailable, err)
}

// bound limits one store call to the operation timeout, so that no request waits long for a
// Redis that does not answer — or to the caller's own bound when its ctx carries one
// (session.WithCallTimeout: the SessionAPI's, longer than a request's).
func (r *Store) bound(ctx context.Context) (context.Context, context.CancelFunc) {
	d := r.opTimeout
	if own, ok := session.CallTimeout(ctx); ok {
		d = own
	}
	return context.WithTimeout(ctx, d)
}

// probe pings Redis while it is reported down, so that up comes back by itself.
func (r *Store) probe(ctx context.Context) {
	if r.up.Load() {
		return
	}
	pctx, cancel := context.WithTimeout(ctx, r.opTimeout)
	defer cancel()
	_ = r.check(r.c.Do(pctx, r.c.B().Ping().Build()).Error())
}

func (r *Store) markUp() {
	if !r.up.Load() && r.up.CompareAndSwap(false, true) {
		r.log.Info("redis store: Redis reachable again")
	}
}
