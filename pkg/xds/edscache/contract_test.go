package edscache

import (
	"context"
	"slices"
	"sync"
	"testing"

	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	serverv3 "github.com/envoyproxy/go-control-plane/pkg/server/v3"
	"google.golang.org/grpc"

	"github.com/tether-dev/tether/internal/testutil"
)

// TestGoControlPlaneServerContract holds go-control-plane's state-of-the-world ADS server (the
// version in go.mod) to what the endpoint cache, the ACK filter (and pkg/xds's
// state-of-the-world cache) rely on and no go-control-plane documentation promises. An upgrade that changes any of it
// fails here first:
//
//  1. CreateWatch receives the very *DiscoveryRequest the stream's Recv returned, in order (the
//     ACK filter tells whether the last request it passed opened the watch that sent the last
//     response by pointer equality with the response's request, ackFilter.plainACK).
//  2. The previous watch of a type is cancelled before the next request's CreateWatch (the
//     endpoint cache edits the returned-resources map in place only while its watch is open).
//  3. The map GetReturnedResources returned is the next watch's sub.ReturnedResources(), the
//     same map, not a copy (edsWatch.known).
//  4. A stream's responses are sent in the order the caches queued them on the stream's
//     channel, across types (publish pushes new endpoints, then clusters, then the endpoints of
//     changed clusters, and Envoy must receive them in that order).
//  5. OnStreamResponse receives, between GetDiscoveryResponse and the stream's Send of that
//     response, the request that opened the response's watch (resp.GetRequest()) and the
//     response with its nonce set (ackFilter.responded: which request's watch sent what).
//  6. OnStreamOpen receives the stream's Context() (Filters.Callbacks binds the stream's filter,
//     found in it, to the stream id).
func TestGoControlPlaneServerContract(t *testing.T) {
	p := &contractProbe{t: t, record: true, watches: map[string]*contractWatch{}}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	cbs := serverv3.CallbackFuncs{
		StreamOpenFunc: func(ctx context.Context, _ int64, _ string) error {
			if ctx.Value(contractKey{}) == nil {
				t.Error("6: OnStreamOpen did not receive the stream's Context()")
			}
			return nil
		},
		StreamResponseFunc: func(_ context.Context, _ int64, req *discoveryv3.DiscoveryRequest, resp *discoveryv3.DiscoveryResponse) {
			p.mu.Lock()
			defer p.mu.Unlock()
			if w := p.watches[resp.GetTypeUrl()]; p.built != resp || resp.GetNonce() == "" || w == nil || w.req != req {
				p.errs = append(p.errs, "5: OnStreamResponse did not receive the built response, its nonce and its watch's request")
			}
			p.announced = p.built
		},
	}
	gs := grpc.NewServer()
	discoveryv3.RegisterAggregatedDiscoveryServiceServer(gs, contractADS{Server: serverv3.NewServer(ctx, p, cbs), p: p})
	stream := adsStream(ctx, t, gs)
	recv := func() *discoveryv3.DiscoveryResponse {
		t.Helper()
		resp, err := stream.Recv()
		if err != nil {
			t.Fatal(err)
		}
		return resp
	}
	send := func(req *discoveryv3.DiscoveryRequest) {
		t.Helper()
		if err := stream.Send(req); err != nil {
			t.Fatal(err)
		}
	}

	// One watch per type, each answered once with a returned-resources map.
	send(&discoveryv3.DiscoveryRequest{TypeUrl: resource.ClusterType})
	send(&discoveryv3.DiscoveryRequest{TypeUrl: resource.EndpointType, ResourceNames: []string{"a", "b"}})
	p.waitWatches(t, 2)
	p.respond(resource.EndpointType, "e1", map[string]string{"a": "e1", "b": "e1"})
	e1 := recv()
	if e1.GetVersionInfo() != "e1" {
		t.Fatalf("first response %q, want e1", e1.GetVersionInfo())
	}

	// 3: the map handed back is the one returned (an entry set after the response shows).
	p.mu.Lock()
	p.watches[resource.EndpointType].returned["b"] = "edited after the response"
	p.mu.Unlock()
	send(&discoveryv3.DiscoveryRequest{TypeUrl: resource.EndpointType, VersionInfo: "e1", ResponseNonce: e1.GetNonce(), ResourceNames: []string{"a", "b"}})
	p.waitWatches(t, 3)
	p.mu.Lock()
	if got := p.watches[resource.EndpointType].sub.ReturnedResources()["b"]; got != "edited after the response" {
		t.Errorf("3: the next watch's returned resources are not the map the response returned (b = %q)", got)
	}
	p.mu.Unlock()

	// 4: an EDS response queued before a CDS response arrives first.
	p.respond(resource.EndpointType, "e2", map[string]string{"a": "e2", "b": "e2"})
	p.respond(resource.ClusterType, "c1", map[string]string{})
	var got []string
	for range 2 {
		got = append(got, recv().GetVersionInfo())
	}
	if got[0] != "e2" || got[1] != "c1" {
		t.Errorf("4: responses arrived as %v, want [e2 c1], the order they were queued", got)
	}

	p.mu.Lock()
	defer p.mu.Unlock()
	for _, e := range p.errs {
		t.Error(e)
	}
}

type contractKey struct{}

// contractProbe is a cache.Cache that records what the server does and answers on demand.
type contractProbe struct {
	t         *testing.T
	mu        sync.Mutex
	record    bool                      // check contract items 1 and 5 (the stream is a contractStream)
	watches   map[string]*contractWatch // the open watch of each type
	created   int
	passed    []*discoveryv3.DiscoveryRequest // what the stream's Recv returned, in order
	handled   int                             // passed[:handled] have reached CreateWatch
	built     *discoveryv3.DiscoveryResponse  // the last GetDiscoveryResponse result not yet sent
	announced *discoveryv3.DiscoveryResponse  // built, once OnStreamResponse has seen it
	errs      []string
}

type contractWatch struct {
	req       *cache.Request
	sub       cache.Subscription
	out       chan cache.Response
	cancelled bool
	returned  map[string]string
}

func (p *contractProbe) CreateWatch(req *cache.Request, sub cache.Subscription, out chan cache.Response) (func(), error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.record { // TestACKFilterDropsOnlyPlainEDSACKs
	} else if i := slices.Index(p.passed, req); i < 0 || i < p.handled {
		p.errs = append(p.errs, "1: CreateWatch did not receive a request the stream's Recv returned, in order")
	} else {
		p.handled = i + 1
	}
	if old := p.watches[req.GetTypeUrl()]; old != nil && !old.cancelled {
		p.errs = append(p.errs, "2: a watch was still open when the next request of its type came")
	}
	w := &contractWatch{req: req, sub: sub, out: out}
	p.watches[req.GetTypeUrl()] = w
	p.created++
	return func() {
		p.mu.Lock()
		defer p.mu.Unlock()
		w.cancelled = true
	}, nil
}

func (p *contractProbe) CreateDeltaWatch(*cache.DeltaRequest, cache.Subscription, chan cache.DeltaResponse) (func(), error) {
	return func() {}, nil
}

func (p *contractProbe) Fetch(context.Context, *cache.Request) (cache.Response, error) {
	return nil, nil
}

func (p *contractProbe) waitWatches(t *testing.T, n int) {
	t.Helper()
	testutil.Eventually(t, "the server's watches", func() bool {
		p.mu.Lock()
		defer p.mu.Unlock()
		return p.created >= n
	})
}

// respond queues a response on the open watch of typ.
func (p *contractProbe) respond(typ, version string, returned map[string]string) {
	p.mu.Lock()
	w := p.watches[typ]
	w.returned = returned
	p.mu.Unlock()
	w.out <- &contractResponse{p: p, req: w.req, version: version, returned: returned}
}

type contractResponse struct {
	p        *contractProbe
	req      *cache.Request
	version  string
	returned map[string]string
}

func (r *contractResponse) GetDiscoveryResponse() (*discoveryv3.DiscoveryResponse, error) {
	out := &discoveryv3.DiscoveryResponse{VersionInfo: r.version, TypeUrl: r.req.GetTypeUrl()}
	r.p.mu.Lock()
	defer r.p.mu.Unlock()
	if !r.p.record {
		return out, nil
	}
	if r.p.built != nil {
		r.p.errs = append(r.p.errs, "5: a second response was built before the first was sent")
	}
	r.p.built = out
	return out, nil
}
func (r *contractResponse) GetRequest() *discoveryv3.DiscoveryRequest { return r.req }
func (r *contractResponse) GetVersion() (string, error)               { return r.version, nil }
func (r *contractResponse) GetResponseVersion() string                { return r.version }
func (r *contractResponse) GetReturnedResources() map[string]string   { return r.returned }
func (r *contractResponse) GetContext() context.Context               { return context.Background() }

// contractADS wraps every stream as tether's adsServer does.
type contractADS struct {
	serverv3.Server
	p *contractProbe
}

func (s contractADS) StreamAggregatedResources(stream discoveryv3.AggregatedDiscoveryService_StreamAggregatedResourcesServer) error {
	return s.Server.StreamAggregatedResources(&contractStream{
		AggregatedDiscoveryService_StreamAggregatedResourcesServer: stream,
		p: s.p, ctx: context.WithValue(stream.Context(), contractKey{}, true),
	})
}

type contractStream struct {
	discoveryv3.AggregatedDiscoveryService_StreamAggregatedResourcesServer
	p   *contractProbe
	ctx context.Context
}

func (s *contractStream) Context() context.Context { return s.ctx }

func (s *contractStream) Recv() (*discoveryv3.DiscoveryRequest, error) {
	req, err := s.AggregatedDiscoveryService_StreamAggregatedResourcesServer.Recv()
	if err == nil {
		s.p.mu.Lock()
		s.p.passed = append(s.p.passed, req)
		s.p.mu.Unlock()
	}
	return req, err
}

func (s *contractStream) Send(resp *discoveryv3.DiscoveryResponse) error {
	s.p.mu.Lock()
	if s.p.built != resp || s.p.announced != resp {
		s.p.errs = append(s.p.errs, "5: Send did not receive the response built and announced to OnStreamResponse")
	}
	s.p.built, s.p.announced = nil, nil
	s.p.mu.Unlock()
	return s.AggregatedDiscoveryService_StreamAggregatedResourcesServer.Send(resp)
}
