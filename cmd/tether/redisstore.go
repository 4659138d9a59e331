package main

import (
	"context"
	"crypto/rand"
	"crypto/tls"
	"encoding/hex"
	"fmt"
	"log/slog"
	"os"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/rueidis"

	tetherv1 "github.com/tether-dev/tether/pkg/api/gen/tether/v1"
	"github.com/tether-dev/tether/pkg/config"
	"github.com/tether-dev/tether/pkg/protocol"
	"github.com/tether-dev/tether/pkg/quota"
	"github.com/tether-dev/tether/pkg/servertls"
	"github.com/tether-dev/tether/pkg/session"
	"github.com/tether-dev/tether/pkg/session/redisstore"
	"github.com/tether-dev/tether/pkg/status"
)

// storeRunner is the session store serve runs: a session.Store with its background loop.
type storeRunner interface {
	session.Store
	Run(ctx context.Context) error
}

// openRedisStore connects the redis backend and the request-slot leases of this replica.
// Its connections register the protocol it speaks (protocol.ClientName).
func openRedisStore(cfg *config.Config, log *slog.Logger) (*redisstore.Store, *quota.Leases, error) {
	return openRedisAs(cfg, log, protocol.ClientName())
}

// protocolInterval is how often a replica looks at the protocols of the replicas connected.
const protocolInterval = 2 * time.Second

// openProtocol refuses a data set of a newer protocol and decides the protocol this replica
// speaks at start (protocol 1 while replicas of e11d6a0 are connected; pkg/protocol), before
// any lease is taken; the watcher it returns keeps deciding (Run).
func openProtocol(ctx context.Context, st *redisstore.Store, leases *quota.Leases, log *slog.Logger) (*protocol.Watcher, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := protocol.Check(ctx, st.Client(), st.KeyPrefix()); err != nil {
		return nil, fmt.Errorf("store.redis: %w", err)
	}
	leases.SpeakProtocol(protocol.E11d6a0) // until a reading says otherwise: every build bridges to it
	w := protocol.NewWatcher(st.Client(), st.KeyPrefix(), protocolInterval, log.With("component", "protocol"), leases.SpeakProtocol)
	if err := w.Sync(ctx); err != nil {
		log.Warn("redis protocol: cannot read the connected replicas at start; speaking protocol 1 until it can", "err", err)
	}
	return w, nil
}

// openRedisAs is openRedisStore with the connections named clientName in CLIENT LIST (a
// replica's are protocol.ClientName()).
func openRedisAs(cfg *config.Config, log *slog.Logger, clientName string) (*redisstore.Store, *quota.Leases, error) {
	r := cfg.Store.Redis
	tlsCfg, err := redisTLS(r.TLS)
	if err != nil {
		return nil, nil, fmt.Errorf("store.redis.tls: %w", err)
	}
	st, err := redisstore.New(redisstore.Config{
		Addrs:            r.Addresses,
		MasterSet:        r.MasterSet,
		Username:         r.Username,
		Password:         r.Password,
		SentinelPassword: r.SentinelPassword,
		DB:               r.DB,
		TLS:              tlsCfg,
		KeyPrefix:        r.KeyPrefix,
		ClientName:       clientName,
	},
		redisstore.WithLogger(log.With("component", "session")),
		redisstore.WithRetention(cfg.Store.Retention),
		redisstore.WithTouchDelay(r.TouchDelay),
		redisstore.WithReservationTTL(r.LeaseTTL),
		redisstore.WithDurability(redisstore.Durability{Mode: redisstore.AckDurability(r.AckDurability), Replicas: r.AckReplicas, Timeout: r.AckTimeout}),
		// Every store call on a request's path ends well inside Envoy's message_timeout.
		redisstore.WithOpTimeout(quota.CallTimeout(cfg.ExtProc.MessageTimeout)))
	if err != nil {
		return nil, nil, fmt.Errorf("store.redis: %w", err)
	}
	host, _ := os.Hostname()
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	replica := host + "-" + hex.EncodeToString(b) // unique per process: a restart is a new replica
	leases := quota.New(st.Client(), st.KeyPrefix(), replica, quota.WithTTL(r.LeaseTTL),
		quota.WithDegradedFor(r.DegradedFor), quota.WithCallTimeout(quota.CallTimeout(cfg.ExtProc.MessageTimeout)),
		quota.WithLogger(log.With("component", "quota")))
	log.Info("session store: redis", "addresses", r.Addresses, "masterSet", r.MasterSet, "keyPrefix", st.KeyPrefix(), "replica", replica,
		"ackDurability", r.AckDurability)
	checkEviction(st.Client(), log)
	return st, leases, nil
}

// checkEviction warns loudly when Redis may evict keys: an evicting maxmemory-policy silently
// deletes sessions and request-slot leases (a lost lease key is a new epoch: nothing new is
// lent for one hold). A Redis that does not let CONFIG GET run (managed services) is said so.
// On a Cluster every node is asked (a keyless CONFIG GET would reach any one of them).
func checkEviction(c rueidis.Client, log *slog.Logger) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	for addr, n := range c.Nodes() {
		m, err := n.Do(ctx, n.B().ConfigGet().Parameter("maxmemory-policy").Build()).AsStrMap()
		switch policy := m["maxmemory-policy"]; {
		case err != nil:
			log.Warn("session store: could not read Redis's maxmemory-policy; run it with noeviction, or sessions and leases may be evicted", "node", addr, "err", err)
		case policy != "noeviction":
			log.Error("session store: Redis's maxmemory-policy evicts keys: sessions and request-slot leases can silently disappear under memory pressure; set maxmemory-policy noeviction", "node", addr, "maxmemory-policy", policy)
		}
	}
}

// redisTLS is the client TLS of the Redis connections (nil: plain TCP). Like every client
// certificate tether uses, a rotated pair is picked up by the next connection.
func redisTLS(t config.RedisTLS) (*tls.Config, error) {
	if !t.Enabled {
		return nil, nil
	}
	return servertls.ClientConfig(servertls.ClientFiles{CAFile: t.CAFile, CertFile: t.CertFile, KeyFile: t.KeyFile, ServerName: t.ServerName})
}

// redisStatus is the snapshot's store part: whether Redis answers, whether requests skip it, and
// whether it lost its data (an epoch change; the log says so too, and the metrics
// tether_quota_epoch_changes_total and tether_quota_degraded).
func redisStatus(st *redisstore.Store, l *quota.Leases) func() *tetherv1.StoreStatus {
	return func() *tetherv1.StoreStatus {
		return status.StoreStatus(status.StoreState{Reachable: st.Up(), Degraded: l.Degraded(),
			EpochChanges: l.EpochChanges(), LastEpochChange: l.LastEpochChange(), Hold: l.Hold()})
	}
}

// registerQuotaMetrics exposes what the request-slot leases know of Redis's faults, and the
// protocol they speak.
func registerQuotaMetrics(reg prometheus.Registerer, l *quota.Leases) {
	reg.MustRegister(
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "tether_redis_protocol",
			Help: "The protocol of the records this replica writes in Redis: 1 while replicas of e11d6a0 (connections named \"tether\") are connected, else 2 (a rolling upgrade is over when every replica reports 2)."},
			func() float64 { return float64(l.SpeakingProtocol()) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "tether_quota_epoch_changes_total",
			Help: "New epochs of Redis's data set this replica met (Redis restarted without its data, failed over or lost keys); each is a learning window of max(leaseTTL, degradedFor) in which no new request slots are lent."},
			func() float64 { return float64(l.EpochChanges()) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "tether_quota_degraded",
			Help: "1 while this replica's requests skip Redis (it was unreachable or too slow): requests are admitted within the request slots held, until store.redis.degradedFor after the last renewal."},
			func() float64 {
				if l.Degraded() {
					return 1
				}
				return 0
			}))
}
