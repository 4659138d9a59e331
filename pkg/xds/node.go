package xds

import (
	"cmp"
	"slices"
	"strings"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
)

// Snapshot keys. go-control-plane keys snapshots by the string its NodeHash returns for a
// node; tether's hash returns NodeSnapshotKeyPrefix+id for a node with its own parameters
// (WithNodeParams) and one of the two default keys otherwise, so an unknown node is served the
// default the moment it connects — no per-node bookkeeping, no window without a snapshot, and
// one SetSnapshot per key (not per node) when the registry changes.
const (
	DefaultEnvoySnapshot  = "default/envoy"
	DefaultGRPCSnapshot   = "default/grpc"
	NodeSnapshotKeyPrefix = "node/"
	// ProfileMetadataKey in a node's metadata ("envoy" or "grpc") chooses the default snapshot
	// explicitly. Without it, a node whose user_agent_name starts with "gRPC" (grpc-go reports
	// "gRPC Go") gets DefaultGRPCSnapshot and every other node DefaultEnvoySnapshot.
	ProfileMetadataKey = "tether.profile"
)

// nodes maps a connecting node to its snapshot key and each key to its Profile. It is
// immutable after construction.
type nodes struct {
	envoy  Params            // the default Envoy profile's params
	grpc   Params            // the gRPC profile's params (GRPCExtProcTarget)
	byNode map[string]Params // nodes with their own (Envoy) profile
}

// key is the snapshot a node is served; see DefaultEnvoySnapshot.
func (ns nodes) key(n *corev3.Node) string {
	if _, ok := ns.byNode[n.GetId()]; ok {
		return NodeSnapshotKeyPrefix + n.GetId()
	}
	if v, ok := n.GetMetadata().GetFields()[ProfileMetadataKey]; ok {
		if v.GetStringValue() == "grpc" {
			return DefaultGRPCSnapshot
		}
		return DefaultEnvoySnapshot
	}
	if strings.HasPrefix(n.GetUserAgentName(), "gRPC") {
		return DefaultGRPCSnapshot
	}
	return DefaultEnvoySnapshot
}

// cache is the cache (of the MuxCache) serving a request: endpoints for everyone from the
// endpoint cache, the rest from the snapshot cache of the node's kind.
func (ns nodes) cache(typeURL string, n *corev3.Node) string {
	switch {
	case typeURL == resource.EndpointType:
		return "eds"
	case ns.key(n) == DefaultGRPCSnapshot:
		return "grpc"
	}
	return "envoy"
}

// keyedProfile is a snapshot key and the Profile its snapshot is built for.
type keyedProfile struct {
	key string
	Profile
}

// profiles lists every snapshot key with its Profile, sorted by key.
func (ns nodes) profiles() []keyedProfile {
	out := []keyedProfile{
		{DefaultEnvoySnapshot, Profile{Kind: KindEnvoy, Params: ns.envoy}},
		{DefaultGRPCSnapshot, Profile{Kind: KindGRPC, Params: ns.grpc}},
	}
	for id, p := range ns.byNode {
		out = append(out, keyedProfile{NodeSnapshotKeyPrefix + id, Profile{Kind: KindEnvoy, Params: p}})
	}
	slices.SortFunc(out, func(a, b keyedProfile) int { return cmp.Compare(a.key, b.key) })
	return out
}

type nodeHash func(*corev3.Node) string

// ID implements go-control-plane's cache.NodeHash.
func (h nodeHash) ID(n *corev3.Node) string { return h(n) }
