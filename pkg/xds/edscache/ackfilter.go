package edscache

import (
	"context"
	"sync"

	"github.com/cespare/xxhash/v2"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	serverv3 "github.com/envoyproxy/go-control-plane/pkg/server/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
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
	// nodeSeen: a request passed on, or an ACK reported as dropped, carried the node.
	nodeSeen bool

	bufs *sync.Pool  // the Filters' request buffers (*[]byte)
	raw  wireRequest // the request being received; only Recv (the stream's receiving goroutine) uses it
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

// Recv returns the stream's next request that is not a plain EDS ACK. It reads each request's
// wire form first (wireRequest: copied into the stream's buffer by the filters' codec) and
// recognises a plain ACK there, so the ACK's names — every cluster the client holds — are
// compared as bytes and never decoded into strings: with 1,000 clusters, decoding them was a
// third of tether's CPU for one change reaching every client. Every other request is decoded
// and returned.
func (f *ackFilter) Recv() (*discoveryv3.DiscoveryRequest, error) {
	for {
		req, err := f.recvOne()
		if req != nil || err != nil {
			return req, err
		}
	}
}

// recvOne receives one request into a buffer of the filters' pool (returned before it returns:
// the decoded request copies what it keeps) and returns it, or nil if it was a dropped ACK.
func (f *ackFilter) recvOne() (*discoveryv3.DiscoveryRequest, error) {
	buf := f.bufs.Get().(*[]byte)
	f.raw.wire = (*buf)[:0]
	defer func() {
		if cap(f.raw.wire) <= maxPooledRequest {
			*buf = f.raw.wire[:0]
			f.bufs.Put(buf)
		}
		f.raw.wire = nil
	}()
	if err := f.RecvMsg(&f.raw); err != nil {
		return nil, err
	}
	wire := f.raw.bytes()
	if ack, ok := parseACK(wire); ok {
		if dropped, ok := f.plainACK(ack); ok {
			if dropped.node != nil {
				if err := proto.Unmarshal(ack.node, dropped.node); err != nil {
					return nil, status.Errorf(codes.Internal, "grpc: error unmarshalling request: %v", err)
				}
			}
			if dropped.id != 0 && f.dropped != nil {
				f.dropped(dropped.id, &discoveryv3.DiscoveryRequest{Node: dropped.node, TypeUrl: resource.EndpointType,
					VersionInfo: dropped.version, ResponseNonce: dropped.nonce})
			}
			return nil, nil
		}
	}
	req := &discoveryv3.DiscoveryRequest{}
	if err := proto.Unmarshal(wire, req); err != nil {
		return nil, status.Errorf(codes.Internal, "grpc: error unmarshalling request: %v", err)
	}
	f.pass(req)
	return req, nil
}

// maxPooledRequest is the largest request buffer the filters keep for reuse (an ACK of 10,000
// names); a larger one is left to the garbage collector.
const maxPooledRequest = 256 << 10

// droppedACK is what the filter reports of an ACK it drops: the stream's id, the version and
// nonce acknowledged, and the node when the ACK carries one and no request passed on did (the
// node status learns a stream's node from the first request that names it; nil otherwise).
type droppedACK struct {
	id             int64
	version, nonce string
	node           *corev3.Node
}

// plainACK reports whether ack acknowledges the last EDS response, sent by the watch the last
// EDS request passed on opened, and names what that request named.
func (f *ackFilter) plainACK(ack wireACK) (droppedACK, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.opener == nil || f.nonce == "" || string(ack.nonce) != f.nonce || string(ack.version) != f.version ||
		f.passed != f.opener || !f.names.equalWire(f.opener.GetResourceNames(), ack.wire, ack.count) {
		return droppedACK{}, false
	}
	d := droppedACK{id: f.id, version: f.version, nonce: f.nonce}
	if ack.node != nil && !f.nodeSeen {
		d.node, f.nodeSeen = &corev3.Node{}, true
	}
	return d, true
}

// pass records req, a request the filter passes on to the server.
func (f *ackFilter) pass(req *discoveryv3.DiscoveryRequest) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if req.GetTypeUrl() == resource.EndpointType {
		f.passed = req
	}
	f.nodeSeen = f.nodeSeen || req.GetNode() != nil
}

// wireACK is a candidate plain ACK as parseACK read it from a DiscoveryRequest's wire form
// (wire): its version_info, response_nonce and node (nil if none) as wire bytes, and how many
// resource names it holds. Nothing is copied.
type wireACK struct {
	wire           []byte
	version, nonce []byte
	node           []byte
	count          int
}

// DiscoveryRequest's field numbers (envoy/service/discovery/v3/discovery.proto).
const (
	reqVersionInfo   protowire.Number = 1
	reqNode          protowire.Number = 2
	reqResourceNames protowire.Number = 3
	reqTypeURL       protowire.Number = 4
	reqResponseNonce protowire.Number = 5
)

// parseACK reads b, a DiscoveryRequest's wire form, as a candidate plain EDS ACK: it reports
// false unless b is well formed as far as its fields' lengths, its type_url is EDS's, and it
// holds nothing but version_info, node (once), resource_names, type_url and response_nonce (no
// error_detail, no field the filter does not know). A string given twice counts the way proto
// reads it: the last one. Strings are not checked for UTF-8: plainACK compares them with the
// valid strings of a decoded request, and a request that does not match is decoded (and
// rejected if it is not valid).
func parseACK(b []byte) (wireACK, bool) {
	ack := wireACK{wire: b}
	var typeURL []byte
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 || typ != protowire.BytesType {
			return wireACK{}, false
		}
		v, m := protowire.ConsumeBytes(b[n:])
		if m < 0 {
			return wireACK{}, false
		}
		switch num {
		case reqVersionInfo:
			ack.version = v
		case reqNode:
			if ack.node != nil { // proto merges the two: decode it
				return wireACK{}, false
			}
			ack.node = v
		case reqResourceNames:
			ack.count++
		case reqTypeURL:
			typeURL = v
		case reqResponseNonce:
			ack.nonce = v
		default:
			return wireACK{}, false
		}
		b = b[n+m:]
	}
	return ack, string(typeURL) == resource.EndpointType
}

// wireNames calls f with each resource name in b, a DiscoveryRequest's wire form that parseACK
// accepted, in order, until f returns false.
func wireNames(b []byte, f func([]byte) bool) {
	for len(b) > 0 {
		num, _, n := protowire.ConsumeTag(b)
		v, m := protowire.ConsumeBytes(b[n:])
		if num == reqResourceNames && !f(v) {
			return
		}
		b = b[n+m:]
	}
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

// equalWire reports whether the count names in wire (a request's wire form, see wireNames) are
// the set s was made of from orig: the same list (the common case), or the same names in another
// order.
func (s nameSet) equalWire(orig []string, wire []byte, count int) bool {
	if count != s.n {
		return false
	}
	i, same := 0, true
	wireNames(wire, func(name []byte) bool {
		same = string(name) == orig[i]
		i++
		return same
	})
	if same {
		return true
	}
	got := nameSet{n: count}
	wireNames(wire, func(name []byte) bool {
		got.sum += xxhash.Sum64(name)
		return true
	})
	return got == s
}

// Filters keeps plain EDS ACKs of state-of-the-world ADS streams from go-control-plane's server
// (see ackFilter): Wrap each stream before the server sees it, give the server the callbacks
// Callbacks returns, and the gRPC server ServerOption. It routes the callbacks to each stream's
// filter by stream id. Safe for concurrent use.
type Filters struct {
	dropped func(streamID int64, req *discoveryv3.DiscoveryRequest)
	bufs    sync.Pool // request buffers (*[]byte), held only while a stream receives one

	mu   sync.Mutex
	byID map[int64]*ackFilter
}

// NewFilters returns an empty set of filters; dropped, if not nil, is told of every ACK a
// filter drops (go-control-plane's OnStreamRequest never sees it), on the stream's receiving
// goroutine.
func NewFilters(dropped func(streamID int64, req *discoveryv3.DiscoveryRequest)) *Filters {
	fs := &Filters{dropped: dropped, byID: map[int64]*ackFilter{}}
	fs.bufs.New = func() any { return new([]byte) }
	return fs
}

// Wrap returns stream with its filter, to pass to go-control-plane's
// StreamAggregatedResources.
func (fs *Filters) Wrap(stream discoveryv3.AggregatedDiscoveryService_StreamAggregatedResourcesServer) discoveryv3.AggregatedDiscoveryService_StreamAggregatedResourcesServer {
	f := &ackFilter{AggregatedDiscoveryService_StreamAggregatedResourcesServer: stream, dropped: fs.dropped, bufs: &fs.bufs}
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
