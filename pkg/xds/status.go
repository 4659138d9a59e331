package xds

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"maps"
	"net/http"
	"slices"
	"sync"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	serverv3 "github.com/envoyproxy/go-control-plane/pkg/server/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
)

// statusRetention is how long a node without streams stays in Status.
const statusRetention = time.Hour

// MaxIdleNodes bounds the nodes without streams Status keeps (within statusRetention): beyond
// it the longest-gone are forgotten first, so clients that connect under ever new node ids
// cannot grow the table (nodes with streams are bounded by the listener's connections and
// streams per connection).
const MaxIdleNodes = 1000

// MaxNodeIDLength bounds a client's node id and cluster (bytes): a stream whose first request
// names a longer one is refused with InvalidArgument.
const MaxNodeIDLength = 256

// NodeStatus is what tether knows about one xDS client (an Envoy or a gRPC client), keyed by
// its node id. It is a copy; callers may keep and modify it.
type NodeStatus struct {
	// ID is the node id the client sent.
	ID string `json:"id"`
	// Cluster is the node's cluster field.
	Cluster string `json:"cluster,omitempty"`
	// UserAgent is "name/version" as the client reported it (e.g. "envoy/1.40.0").
	UserAgent string `json:"userAgent,omitempty"`
	// Snapshot is the snapshot key serving this node: "node/<id>" for a node with its own
	// parameters, else "default/envoy" or "default/grpc".
	Snapshot string `json:"snapshot"`
	// Peers are the remote addresses of the node's open streams, sorted.
	Peers []string `json:"peers,omitempty"`
	// Streams is the number of open ADS streams (state of the world and delta).
	Streams int `json:"streams"`
	// FirstSeen and LastSeen bound the node's activity (last request or stream close).
	FirstSeen time.Time `json:"firstSeen"`
	LastSeen  time.Time `json:"lastSeen"`
	// Types lists, per resource type the node asked for, the last version sent and the last
	// version it acknowledged, sorted by type URL.
	Types []TypeStatus `json:"types"`
	// LastNACK is the node's most recent rejection, if any.
	LastNACK *NACK `json:"lastNack,omitempty"`
}

// TypeStatus is one resource type's delivery state for one node.
type TypeStatus struct {
	TypeURL      string    `json:"typeUrl"`
	SentVersion  string    `json:"sentVersion,omitempty"`
	AckedVersion string    `json:"ackedVersion,omitempty"`
	AckedAt      time.Time `json:"ackedAt,omitzero"`
}

// NACK is a configuration a client rejected.
type NACK struct {
	TypeURL string `json:"typeUrl"`
	// Version is the rejected version when tether can tell which response was rejected.
	Version string `json:"version,omitempty"`
	// Message is the client's error_detail message (for Envoy: why the config was refused).
	Message string    `json:"message"`
	At      time.Time `json:"at"`
}

type streamKey struct {
	delta bool
	id    int64
}

type sent struct {
	nonce, version string
}

type streamState struct {
	node string // "" until the first request
	peer string
	sent map[string]sent // by type URL: the last response
}

type nodeState struct {
	status NodeStatus
	types  map[string]*TypeStatus
}

// tracker records per-node delivery status from go-control-plane callbacks. It is safe for
// concurrent use (callbacks arrive from every stream's goroutine).
type tracker struct {
	log     *slog.Logger
	now     func() time.Time
	keyOf   func(*corev3.Node) string
	mu      sync.Mutex
	streams map[streamKey]*streamState
	nodes   map[string]*nodeState
	// nacks counts every NACK received, from any node, since start.
	nacks uint64
}

func newTracker(log *slog.Logger, keyOf func(*corev3.Node) string) *tracker {
	return &tracker{
		log:     log,
		now:     time.Now,
		keyOf:   keyOf,
		streams: map[streamKey]*streamState{},
		nodes:   map[string]*nodeState{},
	}
}

func (t *tracker) callbacks() serverv3.CallbackFuncs {
	return serverv3.CallbackFuncs{
		StreamOpenFunc: func(ctx context.Context, id int64, _ string) error {
			t.open(ctx, streamKey{id: id})
			return nil
		},
		DeltaStreamOpenFunc: func(ctx context.Context, id int64, _ string) error {
			t.open(ctx, streamKey{delta: true, id: id})
			return nil
		},
		StreamClosedFunc:      func(id int64, _ *corev3.Node) { t.closed(streamKey{id: id}) },
		DeltaStreamClosedFunc: func(id int64, _ *corev3.Node) { t.closed(streamKey{delta: true, id: id}) },
		StreamRequestFunc: func(id int64, req *discoveryv3.DiscoveryRequest) error {
			if err := checkNode(req.GetNode()); err != nil {
				return err
			}
			// A state-of-the-world ACK carries the accepted version itself.
			t.request(streamKey{id: id}, req.GetNode(), req.GetTypeUrl(), req.GetResponseNonce(), req.GetVersionInfo(), req.GetErrorDetail().GetMessage(), req.GetErrorDetail() != nil)
			return nil
		},
		StreamDeltaRequestFunc: func(id int64, req *discoveryv3.DeltaDiscoveryRequest) error {
			if err := checkNode(req.GetNode()); err != nil {
				return err
			}
			t.request(streamKey{delta: true, id: id}, req.GetNode(), req.GetTypeUrl(), req.GetResponseNonce(), "", req.GetErrorDetail().GetMessage(), req.GetErrorDetail() != nil)
			return nil
		},
		StreamResponseFunc: func(_ context.Context, id int64, req *discoveryv3.DiscoveryRequest, resp *discoveryv3.DiscoveryResponse) {
			t.response(streamKey{id: id}, req.GetTypeUrl(), resp.GetNonce(), resp.GetVersionInfo())
		},
		StreamDeltaResponseFunc: func(id int64, req *discoveryv3.DeltaDiscoveryRequest, resp *discoveryv3.DeltaDiscoveryResponse) {
			t.response(streamKey{delta: true, id: id}, req.GetTypeUrl(), resp.GetNonce(), resp.GetSystemVersionInfo())
		},
	}
}

func (t *tracker) open(ctx context.Context, k streamKey) {
	st := &streamState{sent: map[string]sent{}}
	if p, ok := peer.FromContext(ctx); ok && p.Addr != nil {
		st.peer = p.Addr.String()
	}
	t.mu.Lock()
	t.streams[k] = st
	t.mu.Unlock()
}

func (t *tracker) closed(k streamKey) {
	t.mu.Lock()
	defer t.mu.Unlock()
	st, ok := t.streams[k]
	delete(t.streams, k)
	if !ok || st.node == "" {
		return
	}
	if n, ok := t.nodes[st.node]; ok {
		n.status.Streams--
		n.status.LastSeen = t.now()
		n.status.Peers = slices.DeleteFunc(n.status.Peers, func(p string) bool { return p == st.peer })
	}
	t.pruneLocked()
}

// request records a discovery request: the first one binds the stream to its node; one with a
// response nonce is an ACK (no error detail) or a NACK.
func (t *tracker) request(k streamKey, node *corev3.Node, typeURL, nonce, version, errMsg string, nack bool) {
	now := t.now()
	t.mu.Lock()
	defer t.mu.Unlock()
	st, ok := t.streams[k]
	if !ok {
		return
	}
	if st.node == "" {
		if node == nil {
			return
		}
		st.node = node.GetId()
		n, ok := t.nodes[st.node]
		if !ok {
			n = &nodeState{types: map[string]*TypeStatus{}}
			n.status.FirstSeen = now
			t.nodes[st.node] = n
		}
		n.status.ID = node.GetId()
		n.status.Cluster = node.GetCluster()
		n.status.UserAgent = userAgent(node)
		n.status.Snapshot = t.keyOf(node)
		n.status.Streams++
		if st.peer != "" {
			n.status.Peers = append(n.status.Peers, st.peer)
			slices.Sort(n.status.Peers)
		}
	}
	n := t.nodes[st.node]
	n.status.LastSeen = now
	if nonce == "" {
		return
	}
	last := st.sent[typeURL]
	if nack {
		rejected := ""
		if last.nonce == nonce {
			rejected = last.version
		}
		n.status.LastNACK = &NACK{TypeURL: typeURL, Version: rejected, Message: errMsg, At: now}
		t.nacks++
		t.log.Warn("xds: configuration rejected", "node", st.node, "type", typeURL, "version", rejected, "detail", errMsg)
		return
	}
	if version == "" && last.nonce == nonce {
		version = last.version // delta ACKs name the nonce, not the version
	}
	if version == "" {
		return
	}
	ts := n.typeStatus(typeURL)
	ts.AckedVersion = version
	ts.AckedAt = now
}

// droppedACK records a state-of-the-world ACK the endpoint cache's filter kept from the
// server (edscache.Filters).
func (t *tracker) droppedACK(id int64, req *discoveryv3.DiscoveryRequest) {
	t.request(streamKey{id: id}, req.GetNode(), req.GetTypeUrl(), req.GetResponseNonce(), req.GetVersionInfo(), "", false)
}

func (t *tracker) response(k streamKey, typeURL, nonce, version string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	st, ok := t.streams[k]
	if !ok {
		return
	}
	st.sent[typeURL] = sent{nonce: nonce, version: version}
	if n, ok := t.nodes[st.node]; ok {
		n.typeStatus(typeURL).SentVersion = version
	}
}

func (n *nodeState) typeStatus(typeURL string) *TypeStatus {
	ts, ok := n.types[typeURL]
	if !ok {
		ts = &TypeStatus{TypeURL: typeURL}
		n.types[typeURL] = ts
	}
	return ts
}

// pruneLocked forgets nodes without streams that were last seen longer ago than statusRetention.
func (t *tracker) pruneLocked() {
	cutoff := t.now().Add(-statusRetention)
	var idle []*nodeState
	for id, n := range t.nodes {
		if n.status.Streams > 0 {
			continue
		}
		if n.status.LastSeen.Before(cutoff) {
			delete(t.nodes, id)
		} else {
			idle = append(idle, n)
		}
	}
	if len(idle) <= MaxIdleNodes {
		return
	}
	slices.SortFunc(idle, func(a, b *nodeState) int {
		return cmp.Or(a.status.LastSeen.Compare(b.status.LastSeen), cmp.Compare(a.status.ID, b.status.ID))
	})
	for _, n := range idle[:len(idle)-MaxIdleNodes] {
		delete(t.nodes, n.status.ID)
	}
}

// checkNode refuses a node id or cluster longer than MaxNodeIDLength.
func checkNode(n *corev3.Node) error {
	if len(n.GetId()) > MaxNodeIDLength || len(n.GetCluster()) > MaxNodeIDLength {
		return status.Errorf(codes.InvalidArgument, "node id and cluster may be at most %d bytes (got %d and %d)",
			MaxNodeIDLength, len(n.GetId()), len(n.GetCluster()))
	}
	return nil
}

func (t *tracker) nackCount() uint64 {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.nacks
}

func (t *tracker) snapshot() []NodeStatus {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.pruneLocked()
	out := make([]NodeStatus, 0, len(t.nodes))
	for _, n := range t.nodes {
		s := n.status
		s.Peers = slices.Clone(s.Peers)
		if s.LastNACK != nil {
			nack := *s.LastNACK
			s.LastNACK = &nack
		}
		s.Types = make([]TypeStatus, 0, len(n.types))
		for _, k := range slices.Sorted(maps.Keys(n.types)) {
			s.Types = append(s.Types, *n.types[k])
		}
		out = append(out, s)
	}
	slices.SortFunc(out, func(a, b NodeStatus) int { return cmp.Compare(a.ID, b.ID) })
	return out
}

func userAgent(n *corev3.Node) string {
	name := n.GetUserAgentName()
	v := n.GetUserAgentVersion()
	if v == "" {
		if bv := n.GetUserAgentBuildVersion().GetVersion(); bv != nil {
			v = fmt.Sprintf("%d.%d.%d", bv.GetMajorNumber(), bv.GetMinorNumber(), bv.GetPatch())
		}
	}
	if v == "" {
		return name
	}
	return name + "/" + v
}

// statusHandler serves the tracker's snapshot as JSON.
func statusHandler(status func() []NodeStatus) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			w.Header().Set("Allow", "GET, HEAD")
			http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		_ = enc.Encode(struct {
			Nodes []NodeStatus `json:"nodes"`
		}{status()})
	})
}
