package edscache

import (
	"context"
	"slices"
	"sync"

	"github.com/cespare/xxhash/v2"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	serverv3 "github.com/envoyproxy/go-control-plane/pkg/server/v3"
)

type ackFilterKey struct{}

// ackFilter keeps a state-of-the-world stream's plain EDS ACKs from go-control-plane's server.
// Envoy acknowledges every EDS response with the names of all the clusters it holds; the server
// would rebuild the subscription from them and reopen its watch, in O(names), for a request
// that changes nothing. The endpoint cache's watches persist across responses, so a request
// that acknowledges the last EDS response (its nonce and version, no error), sent by the watch
// the last EDS request the filter passed on opened (so the server has handled every earlier one
// and that watch is still open: the server cancels a watch only for the next request of its
// type), and that names the same resources as that request, changes nothing the server or the
// cache must know: the filter records it in the node status and drops it. Every other request
// (the first, a NACK, a changed subscription, a stale nonce) goes through.
//
// The filter learns which request opened the watch that sent a response from go-control-plane's
// OnStreamResponse callback (the response's request, just before the stream's Send), routed to
// it by stream id (Filters); TestGoControlPlaneServerContract holds the server to both.
type ackFilter struct {
	discoveryv3.AggregatedDiscoveryService_StreamAggregatedResourcesServer
	ctx     context.Context
	dropped func(streamID int64, req *discoveryv3.DiscoveryRequest)

	mu      sync.Mutex
	id      int64                         // go-control-plane's stream id, from OnStreamOpen (0 until then)
	nonce   string                        // of the last EDS response sent
	version string                        // of the last EDS response sent
	opener  *discoveryv3.DiscoveryRequest // the request whose watch sent it
	names   nameSet                       // opener's resource names
	passed  *discoveryv3.DiscoveryRequest // the last EDS request passed on
}

func (f *ackFilter) Context() context.Context { return f.ctx }

// responded records an EDS response about to be sent, and the request that opened its watch.
func (f *ackFilter) responded(opener *discoveryv3.DiscoveryRequest, resp *discoveryv3.DiscoveryResponse) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if opener != f.opener {
		f.opener, f.names = opener, newNameSet(opener.GetResourceNames())
	}
	f.nonce, f.version = resp.GetNonce(), resp.GetVersionInfo()
}

func (f *ackFilter) Recv() (*discoveryv3.DiscoveryRequest, error) {
	for {
		req, err := f.AggregatedDiscoveryService_StreamAggregatedResourcesServer.Recv()
		if err != nil || req.GetTypeUrl() != resource.EndpointType {
			return req, err
		}
		if id, ok := f.plainACK(req); ok {
			if id != 0 && f.dropped != nil {
				f.dropped(id, req)
			}
			continue
		}
		return req, nil
	}
}

func (f *ackFilter) plainACK(req *discoveryv3.DiscoveryRequest) (int64, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if req.GetErrorDetail() == nil && f.opener != nil && f.nonce != "" && req.GetResponseNonce() == f.nonce &&
		req.GetVersionInfo() == f.version && f.passed == f.opener && f.names.equal(f.opener.GetResourceNames(), req.GetResourceNames()) {
		return f.id, true
	}
	f.passed = req
	return 0, false
}

// nameSet identifies a list of resource names as a set: its length and an order-independent
// hash (the sum of each name's hash), so comparing a request's names with it costs O(names) and
// no memory. Two different sets agree with probability 2⁻⁶⁴; a client that contrives it only
// keeps its own subscription change from the server.
type nameSet struct {
	n   int
	sum uint64
}

func newNameSet(names []string) nameSet {
	s := nameSet{n: len(names)}
	for _, n := range names {
		s.sum += xxhash.Sum64String(n)
	}
	return s
}

// equal reports whether names (a request's) are the set s was made of from orig: the same list
// (the common case), or the same names in another order.
func (s nameSet) equal(orig, names []string) bool {
	if slices.Equal(orig, names) {
		return true
	}
	return len(names) == s.n && newNameSet(names) == s
}

// Filters keeps plain EDS ACKs of state-of-the-world ADS streams from go-control-plane's server
// (see ackFilter): Wrap each stream before the server sees it, and give the server the
// callbacks Callbacks returns. It routes the callbacks to each stream's filter by stream id.
// Safe for concurrent use.
type Filters struct {
	dropped func(streamID int64, req *discoveryv3.DiscoveryRequest)

	mu   sync.Mutex
	byID map[int64]*ackFilter
}

// NewFilters returns an empty set of filters; dropped, if not nil, is told of every ACK a
// filter drops (go-control-plane's OnStreamRequest never sees it), on the stream's receiving
// goroutine.
func NewFilters(dropped func(streamID int64, req *discoveryv3.DiscoveryRequest)) *Filters {
	return &Filters{dropped: dropped, byID: map[int64]*ackFilter{}}
}

// Wrap returns stream with its filter, to pass to go-control-plane's
// StreamAggregatedResources.
func (fs *Filters) Wrap(stream discoveryv3.AggregatedDiscoveryService_StreamAggregatedResourcesServer) discoveryv3.AggregatedDiscoveryService_StreamAggregatedResourcesServer {
	f := &ackFilter{AggregatedDiscoveryService_StreamAggregatedResourcesServer: stream, dropped: fs.dropped}
	f.ctx = context.WithValue(stream.Context(), ackFilterKey{}, f)
	return f
}

// Callbacks adds the filters' hooks to cb: OnStreamOpen binds the stream's filter (found in the
// stream's context, which is the filter's) to its id, OnStreamResponse tells it of EDS
// responses, OnStreamClosed forgets it.
func (fs *Filters) Callbacks(cb serverv3.CallbackFuncs) serverv3.CallbackFuncs {
	open, closed, responded := cb.StreamOpenFunc, cb.StreamClosedFunc, cb.StreamResponseFunc
	cb.StreamOpenFunc = func(ctx context.Context, id int64, typ string) error {
		if f, ok := ctx.Value(ackFilterKey{}).(*ackFilter); ok {
			f.mu.Lock()
			f.id = id
			f.mu.Unlock()
			fs.mu.Lock()
			fs.byID[id] = f
			fs.mu.Unlock()
		}
		if open != nil {
			return open(ctx, id, typ)
		}
		return nil
	}
	cb.StreamClosedFunc = func(id int64, n *corev3.Node) {
		fs.mu.Lock()
		delete(fs.byID, id)
		fs.mu.Unlock()
		if closed != nil {
			closed(id, n)
		}
	}
	cb.StreamResponseFunc = func(ctx context.Context, id int64, req *discoveryv3.DiscoveryRequest, resp *discoveryv3.DiscoveryResponse) {
		if resp.GetTypeUrl() == resource.EndpointType {
			fs.mu.Lock()
			f := fs.byID[id]
			fs.mu.Unlock()
			if f != nil {
				f.responded(req, resp)
			}
		}
		if responded != nil {
			responded(ctx, id, req, resp)
		}
	}
	return cb
}
