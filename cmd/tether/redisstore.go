package main

import (
	"context"
	"crypto/rand"
	"crypto/tls"
	"encoding/hex"
	"fmt"
	"log/slog"
	"os"

	"github.com/tether-dev/tether/pkg/config"
	"github.com/tether-dev/tether/pkg/quota"
	"github.com/tether-dev/tether/pkg/servertls"
	"github.com/tether-dev/tether/pkg/session"
	"github.com/tether-dev/tether/pkg/session/redisstore"
)

// storeRunner is the session store serve runs: a session.Store with its background loop.
type storeRunner interface {
	session.Store
	Run(ctx context.Context) error
}

// openRedisStore connects the redis backend and the request-slot leases of this replica.
func openRedisStore(cfg *config.Config, log *slog.Logger) (*redisstore.Store, *quota.Leases, error) {
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
	},
		redisstore.WithLogger(log.With("component", "session")),
		redisstore.WithRetention(cfg.Store.Retention),
		redisstore.WithTouchDelay(r.TouchDelay),
		redisstore.WithReservationTTL(r.LeaseTTL))
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
	log.Info("session store: redis", "addresses", r.Addresses, "masterSet", r.MasterSet, "keyPrefix", st.KeyPrefix(), "replica", replica)
	return st, leases, nil
}

// redisTLS is the client TLS of the Redis connections (nil: plain TCP). Like every client
// certificate tether uses, a rotated pair is picked up by the next connection.
func redisTLS(t config.RedisTLS) (*tls.Config, error) {
	if !t.Enabled {
		return nil, nil
	}
	return servertls.ClientConfig(servertls.ClientFiles{CAFile: t.CAFile, CertFile: t.CertFile, KeyFile: t.KeyFile, ServerName: t.ServerName})
}
