package main

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/tether-dev/tether/pkg/config"
	"github.com/tether-dev/tether/pkg/fleet"
	"github.com/tether-dev/tether/pkg/health"
	"github.com/tether-dev/tether/pkg/registry"
	"github.com/tether-dev/tether/pkg/session/redisstore"
)

// openFleet shares the registry's admin layer (registrations, states, health verdicts) through
// the redis backend and loads it, so that this replica serves the fleet's layer from the start.
func openFleet(ctx context.Context, cfg *config.Config, rs *redisstore.Store, reg *registry.Registry, log *slog.Logger) (*fleet.Registry, error) {
	f, err := fleet.New(rs.Client(), rs.KeyPrefix(), reg,
		fleet.WithLogger(log.With("component", "fleet")),
		fleet.WithResync(cfg.Store.Redis.RegistryResync))
	if err != nil {
		return nil, err
	}
	if err := f.Load(ctx); err != nil {
		return nil, fmt.Errorf("store.redis: loading the shared registry: %w", err)
	}
	return f, nil
}

// healthOptions are the health checker's options: with the redis backend one replica at a
// time checks, elected with a lease in Redis.
func (rt *services) healthOptions(cfg *config.Config) []health.Option {
	opts := []health.Option{health.WithLogger(rt.log.With("component", "health"))}
	if rs, ok := rt.store.(*redisstore.Store); ok {
		opts = append(opts, health.WithLease(storeLease{rs, "health"}, cfg.Store.Redis.HealthLeaseTTL))
	}
	return opts
}

// storeLease is a named lease in the redis store.
type storeLease struct {
	rs   *redisstore.Store
	name string
}

func (l storeLease) Hold(ctx context.Context, ttl time.Duration) (bool, error) {
	return l.rs.HoldLease(ctx, l.name, ttl)
}

func (l storeLease) Release(ctx context.Context) error { return l.rs.ReleaseLease(ctx, l.name) }
