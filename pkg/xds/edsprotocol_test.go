package xds_test

import (
	"slices"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/genproto/googleapis/rpc/status"

	"github.com/tether-dev/tether/pkg/registry"
	"github.com/tether-dev/tether/pkg/xds"
)

// rawEDS is a raw SotW ADS stream for EDS alone, driven step by step by a test.
type rawEDS struct {
	t      *testing.T
	stream discoveryv3.AggregatedDiscoveryService_StreamAggregatedResourcesClient
	resps  chan *discoveryv3.DiscoveryResponse
}

func openRawEDS(t *testing.T, f *fixture, node string, names ...string) *rawEDS {
	t.Helper()
	s, err := discoveryv3.NewAggregatedDiscoveryServiceClient(f.conn).StreamAggregatedResources(waitCtx(t))
	if err != nil {
		t.Fatal(err)
	}
	r := &rawEDS{t: t, stream: s, resps: make(chan *discoveryv3.DiscoveryResponse, 16)}
	go func() {
		defer close(r.resps)
		for {
			m, err := s.Recv()
			if err != nil {
				return
			}
			r.resps <- m
		}
	}()
	r.send(&discoveryv3.DiscoveryRequest{Node: &corev3.Node{Id: node, UserAgentName: "envoy"}, TypeUrl: resource.EndpointType, ResourceNames: names})
	return r
}

func (r *rawEDS) send(req *discoveryv3.DiscoveryRequest) {
	r.t.Helper()
	if err := r.stream.Send(req); err != nil {
		r.t.Fatal(err)
	}
}

// next returns the next response (not acknowledged).
func (r *rawEDS) next() *discoveryv3.DiscoveryResponse {
	r.t.Helper()
	select {
	case m, ok := <-r.resps:
		if !ok {
			r.t.Fatal("stream closed")
		}
		return m
	case <-time.After(10 * time.Second):
		r.t.Fatal("no EDS response within 10s")
		return nil
	}
}

func (r *rawEDS) ack(m *discoveryv3.DiscoveryResponse, names ...string) {
	r.t.Helper()
	r.send(&discoveryv3.DiscoveryRequest{TypeUrl: resource.EndpointType, VersionInfo: m.GetVersionInfo(), ResponseNonce: m.GetNonce(), ResourceNames: names})
}

// claNames lists the CLAs of an EDS response, sorted.
func claNames(t *testing.T, m *discoveryv3.DiscoveryResponse) []string {
	t.Helper()
	var out []string
	for _, a := range m.GetResources() {
		cla := &endpointv3.ClusterLoadAssignment{}
		if err := a.UnmarshalTo(cla); err != nil {
			t.Fatal(err)
		}
		out = append(out, cla.GetClusterName())
	}
	slices.Sort(out)
	return out
}

// TestEDSProtocolSotW drives tether's endpoint cache (through go-control-plane's server and
// tether's ACK filter) with a raw SotW stream, one request at a time: plain ACKs keep the stream
// subscribed (the next change still arrives), a changed subscription with the ACK brings exactly
// the newly subscribed CLAs, a NACKed version is not sent again, responses may follow one
// another without an ACK in between, a request with a stale nonce changes nothing and the next
// one that acknowledges the latest response applies its names, and the node status records the
// filtered ACKs.
func TestEDSProtocolSotW(t *testing.T) {
	f := start(t, append(baseServices(), registry.Service{Name: "docs", Match: registry.Match{PathPrefix: "/docs"}}),
		append(baseInstances(), registry.Instance{Service: "docs", ID: "docs-1", Address: "127.0.0.1", HTTPPort: 8100}))
	r := openRawEDS(t, f, "raw", "web")
	flip := func(id string, h registry.Health) {
		t.Helper()
		if _, err := f.reg.SetHealth(registry.Key{Service: id[:len(id)-2], ID: id}, h); err != nil {
			t.Fatal(err)
		}
	}

	m := r.next()
	if got := claNames(t, m); !slices.Equal(got, []string{"web"}) {
		t.Fatalf("first response %v, want web", got)
	}
	r.ack(m, "web")

	// A plain ACK keeps the subscription: the next change arrives.
	flip("web-1", registry.HealthUnhealthy)
	m = r.next()
	if got := claNames(t, m); !slices.Equal(got, []string{"web"}) {
		t.Fatalf("after a change: %v, want web", got)
	}
	webOnly := m.GetVersionInfo()

	// The ACK widens the subscription: only the new CLA comes.
	r.ack(m, "web", "api")
	m = r.next()
	if got := claNames(t, m); !slices.Equal(got, []string{"api"}) {
		t.Fatalf("after subscribing to api: %v, want api", got)
	}
	if m.GetVersionInfo() == webOnly {
		t.Error("version_info did not change with what the client holds")
	}
	r.ack(m, "web", "api")

	// A NACK: the rejected version is not sent again; the next change is.
	flip("web-2", registry.HealthUnhealthy)
	m = r.next()
	rejected := m.GetVersionInfo()
	r.send(&discoveryv3.DiscoveryRequest{TypeUrl: resource.EndpointType, VersionInfo: webOnly, ResponseNonce: m.GetNonce(),
		ResourceNames: []string{"web", "api"}, ErrorDetail: &status.Status{Message: "rejected by the test"}})
	flip("api-1", registry.HealthUnhealthy)
	m = r.next()
	if got := claNames(t, m); !slices.Equal(got, []string{"api"}) {
		t.Fatalf("after a NACK and an api change: %v, want api alone (the NACKed web not re-sent)", got)
	}
	if m.GetVersionInfo() == rejected {
		t.Error("the NACKed version_info was sent again")
	}

	// Without an ACK the stream still gets the next change; a request naming docs with the older
	// nonce is stale and changes nothing; acknowledging the latest with the same names applies them.
	older := m
	flip("web-1", registry.HealthHealthy)
	latest := r.next()
	if got := claNames(t, latest); !slices.Equal(got, []string{"web"}) {
		t.Fatalf("second response without an ACK: %v, want web", got)
	}
	r.ack(older, "web", "api", "docs") // stale nonce: ignored
	r.ack(latest, "web", "api", "docs")
	m = r.next()
	if got := claNames(t, m); !slices.Equal(got, []string{"docs"}) {
		t.Fatalf("after subscribing to docs: %v, want docs", got)
	}
	r.ack(m, "web", "api", "docs")
	waitStatus(t, f.srv, func(st []xds.NodeStatus) bool {
		for _, n := range st {
			for _, ts := range n.Types {
				if n.ID == "raw" && ts.TypeURL == resource.EndpointType && ts.AckedVersion == m.GetVersionInfo() {
					return true
				}
			}
		}
		return false
	})
}
