package edscache

import (
	"context"
	"slices"
	"sync"
	"testing"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	serverv3 "github.com/envoyproxy/go-control-plane/pkg/server/v3"
	"google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	"github.com/tether-dev/tether/internal/testutil"
)

// TestACKFilterDropsOnlyPlainEDSACKs runs the ACK filter in front of go-control-plane's real
// ADS server and counts the watches the server opens: a plain ACK (names in any order) opens
// none and is still reported (NewFilters' dropped); a NACK and a changed subscription reach the
// server.
func TestACKFilterDropsOnlyPlainEDSACKs(t *testing.T) {
	t.Run("wire codec", func(t *testing.T) { testACKFilter(t, true) })
	t.Run("grpc's proto codec", func(t *testing.T) { testACKFilter(t, false) }) // a server without ServerOption
}

func testACKFilter(t *testing.T, codec bool) {
	p := &contractProbe{t: t, watches: map[string]*contractWatch{}}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var (
		mu    sync.Mutex
		acked []string // versions of the dropped ACKs
		nodes []string // and the node ids they reported
	)
	filters := NewFilters(func(_ int64, req *discoveryv3.DiscoveryRequest) {
		mu.Lock()
		defer mu.Unlock()
		acked = append(acked, req.GetVersionInfo())
		nodes = append(nodes, req.GetNode().GetId())
	})
	var opts []grpc.ServerOption
	if codec {
		opts = append(opts, filters.ServerOption())
	}
	gs := grpc.NewServer(opts...)
	discoveryv3.RegisterAggregatedDiscoveryServiceServer(gs, filteredADS{Server: serverv3.NewServer(ctx, p, filters.Callbacks(serverv3.CallbackFuncs{})), filters: filters})
	stream := adsStream(ctx, t, gs)
	send := func(req *discoveryv3.DiscoveryRequest) {
		t.Helper()
		if err := stream.Send(req); err != nil {
			t.Fatal(err)
		}
	}
	respond := func(version string) *discoveryv3.DiscoveryResponse {
		t.Helper()
		p.respond(resource.EndpointType, version, map[string]string{})
		resp, err := stream.Recv()
		if err != nil {
			t.Fatal(err)
		}
		return resp
	}
	watches := func() int {
		p.mu.Lock()
		defer p.mu.Unlock()
		return p.created
	}
	dropped := func(version string) bool {
		mu.Lock()
		defer mu.Unlock()
		return slices.Contains(acked, version)
	}

	// The first request names no node; the first ACK does, and reports it (the node status binds
	// a stream to its node from the first request that names one).
	send(&discoveryv3.DiscoveryRequest{TypeUrl: resource.EndpointType, ResourceNames: []string{"a", "b"}})
	p.waitWatches(t, 1)
	r1 := respond("v1")
	// A plain ACK, names reordered: dropped, recorded. The changed subscription that follows
	// reaches the server as its second watch (had the ACK gone through, it would be the third).
	send(&discoveryv3.DiscoveryRequest{Node: &corev3.Node{Id: "n"}, TypeUrl: resource.EndpointType, VersionInfo: "v1", ResponseNonce: r1.GetNonce(), ResourceNames: []string{"b", "a"}})
	testutil.Eventually(t, "the ACK dropped", func() bool { return dropped("v1") })
	send(&discoveryv3.DiscoveryRequest{TypeUrl: resource.EndpointType, VersionInfo: "v1", ResponseNonce: r1.GetNonce(), ResourceNames: []string{"a", "b", "c"}})
	testutil.Eventually(t, "the changed subscription's watch", func() bool {
		p.mu.Lock()
		defer p.mu.Unlock()
		return len(p.watches[resource.EndpointType].req.GetResourceNames()) == 3
	})

	// A NACK of the next response goes through.
	r2 := respond("v2")
	send(&discoveryv3.DiscoveryRequest{TypeUrl: resource.EndpointType, VersionInfo: "v1", ResponseNonce: r2.GetNonce(),
		ResourceNames: []string{"a", "b", "c"}, ErrorDetail: &status.Status{Message: "no"}})
	p.waitWatches(t, 3)

	// The ACK of the response after the NACK is plain again (the NACK's watch sent it).
	r3 := respond("v3")
	send(&discoveryv3.DiscoveryRequest{TypeUrl: resource.EndpointType, VersionInfo: "v3", ResponseNonce: r3.GetNonce(), ResourceNames: []string{"a", "b", "c"}})
	testutil.Eventually(t, "the ACK of v3 dropped", func() bool { return dropped("v3") })
	send(&discoveryv3.DiscoveryRequest{TypeUrl: resource.EndpointType, VersionInfo: "v3", ResponseNonce: r3.GetNonce(), ResourceNames: []string{"a"}})
	// The server handles a stream's requests in order: once the last one has its watch, every
	// request that reached the server has one.
	testutil.Eventually(t, "the last request's watch", func() bool {
		p.mu.Lock()
		defer p.mu.Unlock()
		return len(p.watches[resource.EndpointType].req.GetResourceNames()) == 1
	})
	if n := watches(); n != 4 {
		t.Errorf("the server opened %d watches, want 4 (first request, changed subscription, NACK, changed subscription)", n)
	}
	mu.Lock()
	if !slices.Equal(nodes, []string{"n", ""}) {
		t.Errorf("dropped ACKs reported nodes %q, want [n, none]", nodes)
	}
	mu.Unlock()
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, e := range p.errs {
		t.Error(e)
	}
}

// filteredADS is go-control-plane's ADS server behind the filters, as tether's xds.Server runs it.
type filteredADS struct {
	serverv3.Server
	filters *Filters
}

func (s filteredADS) StreamAggregatedResources(stream discoveryv3.AggregatedDiscoveryService_StreamAggregatedResourcesServer) error {
	return s.Server.StreamAggregatedResources(s.filters.Wrap(stream))
}

// parseACK reads a request's wire form the way proto decodes it, and refuses whatever a plain
// EDS ACK cannot hold.
func TestParseACKReadsTheWireFormLikeProto(t *testing.T) {
	names := []string{"svc-b", "svc-a", "svc-c"}
	ack := &discoveryv3.DiscoveryRequest{TypeUrl: resource.EndpointType, VersionInfo: "v1", ResponseNonce: "7", ResourceNames: names}
	withNode := proto.Clone(ack).(*discoveryv3.DiscoveryRequest)
	withNode.Node = &corev3.Node{Id: "n", Cluster: "c"}
	nack := proto.Clone(ack).(*discoveryv3.DiscoveryRequest)
	nack.ErrorDetail = &status.Status{Message: "no"}
	cds := proto.Clone(ack).(*discoveryv3.DiscoveryRequest)
	cds.TypeUrl = resource.ClusterType
	wire := func(m proto.Message) []byte {
		b, err := proto.Marshal(m)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	nodeTwice := append(wire(withNode), protowire.AppendBytes(protowire.AppendTag(nil, 2, protowire.BytesType), wire(&corev3.Node{Id: "m"}))...)
	versionTwice := append(wire(ack), protowire.AppendString(protowire.AppendTag(nil, 1, protowire.BytesType), "v2")...)
	unknown := protowire.AppendString(protowire.AppendTag(wire(ack), 99, protowire.BytesType), "x")
	plain := wire(ack)
	for _, tc := range []struct {
		name    string
		b       []byte
		ok      bool
		version string
		node    bool
	}{
		{"plain ACK", plain, true, "v1", false},
		{"with node", wire(withNode), true, "v1", true},
		{"version twice: the last counts", versionTwice, true, "v2", false},
		{"NACK", wire(nack), false, "", false},
		{"CDS", wire(cds), false, "", false},
		{"node twice (proto merges)", nodeTwice, false, "", false},
		{"unknown field", unknown, false, "", false},
		{"truncated", plain[:len(plain)-1], false, "", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, ok := parseACK(tc.b)
			if ok != tc.ok {
				t.Fatalf("parseACK ok = %v, want %v", ok, tc.ok)
			}
			if !ok {
				return
			}
			var req discoveryv3.DiscoveryRequest
			if err := proto.Unmarshal(tc.b, &req); err != nil {
				t.Fatal(err)
			}
			if string(got.version) != tc.version || string(got.version) != req.GetVersionInfo() || string(got.nonce) != req.GetResponseNonce() ||
				got.count != len(req.GetResourceNames()) || (got.node != nil) != tc.node {
				t.Errorf("parseACK = version %q nonce %q %d names node %v; proto: %q %q %d names node %v",
					got.version, got.nonce, got.count, got.node != nil, req.GetVersionInfo(), req.GetResponseNonce(), len(req.GetResourceNames()), req.GetNode() != nil)
			}
			var read []string
			wireNames(got.wire, func(b []byte) bool { read = append(read, string(b)); return true })
			if !slices.Equal(read, req.GetResourceNames()) {
				t.Errorf("wireNames read %q, proto %q", read, req.GetResourceNames())
			}
			set := newNameSet(names)
			if !set.equalWire(names, got.wire, got.count) || !set.equalWire([]string{"svc-a", "svc-b", "svc-c"}, got.wire, got.count) {
				t.Error("equalWire: the same names, in order or not, are not equal")
			}
			if other := newNameSet([]string{"svc-a", "svc-b", "svc-d"}); other.equalWire([]string{"svc-a", "svc-b", "svc-d"}, got.wire, got.count) {
				t.Error("equalWire: different names are equal")
			}
		})
	}
}
