package rediserr_test

import (
	"context"
	"errors"
	"testing"

	"github.com/redis/rueidis"

	"github.com/tether-dev/tether/internal/redistest"
	"github.com/tether-dev/tether/pkg/rediserr"
)

// TestTransient: the replies of a real redis-server that mean "try again later" are transient,
// a wrong command and a non-Redis error are not; MOVED and ASK (a Cluster slot elsewhere, seen
// on a dedicated connection) are.
func TestTransient(t *testing.T) {
	srv := redistest.Start(t)
	c, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{srv.Addr}, DisableCache: true, ForceSingleClient: true})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx := context.Background()
	reply := func(args ...string) error { return c.Do(ctx, c.B().Arbitrary(args...).Build()).Error() }
	tests := []struct {
		name string
		err  error
		want bool
	}{
		{"wrong type", func() error { _ = reply("SET", "k", "v"); return reply("HGET", "k", "f") }(), false},
		{"unknown command", reply("NOSUCHCOMMAND"), false},
		{"not a Redis reply", errors.New("connection refused"), false},
		{"nil", nil, false},
		{"NOREPLICAS", reply("EVAL", "return redis.error_reply('NOREPLICAS Not enough good replicas to write.')", "0"), true},
		{"MOVED", reply("EVAL", "return redis.error_reply('MOVED 1999 127.0.0.1:7001')", "0"), true},
		{"ASK", reply("EVAL", "return redis.error_reply('ASK 1999 127.0.0.1:7001')", "0"), true},
		{"TRYAGAIN", reply("EVAL", "return redis.error_reply('TRYAGAIN Multiple keys request during rehashing of slot')", "0"), true},
		{"CLUSTERDOWN", reply("EVAL", "return redis.error_reply('CLUSTERDOWN The cluster is down')", "0"), true},
		{"ASKING is no ASK", reply("EVAL", "return redis.error_reply('ASKINGX whatever')", "0"), false},
	}
	for _, tc := range tests {
		if got := rediserr.Transient(tc.err); got != tc.want {
			t.Errorf("%s (%v): Transient %v, want %v", tc.name, tc.err, got, tc.want)
		}
	}
}
