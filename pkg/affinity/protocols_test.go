package affinity_test

import (
	"context"
	"testing"

	"github.com/tether-dev/tether/pkg/affinity"
	"github.com/tether-dev/tether/pkg/affinity/affinitytest"
	"github.com/tether-dev/tether/pkg/registry"
	"github.com/tether-dev/tether/pkg/session"
)

// sipInvite is a SIP INVITE for service svc, carried as fields (no raw message).
func sipInvite(svc string) affinity.Request {
	return affinity.Request{Service: svc, Protocol: affinity.ProtocolSIP, Method: "INVITE", Path: "sip:bob@example.com",
		Peer: "192.0.2.7:5060", Headers: map[string][]string{
			"from":    {"<sip:alice@example.com>;tag=a1"},
			"to":      {"<sip:bob@example.com>"},
			"call-id": {"call-1@example.com"},
		}}
}

// TestProtocolModeTable decides one request of each protocol on a service of each mode: every
// pair is decided or refused with the documented rejection (ProtocolNotSupported, a
// ClassBadRequest), and a refused pair leaves no session and holds no slot.
func TestProtocolModeTable(t *testing.T) {
	type mode struct {
		name      string
		affinity  registry.AffinityMode
		balancing registry.Balancing
		sip       bool // serves SIP
	}
	modes := []mode{
		{"none", registry.AffinityNone, registry.BalanceRoundRobin, true},
		{"none/least-request", registry.AffinityNone, registry.BalanceLeastRequest, true},
		{"none/consistent-hash", registry.AffinityNone, registry.BalanceConsistentHash, true},
		{"sticky-round-robin", registry.AffinityNone, registry.BalanceStickyRoundRobin, false},
		{"cookie", registry.AffinityCookie, "", false},
		{"header", registry.AffinityHeader, "", false},
		{"mcp-streamable", registry.AffinityMCPStreamable, "", false},
		{"mcp-sse", registry.AffinityMCPSSE, "", false},
		{"hash", registry.AffinityHash, "", true},
	}
	for _, m := range modes {
		for _, proto := range []affinity.Protocol{affinity.ProtocolHTTP, affinity.ProtocolSIP} {
			t.Run(m.name+"/"+string(proto), func(t *testing.T) {
				svc := affinitytest.Service("s", m.affinity)
				if m.balancing != "" {
					svc.Balancing = m.balancing
				}
				f := affinitytest.New(t, []registry.Service{svc}, affinitytest.Instances("s", 2))
				if got := affinity.Serves(svc, proto); got != (proto == affinity.ProtocolHTTP || m.sip) {
					t.Errorf("Serves(%s, %s) = %v", m.name, proto, got)
				}
				req := affinitytest.HTTP("s", "GET", "/")
				if m.affinity == registry.AffinityMCPSSE {
					req.Path = "/sse"
				}
				if proto == affinity.ProtocolSIP {
					req = sipInvite("s")
				}
				if proto == affinity.ProtocolHTTP || m.sip {
					d := mustDecide(t, f, req)
					if d.Instance().ID == "" {
						t.Fatal("decided without an instance")
					}
					d.End()
					return
				}
				rej := rejection(t, f, req, affinity.ClassBadRequest)
				if rej.Code != "ProtocolNotSupported" {
					t.Errorf("rejection code %q, want ProtocolNotSupported", rej.Code)
				}
				list, _, err := f.Store.List(context.Background(), session.Filter{}, "", 100)
				if err != nil || len(list) != 0 {
					t.Errorf("sessions after a refused SIP decision: %v, %v; want none", list, err)
				}
				for id, u := range f.Usage(t, "s") {
					if u != [2]int{} {
						t.Errorf("instance %s holds %d sessions and %d requests after a refused SIP decision", id, u[0], u[1])
					}
				}
			})
		}
	}
}
