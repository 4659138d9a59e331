// Package fleet shares the registry's admin layer among tether replicas through Redis: the
// instances registered through the admin API, the states set on instances (drain, standby,
// activate) and the health verdicts, so that a change made through any replica reaches every
// replica and survives config reloads and restarts. It is used with store.backend redis, on
// the same Redis (and key prefix) as the session store.
//
// # Keys
//
// Everything lives under one Cluster hash tag, so every script touches one slot:
//
//	P{registry}:admin   hash: one field per fact, "<kind>\x1f<service>\x1f<instance id>" →
//	                    kind i: the registration (JSON), s: the state override (JSON), h: the
//	                    health verdict ("healthy" or "unhealthy")
//	P{registry}:ver     string: the layer's version, incremented by every change
//	P{registry}:epoch   string: a random id set when the keys are first made; a new epoch (Redis
//	                    lost its data) makes every replica take the layer as it now is
//	Pregistry:changes   pub/sub channel: "<epoch>:<version>" after every change
//
// # Consistency
//
// Every change is one Lua script that writes the fact, increments the version and publishes it,
// atomically. Conflicts resolve by last writer wins in Redis's order of those scripts: the
// version counter is that order. Two registrations of the same key race in the script, and the
// second gets ErrExists; a drain on one replica and an activate on another leave whichever
// script ran last. A replica applies a layer only if it is newer (a higher version of the same
// epoch) than the one it has, so what it serves never goes back in time.
//
// Each replica reads the whole layer (one script: epoch, version and every field, atomically)
// when it starts (Load, before it serves), after each change it makes itself (so the admin API
// answers with the change applied), when a change message arrives, and when a periodic check
// of the version (every resync interval) finds it moved: a missed message (a replica that was
// not subscribed) heals within one interval. The layer feeds the registry's admin layer
// (registry.ApplyAdmin), which config reloads do not touch.
//
// # Time to reach every replica
//
// A change reaches the other replicas one pub/sub message plus one read later (a few round
// trips); if the message is missed, within the resync interval (default DefaultResync).
//
// # Faults
//
// Redis unreachable: the replica keeps the last layer it read, and says so (the "api" source in
// /v1/status and the tether_source_* metrics: failing, with the error; one log line when it
// starts and one when it ends). Admin changes made through it fail with registry.ErrUnavailable
// (503): nothing is changed anywhere. Recovery is automatic: the periodic check reads the layer
// again as soon as Redis answers. If Redis lost its data (a new epoch), every replica takes the
// layer as Redis now has it: Redis is the layer's only home.
package fleet

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/rueidis"

	"github.com/tether-dev/tether/pkg/redissub"
	"github.com/tether-dev/tether/pkg/registry"
)

// Defaults of the options.
const (
	// DefaultResync is how often the layer's version is checked (and the layer read again if
	// it moved): the bound on how late a replica that missed a change message sees it.
	DefaultResync = 5 * time.Second
	// DefaultOpTimeout bounds one Redis call.
	DefaultOpTimeout = 2 * time.Second
	// DefaultMaxEntries bounds the facts the layer holds (registrations, states, verdicts).
	DefaultMaxEntries = 100_000
)

// ErrFull reports that the shared layer holds DefaultMaxEntries (or WithMaxEntries) facts.
var ErrFull = errors.New("shared registry is full")

// Registry keeps one replica's registry admin layer in step with the shared one in Redis. It
// implements registry.AdminStore. Create it with New, call Load before the replica serves,
// then Run. Its methods are safe for concurrent use.
type Registry struct {
	c          rueidis.Client
	reg        *registry.Registry
	log        *slog.Logger
	resync     time.Duration
	opTimeout  time.Duration
	maxEntries int

	keys    []string // admin, ver, epoch
	channel string

	loadMu  sync.Mutex // serializes reads of the layer and their delivery to reg
	epoch   string     // guarded by loadMu: the epoch and version last delivered
	version int64

	kick       chan struct{}
	subscribed chan struct{}
	subOnce    sync.Once
	up         atomic.Bool
	running    atomic.Bool
}

var _ registry.AdminStore = (*Registry)(nil)

// Option configures a Registry.
type Option func(*Registry)

// WithLogger sets the logger (default: discard).
func WithLogger(l *slog.Logger) Option {
	return func(f *Registry) {
		if l != nil {
			f.log = l
		}
	}
}

// WithResync sets how often the shared version is checked (default DefaultResync).
func WithResync(d time.Duration) Option {
	return func(f *Registry) {
		if d > 0 {
			f.resync = d
		}
	}
}

// WithOpTimeout bounds each Redis call (default DefaultOpTimeout).
func WithOpTimeout(d time.Duration) Option {
	return func(f *Registry) {
		if d > 0 {
			f.opTimeout = d
		}
	}
}

// WithMaxEntries bounds the facts the shared layer may hold (default DefaultMaxEntries).
func WithMaxEntries(n int) Option {
	return func(f *Registry) {
		if n > 0 {
			f.maxEntries = n
		}
	}
}

// New returns a Registry that shares reg's admin layer through c under keyPrefix (the session
// store's prefix: fleets sharing one Redis use different prefixes). It makes the shared layer
// the home of reg's admin writes (registry.ShareAdmin); call Load before serving.
func New(c rueidis.Client, keyPrefix string, reg *registry.Registry, opts ...Option) (*Registry, error) {
	if strings.ContainsAny(keyPrefix, "{}") {
		return nil, fmt.Errorf("fleet: key prefix %q must not contain '{' or '}'", keyPrefix)
	}
	tag := keyPrefix + "{registry}"
	f := &Registry{
		c:          c,
		reg:        reg,
		log:        slog.New(slog.DiscardHandler),
		resync:     DefaultResync,
		opTimeout:  DefaultOpTimeout,
		maxEntries: DefaultMaxEntries,
		keys:       []string{tag + ":admin", tag + ":ver", tag + ":epoch"},
		channel:    keyPrefix + "registry:changes",
		kick:       make(chan struct{}, 1),
		subscribed: make(chan struct{}),
	}
	f.up.Store(true)
	for _, o := range opts {
		o(f)
	}
	reg.ShareAdmin(f)
	return f, nil
}

// Up reports whether the last Redis call reached Redis.
func (f *Registry) Up() bool { return f.up.Load() }

// Version returns the epoch and version of the layer last delivered to the registry.
func (f *Registry) Version() (epoch string, version int64) {
	f.loadMu.Lock()
	defer f.loadMu.Unlock()
	return f.epoch, f.version
}

// Subscribed is closed once Run's first subscription to change messages stands.
func (f *Registry) Subscribed() <-chan struct{} { return f.subscribed }

// Load reads the shared layer and delivers it to the registry. Call it once before the
// replica serves: a replica that starts (or restarts) serves the fleet's admin layer from its
// first request.
func (f *Registry) Load(ctx context.Context) error {
	return f.load(ctx)
}

// Run keeps the layer in step until ctx ends (change messages, the periodic check, recovery
// after Redis was unreachable) and returns nil. Only one Run may be active at a time.
func (f *Registry) Run(ctx context.Context) error {
	if !f.running.CompareAndSwap(false, true) {
		return errors.New("fleet: Run is already running")
	}
	defer f.running.Store(false)
	var wg sync.WaitGroup
	defer wg.Wait()
	wg.Go(func() { f.subscribe(ctx) })
	tick := time.NewTicker(f.resync)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
			if err := f.check(ctx); err != nil && ctx.Err() == nil {
				f.log.Debug("shared registry: check failed", "err", err)
			}
		case <-f.kick:
			if err := f.load(ctx); err != nil && ctx.Err() == nil {
				f.log.Debug("shared registry: read failed", "err", err)
			}
		}
	}
}

// newEpoch returns a fresh epoch id, for the scripts to set if the keys are new (a fresh one
// each time: the keys may be new again after Redis lost its data).
func newEpoch() string {
	b := make([]byte, 8)
	_, _ = rand.Read(b) // crypto/rand.Read never fails (Go ≥ 1.24)
	return hex.EncodeToString(b)
}

func (f *Registry) poke() {
	select {
	case f.kick <- struct{}{}:
	default:
	}
}

// ---- reading the layer ----

// epochLua opens every script: e is the layer's epoch (KEYS[3]), created from ARGV[1] when
// the keys are new.
const epochLua = `
local e = redis.call('GET', KEYS[3])
if not e then
  e = ARGV[1]
  redis.call('SET', KEYS[3], e)
end
`

// readScript returns {epoch, version, fields...} (fields as HGETALL, or none when ARGV[2] is
// "head"), creating the epoch if the keys are new.
//
//	KEYS: admin, ver, epoch   ARGV: the epoch to create, "all" | "head"
var readScript = rueidis.NewLuaScript(epochLua + `local v = redis.call('GET', KEYS[2]) or '0'
if ARGV[2] == 'head' then
  return {e, v}
end
return {e, v, redis.call('HGETALL', KEYS[1])}
`)

// check compares the shared epoch and version with the delivered ones and reads the layer
// if they differ.
func (f *Registry) check(ctx context.Context) error {
	_, epoch, version, err := f.read(ctx, "head")
	if err != nil {
		return err
	}
	f.loadMu.Lock()
	same := epoch == f.epoch && version == f.version
	f.loadMu.Unlock()
	if !same {
		return f.load(ctx)
	}
	f.markUp()
	f.reg.AdminSynced()
	return nil
}

// read runs readScript for part ("head": the epoch and version; "all": the layer too) and
// returns its reply with the epoch and version, or the error as fail classifies it.
func (f *Registry) read(ctx context.Context, part string) ([]rueidis.RedisMessage, string, int64, error) {
	cctx, cancel := context.WithTimeout(ctx, f.opTimeout)
	defer cancel()
	res, err := readScript.Exec(cctx, f.c, f.keys, []string{newEpoch(), part}).ToArray()
	if err := f.fail(ctx, err); err != nil {
		return nil, "", 0, err
	}
	epoch, version, err := head(res)
	if err != nil {
		return nil, "", 0, f.fail(ctx, err)
	}
	return res, epoch, version, nil
}

func head(res []rueidis.RedisMessage) (string, int64, error) {
	if len(res) < 2 {
		return "", 0, errors.New("fleet: short reply")
	}
	epoch, err := res[0].ToString()
	if err != nil {
		return "", 0, err
	}
	vs, err := res[1].ToString()
	if err != nil {
		return "", 0, err
	}
	v, err := strconv.ParseInt(vs, 10, 64)
	return epoch, v, err
}

// load reads the whole layer and delivers it if it is newer than the delivered one.
func (f *Registry) load(ctx context.Context) error {
	f.loadMu.Lock()
	defer f.loadMu.Unlock()
	res, epoch, version, err := f.read(ctx, "all")
	if err != nil {
		return err
	}
	if len(res) < 3 {
		return f.fail(ctx, errors.New("fleet: short reply"))
	}
	fields, err := res[2].AsStrMap()
	if err != nil {
		return f.fail(ctx, err)
	}
	f.markUp()
	if epoch == f.epoch && version <= f.version {
		f.reg.AdminSynced() // not newer: what this replica serves is current
		return nil
	}
	layer, bad := decodeLayer(fields)
	for _, b := range bad {
		f.log.Warn("shared registry: ignoring a malformed entry", "field", strconv.Quote(b.field), "err", b.err)
	}
	if f.epoch != "" && epoch != f.epoch {
		f.log.Warn("shared registry: Redis holds a new layer (its data was lost or replaced); taking it as it is",
			"entries", len(fields))
	}
	f.epoch, f.version = epoch, version
	f.reg.ApplyAdmin(layer)
	f.log.Debug("shared registry: layer applied", "version", version, "entries", len(fields))
	return nil
}

// fail classifies err: nil passes; a connection failure marks Redis down (the registry's
// admin layer says failing) and is returned wrapping registry.ErrUnavailable; a Redis error
// reply or a malformed reply is returned as is.
func (f *Registry) fail(ctx context.Context, err error) error {
	if err == nil {
		return nil
	}
	if _, ok := rueidis.IsRedisErr(err); ok {
		f.reg.AdminFailed(err)
		return fmt.Errorf("fleet: %w", err)
	}
	if ctx.Err() != nil {
		return ctx.Err()
	}
	f.reg.AdminFailed(err)
	if f.up.CompareAndSwap(true, false) {
		f.log.Error("shared registry: Redis unreachable; keeping the last known admin layer (registrations, states, health)", "err", err)
	}
	return fmt.Errorf("%w: %w", registry.ErrUnavailable, err)
}

func (f *Registry) markUp() {
	if !f.up.Load() && f.up.CompareAndSwap(false, true) {
		f.log.Info("shared registry: Redis reachable again")
	}
}

// ---- change messages ----

// subscribe listens for change messages until ctx ends, reconnecting as needed. Every
// (re)subscription reads the layer again, for the changes made while it was not listening.
func (f *Registry) subscribe(ctx context.Context) {
	redissub.Follow(ctx, f.c, f.channel, redissub.Hooks{
		Message: f.onMessage,
		Subscribed: func() {
			f.poke()
			f.subOnce.Do(func() { close(f.subscribed) })
		},
		Failed: func(err error) { _ = f.fail(ctx, err) },
	})
}

func (f *Registry) onMessage(m rueidis.PubSubMessage) {
	epoch, vs, ok := strings.Cut(m.Message, ":")
	v, err := strconv.ParseInt(vs, 10, 64)
	if !ok || err != nil {
		f.log.Warn("shared registry: malformed change message", "message", strconv.Quote(m.Message))
		return
	}
	if !f.loadMu.TryLock() {
		f.poke() // a read is under way; read again after it
		return
	}
	newer := epoch != f.epoch || v > f.version
	f.loadMu.Unlock()
	if newer {
		f.poke()
	}
}

// ---- changes ----

// writeScript makes one change and, if anything changed, increments the version and publishes
// it. It returns {code, epoch, version}: 1 changed, 0 nothing to change, -1 the field exists
// (op add), -2 the field is missing (op delete), -3 the layer is full.
//
//	KEYS: admin, ver, epoch
//	ARGV: the epoch to create, channel, max entries, op (add | set | unset | delete), field,
//	      value (add, set), further fields to delete with it (delete)
var writeScript = rueidis.NewLuaScript(epochLua + `local op, field = ARGV[4], ARGV[5]
local function done(code)
  if code == 1 then
    local v = redis.call('INCR', KEYS[2])
    redis.call('PUBLISH', ARGV[2], e .. ':' .. v)
    return {1, e, tostring(v)}
  end
  return {code, e, redis.call('GET', KEYS[2]) or '0'}
end
local have = redis.call('HEXISTS', KEYS[1], field) == 1
if op == 'add' or op == 'set' then
  if op == 'add' and have then return done(-1) end
  if have and redis.call('HGET', KEYS[1], field) == ARGV[6] then return done(0) end
  if not have and redis.call('HLEN', KEYS[1]) >= tonumber(ARGV[3]) then return done(-3) end
  redis.call('HSET', KEYS[1], field, ARGV[6])
  return done(1)
end
if op == 'delete' and not have then return done(-2) end
local n = redis.call('HDEL', KEYS[1], field)
for i = 6, #ARGV do
  n = n + redis.call('HDEL', KEYS[1], ARGV[i])
end
if n > 0 then return done(1) end
return done(0)
`)

// write runs writeScript and, when it changed something, reads the layer so that this replica
// serves the change before the call returns.
func (f *Registry) write(ctx context.Context, op, field string, args ...string) (int64, error) {
	cctx, cancel := context.WithTimeout(ctx, f.opTimeout)
	defer cancel()
	argv := append([]string{newEpoch(), f.channel, strconv.Itoa(f.maxEntries), op, field}, args...)
	res, err := writeScript.Exec(cctx, f.c, f.keys, argv).ToArray()
	if err := f.fail(ctx, err); err != nil {
		return 0, err
	}
	if len(res) < 1 {
		return 0, errors.New("fleet: short reply")
	}
	code, err := res[0].AsInt64()
	if err != nil {
		return 0, err
	}
	f.markUp()
	if err := f.load(ctx); err != nil {
		// The change is made; this replica serves it at the next read (the message or the check).
		f.log.Warn("shared registry: change made, reading it back failed", "err", err)
	}
	return code, nil
}

// Register implements registry.AdminStore.
func (f *Registry) Register(ctx context.Context, in registry.Instance) error {
	b, err := json.Marshal(toWire(in))
	if err != nil {
		return err
	}
	code, err := f.write(ctx, "add", field(kindInstance, in.Key()), string(b))
	switch {
	case err != nil:
		return err
	case code == -1:
		return fmt.Errorf("instance %s/%s is registered already (through another replica): %w", in.Service, in.ID, registry.ErrExists)
	case code == -3:
		return fmt.Errorf("registering %s/%s: %w (%d entries)", in.Service, in.ID, ErrFull, f.maxEntries)
	}
	return nil
}

// Deregister implements registry.AdminStore.
func (f *Registry) Deregister(ctx context.Context, k registry.Key) error {
	code, err := f.write(ctx, "delete", field(kindInstance, k), field(kindState, k), field(kindHealth, k))
	switch {
	case err != nil:
		return err
	case code == -2:
		return fmt.Errorf("instance %s/%s is not registered through the admin API: %w", k.Service, k.ID, registry.ErrUnknownInstance)
	}
	return nil
}

// SetState implements registry.AdminStore.
func (f *Registry) SetState(ctx context.Context, k registry.Key, o registry.StateOverride) error {
	if o.Set == o.Declared {
		_, err := f.write(ctx, "unset", field(kindState, k))
		return err
	}
	b, err := json.Marshal(wireState{Declared: string(o.Declared), Set: string(o.Set)})
	if err != nil {
		return err
	}
	code, err := f.write(ctx, "set", field(kindState, k), string(b))
	if err == nil && code == -3 {
		err = fmt.Errorf("setting the state of %s/%s: %w (%d entries)", k.Service, k.ID, ErrFull, f.maxEntries)
	}
	return err
}

// SetHealth implements registry.AdminStore.
func (f *Registry) SetHealth(ctx context.Context, k registry.Key, h registry.Health) error {
	if h == registry.HealthUnknown || h == "" {
		_, err := f.write(ctx, "unset", field(kindHealth, k))
		return err
	}
	code, err := f.write(ctx, "set", field(kindHealth, k), string(h))
	if err == nil && code == -3 {
		err = fmt.Errorf("recording the health of %s/%s: %w (%d entries)", k.Service, k.ID, ErrFull, f.maxEntries)
	}
	return err
}
