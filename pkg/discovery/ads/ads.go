// Package ads is a discovery source that takes instances from an existing xDS control plane
// (istiod, another go-control-plane server, tether itself): tether subscribes as an ADS client
// to the CDS of named clusters and the EDS they point at, and publishes each cluster's
// endpoints as one tether service's instances, which tether then republishes with
// override_host beside the mesh.
//
// One Client holds one ADS stream (state of the world) for all its targets. A cluster of type
// EDS is followed through its eds_cluster_config.service_name (or its own name); a cluster with
// an inline load_assignment (STATIC, STRICT_DNS, LOGICAL_DNS) uses that. Each endpoint maps to:
//
//	id       the endpoint's filter_metadata tether.instance (tether's own EDS), else its
//	         hostname, else address-port
//	address  socket_address address and port_value (the HTTP port)
//	zone     the locality's zone
//	weight   load_balancing_weight (default 1, capped at 1000)
//	health   HEALTHY, DEGRADED → healthy; UNKNOWN → unknown; UNHEALTHY, TIMEOUT → unhealthy;
//	         DRAINING → state draining (sessions keep it, no new ones)
//	state    endpoints of the lowest priority present are active, the others standby
//
// A cluster the server does not have (absent from a CDS response) has no instances. Faults:
// when the stream fails the sources keep their last good sets, report the error through
// Sink.SourceFailed, and the client reconnects with back-off (100ms doubling to 30s); a
// response tether cannot use is NACKed with the reason and the last good set stays.
package ads

import (
	"context"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"

	"github.com/tether-dev/tether/pkg/registry"
)

// Kind is the source kind reported in the registry's status.
const Kind = "xds"

// Sink receives the sources' sets; *registry.Registry is one.
type Sink interface {
	UpdateSource(name, kind string, services []registry.Service, instances []registry.Instance) error
	SourceFailed(name, kind string, err error)
}

// Target maps one upstream cluster onto one tether service.
type Target struct {
	Service string
	Cluster string
}

// Client is one ADS subscription for a set of targets. Create it with New and call Run.
type Client struct {
	conn    grpc.ClientConnInterface
	node    *corev3.Node
	sink    Sink
	targets []Target
	log     *slog.Logger
	backoff [2]time.Duration
}

// Option configures a Client.
type Option func(*Client)

// WithLogger sets the logger; the default discards.
func WithLogger(l *slog.Logger) Option { return func(c *Client) { c.log = l } }

// WithBackoff sets the reconnect back-off's first and largest wait (defaults 100ms and 30s).
func WithBackoff(first, most time.Duration) Option {
	return func(c *Client) { c.backoff = [2]time.Duration{first, most} }
}

// New returns a client that subscribes over conn as node (id, cluster) for targets.
func New(conn grpc.ClientConnInterface, nodeID, nodeCluster string, sink Sink, targets []Target, opts ...Option) *Client {
	c := &Client{
		conn:    conn,
		node:    &corev3.Node{Id: nodeID, Cluster: nodeCluster, UserAgentName: "tether"},
		sink:    sink,
		targets: slices.Clone(targets),
		log:     slog.New(slog.DiscardHandler),
		backoff: [2]time.Duration{100 * time.Millisecond, 30 * time.Second},
	}
	for _, o := range opts {
		o(c)
	}
	return c
}

// SourceName is the registry name of the source feeding service.
func SourceName(service string) string { return Kind + "/" + service }

// Run keeps the subscription until ctx ends, reconnecting after failures, and returns ctx's
// error.
func (c *Client) Run(ctx context.Context) error {
	wait := c.backoff[0]
	for {
		err := c.stream(ctx)
		if ctx.Err() != nil {
			return ctx.Err()
		}
		c.log.Warn("xds source stream failed; keeping the last good sets", "err", err, "retry", wait)
		for _, t := range c.targets {
			c.sink.SourceFailed(SourceName(t.Service), Kind, err)
		}
		timer := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			timer.Stop()
			return ctx.Err()
		case <-timer.C:
		}
		wait = min(2*wait, c.backoff[1])
	}
}

// state is what one stream learned: per type, the last accepted version and nonce.
type state struct {
	clusters map[string]*clusterv3.Cluster                // by cluster name, as last received
	cla      map[string]*endpointv3.ClusterLoadAssignment // by EDS name
	synced   map[string]bool                              // cluster name → CDS answered for it
}

func (c *Client) stream(ctx context.Context) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	s, err := discoveryv3.NewAggregatedDiscoveryServiceClient(c.conn).StreamAggregatedResources(ctx)
	if err != nil {
		return fmt.Errorf("xds: open stream: %w", err)
	}
	var sendMu sync.Mutex
	send := func(req *discoveryv3.DiscoveryRequest) error {
		sendMu.Lock()
		defer sendMu.Unlock()
		req.Node = c.node
		return s.Send(req)
	}
	clusterNames := make([]string, 0, len(c.targets))
	for _, t := range c.targets {
		clusterNames = append(clusterNames, t.Cluster)
	}
	slices.Sort(clusterNames)
	clusterNames = slices.Compact(clusterNames)
	if err := send(&discoveryv3.DiscoveryRequest{TypeUrl: resource.ClusterType, ResourceNames: clusterNames}); err != nil {
		return fmt.Errorf("xds: subscribe CDS: %w", err)
	}
	st := &state{clusters: map[string]*clusterv3.Cluster{}, cla: map[string]*endpointv3.ClusterLoadAssignment{}, synced: map[string]bool{}}
	var edsNames []string // current EDS subscription
	versions := map[string]string{}
	for {
		resp, err := s.Recv()
		if err != nil {
			return fmt.Errorf("xds: stream: %w", err)
		}
		ack := &discoveryv3.DiscoveryRequest{TypeUrl: resp.GetTypeUrl(), ResponseNonce: resp.GetNonce()}
		var perr error
		switch resp.GetTypeUrl() {
		case resource.ClusterType:
			perr = st.applyClusters(resp, clusterNames)
			ack.ResourceNames = clusterNames
		case resource.EndpointType:
			perr = st.applyEndpoints(resp)
			ack.ResourceNames = edsNames
		default:
			perr = fmt.Errorf("unexpected type %s", resp.GetTypeUrl())
		}
		if perr != nil {
			ack.VersionInfo = versions[resp.GetTypeUrl()]
			ack.ErrorDetail = &status.Status{Code: int32(codes.InvalidArgument), Message: perr.Error()}
			c.log.Warn("xds source rejected a response", "type", resp.GetTypeUrl(), "err", perr)
			for _, t := range c.targets {
				c.sink.SourceFailed(SourceName(t.Service), Kind, fmt.Errorf("xds: rejected %s version %s: %w", resp.GetTypeUrl(), resp.GetVersionInfo(), perr))
			}
		} else {
			versions[resp.GetTypeUrl()] = resp.GetVersionInfo()
			ack.VersionInfo = resp.GetVersionInfo()
		}
		if err := send(ack); err != nil {
			return fmt.Errorf("xds: ack: %w", err)
		}
		if perr != nil {
			continue
		}
		// A changed set of EDS names (clusters appeared or changed their service_name) is a
		// new EDS subscription.
		if want := st.edsNames(); !slices.Equal(want, edsNames) {
			edsNames = want
			if err := send(&discoveryv3.DiscoveryRequest{TypeUrl: resource.EndpointType, ResourceNames: edsNames, VersionInfo: versions[resource.EndpointType]}); err != nil {
				return fmt.Errorf("xds: subscribe EDS: %w", err)
			}
		}
		c.publish(st)
	}
}

func (st *state) applyClusters(resp *discoveryv3.DiscoveryResponse, wanted []string) error {
	next := map[string]*clusterv3.Cluster{}
	for _, a := range resp.GetResources() {
		var cl clusterv3.Cluster
		if err := a.UnmarshalTo(&cl); err != nil {
			return fmt.Errorf("cluster: %w", err)
		}
		if slices.Contains(wanted, cl.GetName()) {
			next[cl.GetName()] = &cl
		}
	}
	st.clusters = next
	for _, n := range wanted {
		st.synced[n] = true // state of the world: a cluster left out does not exist
	}
	return nil
}

func (st *state) applyEndpoints(resp *discoveryv3.DiscoveryResponse) error {
	next := map[string]*endpointv3.ClusterLoadAssignment{}
	for _, a := range resp.GetResources() {
		var cla endpointv3.ClusterLoadAssignment
		if err := a.UnmarshalTo(&cla); err != nil {
			return fmt.Errorf("endpoints: %w", err)
		}
		next[cla.GetClusterName()] = &cla
	}
	// State of the world for the subscribed names, but servers may send only changed ones;
	// merge so an unchanged assignment is kept.
	for k, v := range next {
		st.cla[k] = v
	}
	return nil
}

// edsName returns the EDS resource name of cluster cl, or "" if it carries its endpoints inline.
func edsName(cl *clusterv3.Cluster) string {
	if cl.GetType() != clusterv3.Cluster_EDS {
		return ""
	}
	if n := cl.GetEdsClusterConfig().GetServiceName(); n != "" {
		return n
	}
	return cl.GetName()
}

func (st *state) edsNames() []string {
	var out []string
	for _, cl := range st.clusters {
		if n := edsName(cl); n != "" {
			out = append(out, n)
		}
	}
	slices.Sort(out)
	return slices.Compact(out)
}

func (c *Client) publish(st *state) {
	for _, t := range c.targets {
		if !st.synced[t.Cluster] {
			continue
		}
		var cla *endpointv3.ClusterLoadAssignment
		if cl, ok := st.clusters[t.Cluster]; ok {
			if n := edsName(cl); n != "" {
				if cla, ok = st.cla[n]; !ok {
					continue // EDS not answered yet: keep what was published
				}
			} else {
				cla = cl.GetLoadAssignment()
			}
		}
		ins := Instances(t.Service, cla)
		if err := c.sink.UpdateSource(SourceName(t.Service), Kind, nil, ins); err != nil {
			c.sink.SourceFailed(SourceName(t.Service), Kind, err)
		}
	}
}

// Instances maps a ClusterLoadAssignment (nil for none) to instances of service, sorted by id.
// Endpoints without a socket address with a port are skipped.
func Instances(service string, cla *endpointv3.ClusterLoadAssignment) []registry.Instance {
	lowest := uint32(1<<32 - 1)
	for _, l := range cla.GetEndpoints() {
		if len(l.GetLbEndpoints()) > 0 {
			lowest = min(lowest, l.GetPriority())
		}
	}
	byID := map[string]registry.Instance{}
	for _, l := range cla.GetEndpoints() {
		for _, lb := range l.GetLbEndpoints() {
			in, ok := lbInstance(service, l, lb, lowest)
			if !ok {
				continue
			}
			if _, dup := byID[in.ID]; dup {
				continue
			}
			byID[in.ID] = in
		}
	}
	out := slices.AppendSeq(make([]registry.Instance, 0, len(byID)), maps.Values(byID))
	slices.SortFunc(out, func(a, b registry.Instance) int { return strings.Compare(a.ID, b.ID) })
	return out
}

// lbInstance maps endpoint lb of locality l to an instance of service (standby if l's
// priority is not lowest); false if it has no socket address with a port.
func lbInstance(service string, l *endpointv3.LocalityLbEndpoints, lb *endpointv3.LbEndpoint, lowest uint32) (registry.Instance, bool) {
	sa := lb.GetEndpoint().GetAddress().GetSocketAddress()
	if sa.GetAddress() == "" || sa.GetPortValue() == 0 {
		return registry.Instance{}, false
	}
	in := registry.Instance{
		Service:  service,
		Address:  sa.GetAddress(),
		HTTPPort: int(sa.GetPortValue()),
		Zone:     l.GetLocality().GetZone(),
		Weight:   1,
		State:    registry.StateActive,
		Health:   registry.HealthUnknown,
	}
	if w := lb.GetLoadBalancingWeight(); w != nil && w.GetValue() > 0 {
		in.Weight = min(w.GetValue(), 1000)
	}
	switch lb.GetHealthStatus() {
	case corev3.HealthStatus_HEALTHY, corev3.HealthStatus_DEGRADED:
		in.Health = registry.HealthHealthy
	case corev3.HealthStatus_UNHEALTHY, corev3.HealthStatus_TIMEOUT:
		in.Health = registry.HealthUnhealthy
	case corev3.HealthStatus_DRAINING:
		in.State = registry.StateDraining
	}
	if in.State == registry.StateActive && l.GetPriority() != lowest {
		in.State = registry.StateStandby
	}
	in.ID = endpointID(lb, sa)
	return in, true
}

func endpointID(lb *endpointv3.LbEndpoint, sa *corev3.SocketAddress) string {
	if f := lb.GetMetadata().GetFilterMetadata()["tether"]; f != nil {
		if id := f.GetFields()["instance"].GetStringValue(); id != "" {
			return id
		}
	}
	if h := lb.GetEndpoint().GetHostname(); h != "" {
		return h
	}
	return strings.NewReplacer(":", "-", "%", "-").Replace(sa.GetAddress()) + "-" + strconv.Itoa(int(sa.GetPortValue()))
}
