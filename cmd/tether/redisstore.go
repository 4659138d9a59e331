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
func openRedisStore(cfg *config.Config, log *slog.Logger) (*redisstore.Store, *quota.Leases, error) {
	return openRedisAs(cfg, log, redisstore.DefaultClientName)
}

// openRedisAs is openRedisStore with the connections named clientName in CLIENT LIST (a
// replica's are redisstore.DefaultClientName).
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

// registerQuotaMetrics exposes what the request-slot leases know of Redis's faults.
func registerQuotaMetrics(reg prometheus.Registerer, l *quota.Leases) {
	reg.MustRegister(
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
