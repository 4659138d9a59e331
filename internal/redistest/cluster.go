package redistest

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

// NumSlots is the number of Redis Cluster hash slots.
const NumSlots = 16384

// ClusterOptions shape a Cluster.
type ClusterOptions struct {
	// Replicas is the number of replicas each of the three primaries gets (0: none).
	Replicas int
	// NodeTimeout is cluster-node-timeout: how long a primary may not answer before its
	// replica fails it over (default 2 s; a loaded test machine fails nodes over spuriously
	// well below a second).
	NodeTimeout time.Duration
	// Options add redis-server configuration to every node.
	Options []Option
}

// Cluster is a Redis Cluster of three primaries (each with ClusterOptions.Replicas replicas)
// on loopback, every process on an ephemeral port.
type Cluster struct {
	t     testing.TB
	Nodes []*Server
	ids   map[*Server]string // node id (CLUSTER MYID)
	dead  map[*Server]bool   // killed by Kill and not restarted
}

// Addrs returns the nodes' addresses (every one is a seed for a client).
func (c *Cluster) Addrs() []string {
	out := make([]string, len(c.Nodes))
	for i, n := range c.Nodes {
		out[i] = n.Addr
	}
	return out
}

// StartCluster runs three cluster-enabled redis-servers, joins them into one Cluster covering
// every slot and waits until it is healthy (StartClusterWith with no replicas).
func StartCluster(t testing.TB) *Cluster {
	t.Helper()
	return StartClusterWith(t, ClusterOptions{})
}

// StartClusterWith runs 3 × (1 + o.Replicas) cluster-enabled redis-servers, creates the
// Cluster with redis-cli --cluster create (three primaries; every replica may fail over,
// cluster-replica-validity-factor 0) and waits until it is healthy (WaitHealthy).
func StartClusterWith(t testing.TB, o ClusterOptions) *Cluster {
	t.Helper()
	Require(t)
	timeout := o.NodeTimeout
	if timeout <= 0 {
		timeout = 2 * time.Second
	}
	var extra []string
	for _, opt := range o.Options {
		opt(&extra)
	}
	c := &Cluster{t: t, ids: map[*Server]string{}, dead: map[*Server]bool{}}
	for range 3 * (1 + o.Replicas) {
		args := append([]string{"--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
			"--cluster-node-timeout", strconv.FormatInt(timeout.Milliseconds(), 10),
			"--cluster-replica-validity-factor", "0"}, extra...)
		c.Nodes = append(c.Nodes, start(t, ServerBin, t.TempDir(), args, ""))
	}
	args := append([]string{"--cluster", "create"}, c.Addrs()...)
	args = append(args, "--cluster-replicas", strconv.Itoa(o.Replicas), "--cluster-yes")
	if _, err := cli(c.Nodes[0].Addr, args...); err != nil {
		t.Fatalf("redistest: creating the cluster: %v", err)
	}
	for _, n := range c.Nodes {
		id, err := n.Do("CLUSTER", "MYID")
		if err != nil {
			t.Fatalf("redistest: CLUSTER MYID of %s: %v", n.Addr, err)
		}
		c.ids[n] = id
	}
	if err := c.WaitHealthy(time.Minute); err != nil {
		t.Fatalf("redistest: the new cluster: %v", err)
	}
	return c
}

// ClusterNode is one line of CLUSTER NODES.
type ClusterNode struct {
	ID, Addr  string
	Primary   bool
	PrimaryID string // of a replica
	Failed    bool   // flagged fail (or fail?: suspected)
	Slots     [][2]int
}

// Topology returns the Cluster as the live node seen says it is (CLUSTER NODES).
func (c *Cluster) Topology(seen *Server) ([]ClusterNode, error) {
	out, err := seen.Do("CLUSTER", "NODES")
	if err != nil {
		return nil, err
	}
	var nodes []ClusterNode
	for line := range strings.SplitSeq(out, "\n") {
		f := strings.Fields(line)
		if len(f) < 8 {
			continue
		}
		addr, _, _ := strings.Cut(f[1], "@")
		flags := strings.Split(f[2], ",")
		n := ClusterNode{ID: f[0], Addr: addr, Primary: slices.Contains(flags, "master"),
			Failed: slices.Contains(flags, "fail") || slices.Contains(flags, "fail?")}
		if f[3] != "-" {
			n.PrimaryID = f[3]
		}
		for _, r := range f[8:] {
			if strings.HasPrefix(r, "[") {
				continue // a slot being migrated
			}
			lo, hi, found := strings.Cut(r, "-")
			a, err := strconv.Atoi(lo)
			if err != nil {
				return nil, fmt.Errorf("CLUSTER NODES of %s: slot range %q", seen.Addr, r)
			}
			b := a
			if found {
				if b, err = strconv.Atoi(hi); err != nil {
					return nil, fmt.Errorf("CLUSTER NODES of %s: slot range %q", seen.Addr, r)
				}
			}
			n.Slots = append(n.Slots, [2]int{a, b})
		}
		nodes = append(nodes, n)
	}
	return nodes, nil
}

// Live returns the nodes not killed.
func (c *Cluster) Live() []*Server {
	var out []*Server
	for _, n := range c.Nodes {
		if !c.dead[n] {
			out = append(out, n)
		}
	}
	return out
}

func (c *Cluster) byID(id string) *Server {
	for s, x := range c.ids {
		if x == id {
			return s
		}
	}
	return nil
}

// Primaries returns the live nodes that serve slots, as the first live node sees the Cluster.
func (c *Cluster) Primaries() ([]*Server, error) {
	live := c.Live()
	if len(live) == 0 {
		return nil, fmt.Errorf("no live node")
	}
	nodes, err := c.Topology(live[0])
	if err != nil {
		return nil, err
	}
	var out []*Server
	for _, n := range nodes {
		if s := c.byID(n.ID); s != nil && n.Primary && len(n.Slots) > 0 && !c.dead[s] {
			out = append(out, s)
		}
	}
	return out, nil
}

// PrimaryOf returns the live node that serves key's slot (as the first live node sees it).
func (c *Cluster) PrimaryOf(key string) (*Server, error) {
	slot := KeySlot(key)
	live := c.Live()
	if len(live) == 0 {
		return nil, fmt.Errorf("no live node")
	}
	nodes, err := c.Topology(live[0])
	if err != nil {
		return nil, err
	}
	for _, n := range nodes {
		if !n.Primary {
			continue
		}
		for _, r := range n.Slots {
			if slot >= r[0] && slot <= r[1] {
				if s := c.byID(n.ID); s != nil && !c.dead[s] {
					return s, nil
				}
				return nil, fmt.Errorf("slot %d is served by %s, which is not live", slot, n.Addr)
			}
		}
	}
	return nil, fmt.Errorf("slot %d is served by no primary", slot)
}

// ReplicasOf returns the live replicas of a primary.
func (c *Cluster) ReplicasOf(primary *Server) ([]*Server, error) {
	nodes, err := c.Topology(primary)
	if err != nil {
		return nil, err
	}
	var out []*Server
	for _, n := range nodes {
		if s := c.byID(n.ID); s != nil && !n.Primary && n.PrimaryID == c.ids[primary] && !c.dead[s] {
			out = append(out, s)
		}
	}
	return out, nil
}

// Kill ends a node with SIGKILL (a crash) and waits for it; the Cluster's replica of a
// killed primary fails it over after the node timeout.
func (c *Cluster) Kill(s *Server) {
	c.dead[s] = true
	s.Kill()
}

// Restart starts a killed node again on its port and directory (its nodes.conf: a killed
// primary that was failed over comes back as a replica).
func (c *Cluster) Restart(s *Server) {
	s.Restart()
	delete(c.dead, s)
}

// WaitHealthy waits until every live node reports cluster_state:ok with all 16384 slots ok,
// sees every slot served by a live primary that it does not flag as failed, and every live
// replica's link to its primary is up; it returns the last thing missing on timeout.
func (c *Cluster) WaitHealthy(timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		err := c.healthy()
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return err
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func (c *Cluster) healthy() error {
	for _, n := range c.Live() {
		info, err := n.Do("CLUSTER", "INFO")
		if err != nil {
			return err
		}
		if !strings.Contains(info, "cluster_state:ok") || !strings.Contains(info, "cluster_slots_ok:16384") {
			return fmt.Errorf("%s: %s", n.Addr, strings.ReplaceAll(info, "\r\n", " "))
		}
		nodes, err := c.Topology(n)
		if err != nil {
			return err
		}
		covered := 0
		for _, x := range nodes {
			s := c.byID(x.ID)
			if x.Primary && len(x.Slots) > 0 && (s == nil || c.dead[s] || x.Failed) {
				return fmt.Errorf("%s sees slots on %s, which is not live", n.Addr, x.Addr)
			}
			for _, r := range x.Slots {
				covered += r[1] - r[0] + 1
			}
			if !x.Primary && s == n {
				repl, err := n.Do("INFO", "replication")
				if err != nil {
					return err
				}
				if !strings.Contains(repl, "master_link_status:up") {
					return fmt.Errorf("replica %s: link to its primary not up", n.Addr)
				}
			}
		}
		if covered != NumSlots {
			return fmt.Errorf("%s sees %d of %d slots served", n.Addr, covered, NumSlots)
		}
	}
	return nil
}

// KeySlot is the Cluster hash slot of a key (CRC16 of its hash tag, or of the whole key,
// modulo 16384), as CLUSTER KEYSLOT computes it.
func KeySlot(key string) int {
	if i := strings.IndexByte(key, '{'); i >= 0 {
		if j := strings.IndexByte(key[i+1:], '}'); j > 0 {
			key = key[i+1 : i+1+j]
		}
	}
	return int(crc16(key)) % NumSlots
}

// crc16 is CRC-16/XMODEM (polynomial 0x1021, initial 0), the Cluster's key hash.
func crc16(s string) uint16 {
	var crc uint16
	for i := range len(s) {
		crc ^= uint16(s[i]) << 8
		for range 8 {
			if crc&0x8000 != 0 {
				crc = crc<<1 ^ 0x1021
			} else {
				crc <<= 1
			}
		}
	}
	return crc
}
