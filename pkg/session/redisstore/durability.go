package redisstore

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/redis/rueidis"

	"github.com/tether-dev/tether/pkg/session"
)

// AckDurability is what a write whose loss would lose an acknowledged session waits for before
// the store reports it done (config store.redis.ackDurability).
type AckDurability string

// AckDurability values.
const (
	// AckNone acknowledges a write once the primary ran it: persistence and replication are
	// Redis's own and asynchronous (the default).
	AckNone AckDurability = "none"
	// AckAOF acknowledges a write once it is in the primary's append-only file, fsynced: Redis
	// must run appendonly yes with appendfsync always (checked when the store starts, and
	// again on the connection of every acknowledged write: WAITAOF 1 0 where the server has it
	// — Redis ≥ 7.2, Valkey — else CONFIG GET appendonly appendfsync).
	AckAOF AckDurability = "aof"
	// AckReplica acknowledges a write once Durability.Replicas replicas have it: WAIT on the
	// write's connection.
	AckReplica AckDurability = "replica"
)

// AckDurabilities lists the values, in the order the docs give them.
var AckDurabilities = []AckDurability{AckNone, AckAOF, AckReplica}

// Defaults of Durability.
const (
	DefaultAckReplicas = 1
	// DefaultAckTimeout bounds one WAIT/WAITAOF: well inside the store's call timeout on a
	// request's path (a quarter of extProc.messageTimeout, 125 ms by default).
	DefaultAckTimeout = 50 * time.Millisecond
)

// ErrNotDurable reports a write that Redis ran but could not acknowledge as durable as
// configured (too few replicas within the timeout, the AOF not fsynced or turned off). It is
// always wrapped together with session.ErrStoreUnavailable (a new session gets 503
// StoreUnavailable with Retry-After). A create that fails so is ended again when Redis lets it
// (its client never got the id); otherwise — and for an update or a move — the write may still
// exist, and may also be lost in a failover.
var ErrNotDurable = errors.New("write not acknowledged durably")

// Durability says what acknowledged writes wait for (see AckDurability).
//
// The writes waited for are the ones whose loss loses an acknowledged session or its binding:
// a create (Create, CreateReserved, PlaceCreate), an update (Update: the promotion of a
// provisional session and SessionAPI changes) and a move to another instance (PlaceMove).
// Not waited for: ends and deletes (a lost end brings the session back until it expires),
// batched idle-timer touches (a lost touch moves the idle deadline back by at most
// store.redis.touchDelay), the reaper, MCP slot reservations (a lost one frees its slot early),
// request-slot leases (pkg/quota fences them by epoch) and the shared registry.
type Durability struct {
	Mode AckDurability
	// Replicas is how many replicas must acknowledge a write with AckReplica (default
	// DefaultAckReplicas).
	Replicas int
	// Timeout is how long WAIT (or WAITAOF) may block (default DefaultAckTimeout; at least
	// 1 ms: WAIT 0 would wait forever). Keep it under the store's call timeout.
	Timeout time.Duration
}

// WithDurability sets what acknowledged writes wait for (default AckNone). New checks the
// server: with AckAOF it refuses a Redis that does not run appendonly yes with appendfsync
// always; with AckReplica it logs an error when fewer replicas are connected than Replicas.
func WithDurability(d Durability) Option {
	return func(r *Store) {
		if d.Mode == "" {
			d.Mode = AckNone
		}
		if d.Replicas <= 0 {
			d.Replicas = DefaultAckReplicas
		}
		if d.Timeout <= 0 {
			d.Timeout = DefaultAckTimeout
		}
		d.Timeout = max(d.Timeout, time.Millisecond)
		r.dur = d
	}
}

// durState is what the store learned of the server's durability at start.
type durState struct {
	waitAOF atomic.Bool // the server has WAITAOF
	bad     atomic.Bool // the last acknowledged write could not be made durable (logged once)
}

// Durability returns what acknowledged writes wait for.
func (r *Store) Durability() Durability { return r.dur }

// checkDurability looks at the server New connected to — on a Cluster, at every primary (see
// WithDurability).
func (r *Store) checkDurability(ctx context.Context) error {
	switch r.dur.Mode {
	case AckNone:
		return nil
	case AckAOF:
		return r.checkAOF(ctx)
	case AckReplica:
		prim, err := r.primaries(ctx)
		if err != nil {
			return fmt.Errorf("ackDurability replica: %w", err)
		}
		for addr, c := range prim {
			info, err := c.Do(ctx, c.B().Info().Section("replication").Build()).ToString()
			if err != nil {
				return fmt.Errorf("ackDurability replica: INFO replication%s: %w", onNode(addr), err)
			}
			if n := infoInt(info, "connected_slaves"); n < r.dur.Replicas {
				r.log.Error("redis store: ackDurability replica: the primary has fewer connected replicas than must acknowledge each write; new sessions get 503 StoreUnavailable until enough are connected",
					"primary", addr, "connected", n, "want", r.dur.Replicas)
			}
		}
		r.log.Info("redis store: ackDurability replica: sessions are acknowledged once replicas have them (WAIT)", "replicas", r.dur.Replicas, "timeout", r.dur.Timeout)
	default:
		return fmt.Errorf("ackDurability %q: want one of none, aof, replica", r.dur.Mode)
	}
	return nil
}

// checkAOF is checkDurability for AckAOF.
func (r *Store) checkAOF(ctx context.Context) error {
	prim, err := r.primaries(ctx)
	if err != nil {
		return fmt.Errorf("ackDurability aof: %w", err)
	}
	for addr, c := range prim {
		m, err := c.Do(ctx, c.B().ConfigGet().Parameter("appendonly", "appendfsync").Build()).AsStrMap()
		if err != nil {
			return fmt.Errorf("ackDurability aof: reading appendonly and appendfsync%s (CONFIG GET must be allowed): %w", onNode(addr), err)
		}
		if err := aofPolicy(m); err != nil {
			return fmt.Errorf("ackDurability aof%s: %w", onNode(addr), err)
		}
	}
	info, err := r.c.Do(ctx, r.c.B().CommandInfo().CommandName("waitaof").Build()).ToArray()
	if err != nil {
		return fmt.Errorf("ackDurability aof: COMMAND INFO WAITAOF: %w", err)
	}
	r.durSt.waitAOF.Store(len(info) == 1 && !info[0].IsNil())
	how := "CONFIG GET appendonly appendfsync after each acknowledged write (no WAITAOF: Redis < 7.2)"
	if r.durSt.waitAOF.Load() {
		how = "WAITAOF 1 0 after each acknowledged write"
	}
	r.log.Info("redis store: ackDurability aof: sessions are acknowledged once fsynced to the primary's append-only file", "check", how)
	return nil
}

// primaries returns the clients of the servers writes go to, by address: the store's client
// itself (address ""), or on a Cluster one per primary (a keyless command such as INFO or
// CONFIG GET would otherwise go to any one node, a replica too).
func (r *Store) primaries(ctx context.Context) (map[string]rueidis.Client, error) {
	if r.c.Mode() != rueidis.ClientModeCluster {
		return map[string]rueidis.Client{"": r.c}, nil
	}
	out := map[string]rueidis.Client{}
	for addr, c := range r.c.Nodes() {
		info, err := c.Do(ctx, c.B().Info().Section("replication").Build()).ToString()
		if err != nil {
			return nil, fmt.Errorf("INFO replication on Cluster node %s: %w", addr, err)
		}
		if strings.Contains(info, "role:master") {
			out[addr] = c
		}
	}
	if len(out) == 0 {
		return nil, errors.New("no Cluster primary answered")
	}
	return out, nil
}

func onNode(addr string) string {
	if addr == "" {
		return ""
	}
	return " on " + addr
}

// aofPolicy checks a CONFIG GET appendonly appendfsync reply.
func aofPolicy(m map[string]string) error {
	if m["appendonly"] != "yes" || m["appendfsync"] != "always" {
		return fmt.Errorf("the server runs appendonly %q, appendfsync %q: want appendonly yes and appendfsync always (redis.conf, or CONFIG SET and CONFIG REWRITE); everysec loses acknowledged writes on a crash, and even on a kill -9 when the disk is busy",
			m["appendonly"], m["appendfsync"])
	}
	return nil
}

// infoInt reads one integer field of an INFO reply (-1 when absent).
func infoInt(info, field string) int {
	for line := range strings.SplitSeq(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), field+":"); ok {
			if n, err := strconv.Atoi(v); err == nil {
				return n
			}
		}
	}
	return -1
}

// ackClient runs one script of an acknowledged write: each Do sends the script and the
// acknowledgement (WAIT, WAITAOF or CONFIG GET) in one DoMulti, so that both go on the same
// connection, one after the other (WAIT counts the writes of its own connection; it cannot run
// inside a script). On one server or Sentinel's primary, rueidis sends a DoMulti on one
// connection: a dedicated one when it holds a blocking command such as WAIT (mux.DoMulti →
// blockingMulti). The store never sets ConnLifetime, whose expiry would resend the remainder of
// a DoMulti on another connection. rueidis.Lua.Exec sends EVALSHA, then EVAL on NOSCRIPT: each
// is followed by its own acknowledgement, and ack is the last one's.
//
// On a Cluster, a DoMulti is not one connection's: rueidis (v1.0.79, cluster.go doresultfn)
// follows a MOVED or ASK, and retries a TRYAGAIN, CLUSTERDOWN or LOADING, of the script alone,
// on another connection or later, and keeps the acknowledgement the first connection gave —
// a WAIT that ran after no write of ours answers at once with every replica (its connection's
// earlier writes are replicated), so the write would be acknowledged without ever having been
// waited for. There the pair runs on a dedicated connection of the key's primary (dedicate): a
// retry re-sends both on it, and a redirect comes back as an error (503 StoreUnavailable: the
// client's slot map is refreshed meanwhile and the next attempt goes to the new primary).
type ackClient struct {
	rueidis.Client
	r    *Store
	slot string // a key of the write, for the Cluster slot
	ack  rueidis.RedisResult
	sent bool
}

// Do implements rueidis.Client for Lua.Exec.
func (a *ackClient) Do(ctx context.Context, cmd rueidis.Completed) rueidis.RedisResult {
	var res []rueidis.RedisResult
	if a.Mode() == rueidis.ClientModeCluster {
		res = a.r.dedicated(ctx, cmd, a.r.ackCmd(a.slot))
	} else {
		res = a.DoMulti(ctx, cmd, a.r.ackCmd(a.slot)) // ackClient overrides Do only
	}
	a.ack, a.sent = res[1], true
	return res[0]
}

// dedicated runs multi (one slot's commands) on a dedicated connection of the slot's primary,
// returning by ctx's deadline like every bounded call. A connection that failed is closed, not
// given back to the pool (a reply may still be on its way).
func (r *Store) dedicated(ctx context.Context, multi ...rueidis.Completed) []rueidis.RedisResult {
	run := func() []rueidis.RedisResult {
		dc, release := r.c.Dedicate()
		defer release()
		res := dc.DoMulti(ctx, multi...)
		for _, x := range res {
			if x.NonRedisError() != nil {
				dc.Close()
				break
			}
		}
		return res
	}
	if bc, ok := r.c.(*boundedClient); ok {
		return bounded(bc, ctx, run, errResults(len(multi)))
	}
	return run()
}

// writer returns the client an acknowledged write's script runs on: r.c itself with AckNone.
func (r *Store) writer(slotKey string) (rueidis.Client, *ackClient) {
	if r.dur.Mode == AckNone || r.dur.Mode == "" {
		return r.c, nil
	}
	a := &ackClient{Client: r.c, r: r, slot: slotKey}
	return a, a
}

// ackCmd is the command that follows an acknowledged write on its connection.
func (r *Store) ackCmd(slotKey string) rueidis.Completed {
	ms := max(r.dur.Timeout.Milliseconds(), 1)
	var cmd rueidis.Completed
	switch {
	case r.dur.Mode == AckReplica:
		cmd = r.c.B().Wait().Numreplicas(int64(r.dur.Replicas)).Timeout(ms).Build()
	case r.durSt.waitAOF.Load():
		cmd = r.c.B().Waitaof().Numlocal(1).Numreplicas(0).Timeout(ms).Build()
	default:
		cmd = r.c.B().ConfigGet().Parameter("appendonly", "appendfsync").Build()
	}
	return cmd.SetSlot(slotKey)
}

// acked judges the acknowledgement of a write the script applied (a nil a: AckNone). A
// failure is ErrNotDurable wrapped with session.ErrStoreUnavailable; it is logged once until a
// write is acknowledged again.
func (r *Store) acked(a *ackClient) error {
	if a == nil {
		return nil
	}
	err := r.ackErr(a)
	if err == nil {
		if r.durSt.bad.CompareAndSwap(true, false) {
			r.log.Info("redis store: writes are acknowledged durably again", "ackDurability", r.dur.Mode)
		}
		return nil
	}
	r.unavailable.Add(1)
	if r.durSt.bad.CompareAndSwap(false, true) {
		r.log.Error("redis store: a write could not be acknowledged durably; new sessions get 503 StoreUnavailable until writes are",
			"ackDurability", r.dur.Mode, "err", err)
	}
	return fmt.Errorf("%w: %w: %w", session.ErrStoreUnavailable, ErrNotDurable, err)
}

func (r *Store) ackErr(a *ackClient) error {
	if !a.sent {
		return errors.New("no acknowledgement was sent")
	}
	switch {
	case r.dur.Mode == AckReplica:
		n, err := a.ack.AsInt64()
		if err != nil {
			return fmt.Errorf("WAIT: %w", err)
		}
		if n < int64(r.dur.Replicas) {
			return fmt.Errorf("WAIT: %d of %d replicas acknowledged within %v", n, r.dur.Replicas, r.dur.Timeout)
		}
	case r.durSt.waitAOF.Load():
		v, err := a.ack.AsIntSlice()
		if err != nil {
			return fmt.Errorf("WAITAOF: %w", err)
		}
		if len(v) < 1 || v[0] < 1 {
			return fmt.Errorf("WAITAOF: the primary's append-only file did not confirm the write within %v", r.dur.Timeout)
		}
	default:
		m, err := a.ack.AsStrMap()
		if err != nil {
			return fmt.Errorf("CONFIG GET appendonly appendfsync: %w", err)
		}
		if err := aofPolicy(m); err != nil {
			return err
		}
	}
	return nil
}

// retract ends a session whose create Redis ran but could not acknowledge durably (err
// ErrNotDurable): its caller answers 503 and never hands the id out, so the session must not
// hold its slot until it lapses. Best effort, on a fresh call timeout: when Redis fails this
// too, the session lapses by its idle timeout.
func (r *Store) retract(service, id string, err error) {
	if !errors.Is(err, ErrNotDurable) {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), r.opTimeout)
	defer cancel()
	if _, err := r.end(ctx, service, id, session.StatusTerminated, r.clock(), false); err != nil { // End takes the replica's clock
		r.log.Warn("redis store: ending a session whose create was not acknowledged durably; it lapses by its idle timeout", "service", service, "session", id, "err", err)
	}
}
