package main

import (
	"context"
	"fmt"
	"log/slog"
	"path/filepath"
	"strings"
	"testing"

	"github.com/tether-dev/tether/internal/redistest"
	"github.com/tether-dev/tether/internal/testutil"
	"github.com/tether-dev/tether/pkg/config"
)

// TestRedisSeed: `tether redis seed` on a new redis-server lets a fleet's first start lend
// request slots at once (an unseeded one lends none for one hold); a second run changes
// nothing; it refuses while a replica is connected or when Redis holds keys under the fleet's
// prefix, unless -force.
func TestRedisSeed(t *testing.T) {
	ctx := context.Background()
	configFor := func(t *testing.T, addr string) (string, *config.Config) {
		path := filepath.Join(t.TempDir(), "tether.yaml")
		writeFile(t, path, fmt.Sprintf(`apiVersion: tether/v1
store:
  backend: redis
  redis: {addresses: [%q], leaseTTL: 10s, degradedFor: 15s}
services:
- {name: web, affinity: cookie, requestSlotsPerInstance: 10, match: {pathPrefix: /web}}
- {name: api, affinity: header, match: {pathPrefix: /api}}
`, addr))
		cfg, err := config.Load(path)
		if err != nil {
			t.Fatal(err)
		}
		return path, cfg
	}
	seed := func(args ...string) (int, string, string) {
		var out, errOut strings.Builder
		code := run(ctx, append([]string{"redis", "seed"}, args...), &out, &errOut)
		return code, out.String(), errOut.String()
	}
	// firstBorrow opens a replica's store and leases on cfg's Redis and reports whether its first
	// request-slot borrow of web/i1 got a slot.
	firstBorrow := func(t *testing.T, cfg *config.Config) bool {
		st, leases, err := openRedisStore(cfg, slog.New(slog.DiscardHandler))
		if err != nil {
			t.Fatal(err)
		}
		defer st.Close()
		return leases.Pool("web", "i1", func() int { return 10 }).TryAcquire(ctx)
	}

	t.Run("new Redis", func(t *testing.T) {
		srv := redistest.Start(t)
		path, cfg := configFor(t, srv.Addr)
		code, out, errOut := seed("-c", path)
		if code != 0 || !strings.Contains(out, "web: seeded") || !strings.Contains(out, "api: seeded") {
			t.Fatalf("seed: exit %d\n%s%s", code, out, errOut)
		}
		if !firstBorrow(t, cfg) {
			t.Error("the first borrow after the seed got no slot")
		}
		code, out, errOut = seed("-c", path)
		if code != 0 || !strings.Contains(out, "web: has an epoch already: left as it is") || strings.Contains(out, "seeded") {
			t.Errorf("a second seed: exit %d\n%s%s", code, out, errOut)
		}
	})

	t.Run("unseeded Redis learns for one hold", func(t *testing.T) {
		srv := redistest.Start(t)
		_, cfg := configFor(t, srv.Addr)
		if firstBorrow(t, cfg) {
			t.Error("the first borrow on an unseeded Redis got a slot: the learning window is gone, so the seed test shows nothing")
		}
	})

	t.Run("refusals", func(t *testing.T) {
		srv := redistest.Start(t)
		path, cfg := configFor(t, srv.Addr)
		epoch := func() string {
			out, err := srv.Do("EXISTS", "tether:{web}:qe")
			if err != nil {
				t.Fatal(err)
			}
			return strings.TrimSpace(out)
		}
		st, _, err := openRedisStore(cfg, slog.New(slog.DiscardHandler)) // a replica is running
		if err != nil {
			t.Fatal(err)
		}
		code, out, errOut := seed("-c", path)
		if code != 1 || !strings.Contains(errOut, "not a first start") || !strings.Contains(errOut, "tether connection") || epoch() != "0" {
			t.Errorf("seed with a replica connected: exit %d, epoch key %s\n%s%s", code, epoch(), out, errOut)
		}
		st.Close()
		testutil.Eventually(t, "the replica's connections closed", func() bool {
			list, err := srv.Do("CLIENT", "LIST")
			return err == nil && !strings.Contains(list, "name=tether/")
		})
		if _, err := srv.Do("SET", "tether:{web}:s:0123", "x"); err != nil { // a fleet ran here
			t.Fatal(err)
		}
		code, out, errOut = seed("-c", path)
		if code != 1 || !strings.Contains(errOut, "holds keys under the prefix") || epoch() != "0" {
			t.Errorf("seed on a Redis holding the fleet's keys: exit %d, epoch key %s\n%s%s", code, epoch(), out, errOut)
		}
		code, out, errOut = seed("-c", path, "-force")
		if code != 0 || !strings.Contains(out, "web: seeded") || epoch() != "1" {
			t.Errorf("seed -force: exit %d, epoch key %s\n%s%s", code, epoch(), out, errOut)
		}
	})

	t.Run("usage", func(t *testing.T) {
		var out, errOut strings.Builder
		if code := run(ctx, []string{"redis"}, &out, &errOut); code != 2 || !strings.Contains(errOut.String(), "a subcommand is required: seed") {
			t.Errorf("tether redis: exit %d\n%s", code, errOut.String())
		}
		path := filepath.Join(t.TempDir(), "tether.yaml")
		writeFile(t, path, "apiVersion: tether/v1\nservices:\n- {name: web, affinity: cookie}\n")
		if code, _, errOut := seed("-c", path); code != 1 || !strings.Contains(errOut, "store.backend is") {
			t.Errorf("seed with the memdb backend: exit %d\n%s", code, errOut)
		}
	})
}
