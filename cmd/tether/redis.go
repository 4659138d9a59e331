package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"time"

	"github.com/redis/rueidis"

	"github.com/tether-dev/tether/pkg/config"
	"github.com/tether-dev/tether/pkg/protocol"
	"github.com/tether-dev/tether/pkg/quota"
)

// seedClientName names the seeding connections, so that they do not count as a replica's.
const seedClientName = "tether-seed"

// runRedis is `tether redis SUBCOMMAND`: operations on the Redis a fleet shares.
func runRedis(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if len(args) > 0 && args[0] == "seed" {
		return runRedisSeed(ctx, args[1:], stdout, stderr)
	}
	fs := newFlagSet("redis", "seed -c FILE [-force]", stderr)
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	return usageError(fs, "a subcommand is required: seed")
}

// runRedisSeed marks a new Redis as new for every service of the config, so that the fleet's
// first start lends request slots at once instead of after one hold.
//
// A Redis with no lease data cannot tell a first start from a Redis that lost its data, so the
// leases of a fresh epoch lend nothing new for one hold (max(leaseTTL, degradedFor)): replicas
// that were cut off may still spend leases from before. Seeding skips that window. It is safe
// only when no replica can be holding a lease: before the fleet's first start. Hence it refuses
// when a replica is connected (CLIENT LIST: connections named "tether") or when Redis holds any
// key under the fleet's prefix (a fleet ran on it, or runs), and it changes nothing for a service
// whose epoch exists already. -force skips the two checks (a Redis whose CLIENT LIST or SCAN is
// not allowed): never after Redis lost data while replicas run, since a replica cut off from
// Redis is not connected yet may still spend its lease, and seeding would let those slots be
// lent twice.
func runRedisSeed(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("redis seed", "-c FILE [-force]", stderr)
	path := fs.String("c", "", "config `file`: its store.redis and the services to seed")
	force := fs.Bool("force", false, "skip the checks that no replica is connected and that Redis holds no key under the prefix")
	if err := parseConfigArgs(fs, args, path, "the config of the fleet whose Redis is new"); err != nil {
		return err
	}
	cfg, names, err := loadSeedConfig(*path)
	if err != nil {
		return err
	}
	st, leases, err := openRedisAs(cfg, slog.New(slog.DiscardHandler), seedClientName)
	if err != nil {
		return err
	}
	defer st.Close()
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	todo, err := unseeded(ctx, leases, names, stdout)
	if err != nil || len(todo) == 0 {
		return err
	}
	if !*force {
		if err := checkFirstStart(ctx, st.Client(), st.KeyPrefix()); err != nil {
			return err
		}
	}
	for _, name := range todo {
		if err := leases.Seed(ctx, name); err != nil {
			return fmt.Errorf("seeding %s: %w", name, err)
		}
		_, _ = fmt.Fprintf(stdout, "%s: seeded: request slots are lent from the first request\n", name)
	}
	return nil
}

// loadSeedConfig loads the config at path and returns it with the names of its services:
// a fleet on Redis with at least one service.
func loadSeedConfig(path string) (*config.Config, []string, error) {
	cfg, err := config.Load(path)
	if err != nil {
		return nil, nil, err
	}
	if cfg.Store.Backend != config.StoreRedis {
		return nil, nil, fmt.Errorf("%s: store.backend is %q: only a fleet on Redis has leases to seed", path, cfg.Store.Backend)
	}
	services, _ := cfg.Registry()
	if len(services) == 0 {
		return nil, nil, fmt.Errorf("%s: no services to seed", path)
	}
	names := make([]string, len(services))
	for i, svc := range services {
		names[i] = svc.Name
	}
	return cfg, names, nil
}

// unseeded returns those of the services that have no epoch yet, printing a line to stdout
// for each that has one (it is left as it is).
func unseeded(ctx context.Context, leases *quota.Leases, names []string, stdout io.Writer) ([]string, error) {
	var todo []string
	for _, name := range names {
		has, err := leases.HasEpoch(ctx, name)
		if err != nil {
			return nil, fmt.Errorf("reading the epoch of %s: %w", name, err)
		}
		if has {
			_, _ = fmt.Fprintf(stdout, "%s: has an epoch already: left as it is\n", name)
			continue
		}
		todo = append(todo, name)
	}
	return todo, nil
}

// errNotFirstStart is what checkFirstStart refuses with.
var errNotFirstStart = errors.New("not a first start: seeding now could lend request slots that replicas still hold")

// checkFirstStart refuses unless Redis looks new to the fleet: no replica connected and no key
// under prefix, on every node.
func checkFirstStart(ctx context.Context, c rueidis.Client, prefix string) error {
	for addr, n := range c.Nodes() {
		list, err := n.Do(ctx, n.B().ClientList().TypeNormal().Build()).ToString()
		if err != nil {
			return fmt.Errorf("%s: CLIENT LIST: %w (run with -force only if you know no replica ran on this Redis)", addr, err)
		}
		if k := replicasIn(list); k > 0 {
			return fmt.Errorf("%w: %d tether connection(s) on %s; seed before the fleet's first start", errNotFirstStart, k, addr)
		}
		cursor := uint64(0)
		for {
			e, err := n.Do(ctx, n.B().Scan().Cursor(cursor).Match(globEscape(prefix)+"*").Count(1000).Build()).AsScanEntry()
			if err != nil {
				return fmt.Errorf("%s: SCAN: %w (run with -force only if you know no replica ran on this Redis)", addr, err)
			}
			if len(e.Elements) > 0 {
				return fmt.Errorf("%w: %s holds keys under the prefix %q (e.g. %q): a fleet ran on it", errNotFirstStart, addr, prefix, e.Elements[0])
			}
			if cursor = e.Cursor; cursor == 0 {
				break
			}
		}
	}
	return nil
}

// replicasIn counts the connections of a CLIENT LIST reply named like a replica's, of any
// protocol ("tether", "tether/2", …: pkg/protocol).
func replicasIn(list string) int {
	k := 0
	for line := range strings.Lines(list) {
		for f := range strings.FieldsSeq(line) {
			if name, ok := strings.CutPrefix(f, "name="); ok && protocol.ProtocolOfName(name) > 0 {
				k++
			}
		}
	}
	return k
}

// globEscape escapes the glob characters of a SCAN MATCH pattern.
func globEscape(s string) string {
	var b strings.Builder
	for _, r := range s {
		if strings.ContainsRune(`*?[]\`, r) {
			b.WriteByte('\\')
		}
		b.WriteRune(r)
	}
	return b.String()
}
