// Package protocol is the version of what tether replicas sharing one Redis write there (keys,
// record formats, scripts' contracts), so that replicas of two builds can run side by side
// during a rolling upgrade and a change that cannot be bridged is refused at start.
//
// # Protocols
//
//	1  the builds up to commit e11d6a0 (they register no version)
//	2  this build: request-slot lease records "slots,demand,epoch,seq,claim" with the epoch
//	   key P{svc}:qe, every expiry on Redis's clock (pkg/quota, pkg/session/redisstore)
//
// Everything else replicas share is the same in 1 and 2: the session records and their
// indexes, the session-slot counts and reservations, the reaper and health leases, the end and
// registry channels, the fleet's admin layer (the upgrade procedure in
// examples/replicas/README.md lists it).
//
// # Registration
//
// A replica registers the protocol it speaks in the name of its Redis connections (CLIENT
// SETNAME): "tether/2" for this build. Protocol 1 named them "tether". The names vanish with
// the connections, so a stopped or killed replica is never counted again, and nothing needs
// renewing. What a replica speaks is the lowest protocol connected (Watcher): 1 while any
// connection is named "tether", else its own.
//
// # The data set's version
//
// P + "protocol" (a string) is the highest protocol a replica has switched the data set to:
// its records may be in Redis. It is read at start (Check): a data set at a protocol above this
// build's is refused with ErrNewer, since its records may be in formats this build cannot
// read. Protocol 1 does not read it: a build of protocol 1 started after the switch is not
// refused by anyone; the replicas of protocol 2 see its connections and speak 1 again
// (pkg/quota: its lease script fails, and so refuses requests, until the records it meets are
// written in protocol 1 again, within a lease renewal).
package protocol

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/redis/rueidis"
)

// Protocol numbers.
const (
	// E11d6a0 is the protocol of the builds up to commit e11d6a0: no version anywhere.
	E11d6a0 = 1
	// Current is the protocol this build speaks when every replica does.
	Current = 2
)

// ClientNamePrefix starts the connection name of every replica ("tether", protocol 1).
const ClientNamePrefix = "tether"

// ClientName is the CLIENT SETNAME of a replica speaking this build's protocol.
func ClientName() string { return ClientNamePrefix + "/" + strconv.Itoa(Current) }

// ProtocolOfName returns the protocol a connection name registers: 1 for "tether", n for
// "tether/n", 0 for any other name (not a replica: a seeding or operator connection).
func ProtocolOfName(name string) int {
	if name == ClientNamePrefix {
		return E11d6a0
	}
	rest, ok := strings.CutPrefix(name, ClientNamePrefix+"/")
	if !ok {
		return 0
	}
	n, err := strconv.Atoi(rest)
	if err != nil || n < 1 {
		return 0
	}
	return n
}

// ErrNewer refuses a start on a data set switched to a protocol this build cannot read.
var ErrNewer = errors.New("the Redis data set holds records of a newer tether protocol")

// Peers is what CLIENT LIST shows of the replicas connected.
type Peers struct {
	// Lowest is the lowest protocol a connected replica speaks (0: none connected).
	Lowest int
	// Conns counts the replica connections by protocol.
	Conns map[int]int
}

// versionKey is the data set's protocol (see the package doc).
func versionKey(prefix string) string { return prefix + "protocol" }

// DataSet returns the data set's protocol: the version key's, else 0 (no replica of protocol
// 2 or later switched it; protocol 1 may have written records).
func DataSet(ctx context.Context, c rueidis.Client, prefix string) (int, error) {
	v, err := c.Do(ctx, c.B().Get().Key(versionKey(prefix)).Build()).ToString()
	if rueidis.IsRedisNil(err) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("reading %s: %w", versionKey(prefix), err)
	}
	n, err := strconv.Atoi(v)
	if err != nil {
		return 0, fmt.Errorf("%s holds %q, not a protocol number", versionKey(prefix), v)
	}
	return n, nil
}

// Check refuses a start on a data set at a protocol above Current (ErrNewer, with what to do).
func Check(ctx context.Context, c rueidis.Client, prefix string) error {
	n, err := DataSet(ctx, c, prefix)
	if err != nil {
		return err
	}
	if n > Current {
		return fmt.Errorf("%w: %s is %d, this build speaks up to %d: its records may be in formats this build cannot read "+
			"(start a build of protocol %d or later; a rollback is possible only while replicas of this build were still connected)",
			ErrNewer, versionKey(prefix), n, Current, n)
	}
	return nil
}

// ListPeers reads CLIENT LIST on every node and counts the replica connections by protocol.
func ListPeers(ctx context.Context, c rueidis.Client) (Peers, error) {
	p := Peers{Conns: map[int]int{}}
	for addr, n := range c.Nodes() {
		list, err := n.Do(ctx, n.B().ClientList().TypeNormal().Build()).ToString()
		if err != nil {
			return Peers{}, fmt.Errorf("%s: CLIENT LIST: %w", addr, err)
		}
		for line := range strings.Lines(list) {
			for f := range strings.FieldsSeq(line) {
				name, ok := strings.CutPrefix(f, "name=")
				if !ok {
					continue
				}
				if v := ProtocolOfName(name); v > 0 {
					p.Conns[v]++
					if p.Lowest == 0 || v < p.Lowest {
						p.Lowest = v
					}
				}
			}
		}
	}
	return p, nil
}

// raiseScript sets the data set's protocol to ARGV[1] unless it is higher already.
var raiseScript = rueidis.NewLuaScript(`
local cur = tonumber(redis.call('GET', KEYS[1]) or '0') or 0
if cur < tonumber(ARGV[1]) then redis.call('SET', KEYS[1], ARGV[1]) return 1 end
return 0
`)

// Watcher decides the protocol this replica speaks: the lowest connected, at most Current.
// Until its first reading succeeds it speaks protocol 1 (the one every build can bridge to).
type Watcher struct {
	c        rueidis.Client
	prefix   string
	interval time.Duration
	log      *slog.Logger
	onChange func(int)
	speaking atomic.Int32
	synced   atomic.Bool // a decision was made (and logged)
	// clear counts the readings in a row that found no replica below Current (Sync's caller
	// is one goroutine at a time: Run's, or the start's before it).
	clear int
}

// settle is how many readings in a row must find no replica of an older protocol before a
// replica that speaks it switches up: a replica of protocol 1 whose connections dropped for a
// moment (a reconnect) does not make the others switch and back.
const settle = 3

// NewWatcher returns a watcher that calls onChange (from Run's goroutine, and once from Sync)
// with each protocol it decides to speak.
func NewWatcher(c rueidis.Client, prefix string, interval time.Duration, log *slog.Logger, onChange func(int)) *Watcher {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	w := &Watcher{c: c, prefix: prefix, interval: interval, log: log, onChange: onChange}
	w.speaking.Store(E11d6a0)
	return w
}

// Speaking returns the protocol this replica speaks now.
func (w *Watcher) Speaking() int { return int(w.speaking.Load()) }

// Sync reads the connected replicas once and decides. A failed reading changes nothing,
// except where Redis does not let CLIENT LIST run (a managed service's ACL): then the data
// set's protocol decides (an operator sets it once no replica of protocol 1 runs; see the
// upgrade procedure).
func (w *Watcher) Sync(ctx context.Context) error {
	peers, err := ListPeers(ctx, w.c)
	if _, redisErr := rueidis.IsRedisErr(err); redisErr {
		if n, derr := DataSet(ctx, w.c, w.prefix); derr == nil && n >= Current {
			w.decide(Current, peers)
			return nil
		}
	}
	if err != nil {
		return err
	}
	next := Current
	if peers.Lowest > 0 && peers.Lowest < Current {
		next = peers.Lowest
	}
	w.clear++
	if next < Current {
		w.clear = 0
	}
	if next == Current && w.synced.Load() && w.Speaking() < Current && w.clear < settle {
		return nil // not settled yet: the next readings decide
	}
	if next == Current {
		if err := raiseScript.Exec(ctx, w.c, []string{versionKey(w.prefix)}, []string{strconv.Itoa(Current)}).Error(); err != nil {
			return fmt.Errorf("raising %s: %w", versionKey(w.prefix), err)
		}
	}
	w.decide(next, peers)
	return nil
}

// decide makes next the protocol spoken, and says so when it changes.
func (w *Watcher) decide(next int, peers Peers) {
	prev := int(w.speaking.Swap(int32(next)))
	if prev != next || !w.synced.Swap(true) {
		w.log.Info("redis protocol: speaking "+strconv.Itoa(next), "protocol", next, "was", prev,
			"connections", fmt.Sprint(peers.Conns), "why", why(next))
		if w.onChange != nil {
			w.onChange(next)
		}
	}
}

func why(p int) string {
	if p == E11d6a0 {
		return "replicas of protocol 1 (builds up to e11d6a0, connections named \"tether\") are connected: their request-slot lease format is spoken until none is"
	}
	return "every connected replica speaks this protocol"
}

// Run re-reads the connected replicas every interval until ctx ends. A replica speaking an older
// protocol switches up after settle readings in a row without its replicas (3 × interval).
func (w *Watcher) Run(ctx context.Context) {
	t := time.NewTicker(w.interval)
	defer t.Stop()
	warned := false
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			sctx, cancel := context.WithTimeout(ctx, w.interval)
			err := w.Sync(sctx)
			cancel()
			if err != nil && ctx.Err() == nil && !warned {
				w.log.Warn("redis protocol: cannot read the connected replicas; the protocol spoken stays as it is", "protocol", w.Speaking(), "err", err)
				warned = true
			} else if err == nil {
				warned = false
			}
		}
	}
}
