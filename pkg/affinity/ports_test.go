package affinity_test

import (
	"strconv"
	"testing"

	"github.com/tether-dev/tether/pkg/affinity"
	"github.com/tether-dev/tether/pkg/affinity/affinitytest"
	"github.com/tether-dev/tether/pkg/registry"
)

// TestOnlyInstancesWithTheProtocolsPort (#14 finding 4): on a service mixing HTTP-only,
// SIP-only and dual-port instances, SIP decisions never pick an instance without a SIP port,
// and HTTP requests (sessionless, hashed or new sessions) never one without an HTTP port.
func TestOnlyInstancesWithTheProtocolsPort(t *testing.T) {
	mixed := func(service string) []registry.Instance {
		in := affinitytest.Instances(service, 6)
		in[0].SIPPort, in[1].SIPPort = 0, 0   // i1, i2: HTTP only
		in[2].HTTPPort, in[3].HTTPPort = 0, 0 // i3, i4: SIP only
		return in
	}
	for _, tc := range []struct {
		name string
		svc  registry.Service
	}{
		{"hash", affinitytest.Service("s", registry.AffinityHash)},
		{"none round robin", affinitytest.Service("s", registry.AffinityNone)},
		{"none consistent hash", func() registry.Service {
			s := affinitytest.Service("s", registry.AffinityNone)
			s.Balancing = registry.BalanceConsistentHash
			return s
		}()},
		{"cookie", affinitytest.Service("s", registry.AffinityCookie)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			insts := mixed("s")
			if tc.svc.Affinity == registry.AffinityCookie {
				for i := range insts {
					insts[i].SIPPort = 0
				}
			}
			f := affinitytest.New(t, []registry.Service{tc.svc}, insts)
			byID := map[string]registry.Instance{}
			for _, in := range insts {
				byID[in.ID] = in
			}
			for i := range 60 {
				req := affinitytest.HTTP("s", "GET", "/")
				req.Peer = "192.0.2.1:" + strconv.Itoa(40000+i)
				d := mustDecide(t, f, req)
				if in := byID[d.Instance().ID]; in.HTTPPort == 0 {
					t.Fatalf("HTTP request %d routed to %s, which has no HTTP port", i, in.ID)
				}
				d.End()
				if !affinity.Serves(tc.svc, affinity.ProtocolSIP) {
					continue
				}
				sip := sipInvite("s")
				sip.Headers["call-id"] = []string{"call-" + strconv.Itoa(i) + "@example.com"}
				sip.Headers["from"] = []string{"<sip:alice@example.com>;tag=t" + strconv.Itoa(i)}
				sd := mustDecide(t, f, sip)
				if in := byID[sd.Instance().ID]; in.SIPPort == 0 {
					t.Fatalf("SIP decision %d chose %s, which has no SIP port", i, in.ID)
				}
				sd.End()
			}
		})
	}
}
