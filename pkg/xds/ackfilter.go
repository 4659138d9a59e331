package xds

import (
	"context"
	"sync"
	"sync/atomic"

	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	serverv3 "github.com/envoyproxy/go-control-plane/pkg/server/v3"
)

// adsServer is go-control-plane's ADS server with tether's ACK filter on every
// state-of-the-world stream.
type adsServer struct {
	serverv3.Server
	cache   *endpointCache
	tracker *tracker
}

func (s adsServer) StreamAggregatedResources(stream discoveryv3.AggregatedDiscoveryService_StreamAggregatedResourcesServer) error {
	f := &ackFilter{AggregatedDiscoveryService_StreamAggregatedResourcesServer: stream, cache: s.cache, tracker: s.tracker}
	f.ctx = context.WithValue(stream.Context(), ackFilterKey{}, f)
	return s.Server.StreamAggregatedResources(f)
}

type ackFilterKey struct{}

// ackFilter keeps a state-of-the-world stream's plain EDS ACKs from go-control-plane's server.
// Envoy acknowledges every EDS response with the names of all the clusters it holds; the server
// would rebuild the subscription from them and reopen its watch, in O(names), for a request
// that changes nothing. The endpoint cache's watches persist across responses, so a request
// that acknowledges the last EDS response (its nonce and version, no error), sent by a watch that
// is still open and was opened by the last EDS request the filter passed on (so the server has
// handled every earlier one), and that names exactly that watch's subscription, changes nothing
// the server or the cache must know: the filter records it in the node status and drops it.
// Every other request (the first, a NACK, a changed subscription, a stale nonce) goes through.
type ackFilter struct {
	discoveryv3.AggregatedDiscoveryService_StreamAggregatedResourcesServer
	ctx     context.Context
	cache   *endpointCache
	tracker *tracker
	id      atomic.Int64 // go-control-plane's stream id, from OnStreamOpen (0 until then)

	mu      sync.Mutex
	nonce   string                        // of the last EDS response sent
	version string                        // of the last EDS response sent
	watch   *edsWatch                     // that sent it
	passed  *discoveryv3.DiscoveryRequest // the last EDS request passed on
}

func (f *ackFilter) Context() context.Context { return f.ctx }

func (f *ackFilter) Send(resp *discoveryv3.DiscoveryResponse) error {
	if resp.GetTypeUrl() == resource.EndpointType {
		w := f.cache.sentBy(resp)
		f.mu.Lock()
		f.nonce, f.version, f.watch = resp.GetNonce(), resp.GetVersionInfo(), w
		f.mu.Unlock()
	}
	return f.AggregatedDiscoveryService_StreamAggregatedResourcesServer.Send(resp)
}

func (f *ackFilter) Recv() (*discoveryv3.DiscoveryRequest, error) {
	for {
		req, err := f.AggregatedDiscoveryService_StreamAggregatedResourcesServer.Recv()
		if err != nil || req.GetTypeUrl() != resource.EndpointType {
			return req, err
		}
		if f.plainACK(req) {
			if id := f.id.Load(); id != 0 && f.tracker != nil {
				f.tracker.request(streamKey{id: id}, req.GetNode(), req.GetTypeUrl(), req.GetResponseNonce(), req.GetVersionInfo(), "", false)
			}
			continue
		}
		return req, nil
	}
}

func (f *ackFilter) plainACK(req *discoveryv3.DiscoveryRequest) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	w := f.watch
	if req.GetErrorDetail() == nil && w != nil && f.nonce != "" && req.GetResponseNonce() == f.nonce &&
		req.GetVersionInfo() == f.version && f.passed == w.sotw && f.cache.subscribes(w, req.GetResourceNames()) {
		return true
	}
	f.passed = req
	return false
}

// filterOpened gives the stream's filter its go-control-plane stream id (from OnStreamOpen).
func filterOpened(ctx context.Context, id int64) {
	if f, ok := ctx.Value(ackFilterKey{}).(*ackFilter); ok {
		f.id.Store(id)
	}
}
