package redistest_test

import (
	"strconv"
	"testing"
	"time"

	"github.com/tether-dev/tether/internal/redistest"
)

// TestClusterFailover: a Cluster of three primaries with a replica each covers every slot; a
// primary killed (kill -9) is failed over to its replica, which then serves its slots.
func TestClusterFailover(t *testing.T) {
	c := redistest.StartClusterWith(t, redistest.ClusterOptions{Replicas: 1, NodeTimeout: time.Second})
	primaries, err := c.Primaries()
	if err != nil || len(primaries) != 3 {
		t.Fatalf("primaries %v, %v: want 3", primaries, err)
	}
	for _, key := range []string{"a", "tether:{web}:s:1", "x{}y", "{}", "foo{bar}{zap}", "user1000"} {
		out, err := c.Nodes[0].Do("CLUSTER", "KEYSLOT", key)
		if err != nil {
			t.Fatal(err)
		}
		if want, _ := strconv.Atoi(out); redistest.KeySlot(key) != want {
			t.Errorf("KeySlot(%q) = %d, CLUSTER KEYSLOT says %d", key, redistest.KeySlot(key), want)
		}
	}
	const key = "tether:{web}:s:1"
	p, err := c.PrimaryOf(key)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := p.Do("SET", key, "v"); err != nil {
		t.Fatal(err)
	}
	reps, err := c.ReplicasOf(p)
	if err != nil || len(reps) != 1 {
		t.Fatalf("replicas of %s: %v, %v; want 1", p.Addr, reps, err)
	}
	if _, err := p.Do("WAIT", "1", "5000"); err != nil {
		t.Fatal(err)
	}
	c.Kill(p)
	if err := c.WaitHealthy(2 * time.Minute); err != nil {
		t.Fatalf("after the kill: %v", err)
	}
	np, err := c.PrimaryOf(key)
	if err != nil || np != reps[0] {
		t.Fatalf("after the kill, %s serves the key (%v); want its replica %s", addrOf(np), err, reps[0].Addr)
	}
	if v, err := np.Do("GET", key); err != nil || v != "v" {
		t.Errorf("GET on the promoted replica: %q, %v", v, err)
	}
}

func addrOf(s *redistest.Server) string {
	if s == nil {
		return "none"
	}
	return s.Addr
}
