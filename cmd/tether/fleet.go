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
	"github.com/tether-dev/tether/pkg/session"
)

// openFleet shares the registry's admin layer (registrations, states, health verdicts) through
// the redis backend and loads it, so that this replica serves the fleet's layer from the start.
func openFleet(ctx context.Context, cfg *config.Config, rs *session.RedisStore, reg *registry.Registry, log *slog.Logger) (*fleet.Registry, error) {
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
	if rs, ok := rt.store.(*session.RedisStore); ok {
		opts = append(opts, health.WithLease(health.LeaseFunc(func(ctx context.Context, ttl time.Duration) (bool, error) {
			return rs.HoldLease(ctx, "health", ttl)
		}), cfg.Store.Redis.HealthLeaseTTL))
	}
	return opts
}
