package envoyharness

import (
	"context"
	"fmt"
	"net"
	"slices"
	"strconv"
	"sync"
	"time"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	httpv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/upstreams/http/v3"
	sotw "github.com/envoyproxy/go-control-plane/pkg/client/sotw/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

// XDSEndpoints is an EndpointSource fed by a real xDS client: go-control-plane's SotW ADS
// client subscribes (wildcard) to clusters (CDS) and endpoints (EDS) on tether's ADS server,
// as Envoy does with the generated bootstrap, and ACKs every response. A cluster's endpoints
// are served only while CDS lists the cluster (Envoy answers 503 for unknown clusters).
type XDSEndpoints struct {
	conn   *grpc.ClientConn
	cancel context.CancelFunc
	wg     sync.WaitGroup

	mu       sync.RWMutex
	clusters map[string]bool
	http2    map[string]bool // clusters whose upstream protocol is HTTP/2
	trailers map[string]bool // HTTP/1 clusters with http_protocol_options.enable_trailers
	eps      map[string][]Endpoint
	changed  chan struct{} // closed and replaced on every update
	err      error         // last stream error, for diagnostics
}

// WatchXDS connects to the ADS server at addr as node nodeID and follows CDS and EDS until
// Close.
func WatchXDS(ctx context.Context, addr, nodeID string) (*XDSEndpoints, error) {
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return nil, fmt.Errorf("envoyharness: dial xds %s: %w", addr, err)
	}
	ctx, cancel := context.WithCancel(ctx)
	x := &XDSEndpoints{conn: conn, cancel: cancel, clusters: map[string]bool{}, eps: map[string][]Endpoint{},
		changed: make(chan struct{})}
	node := &corev3.Node{Id: nodeID, Cluster: "tether", UserAgentName: "envoyharness"}
	for _, typ := range []string{resource.ClusterType, resource.EndpointType} {
		x.wg.Add(1)
		go func() {
			defer x.wg.Done()
			x.follow(ctx, node, typ)
		}()
	}
	return x, nil
}

// follow runs one ADS stream for typ, reconnecting after errors.
func (x *XDSEndpoints) follow(ctx context.Context, node *corev3.Node, typ string) {
	for ctx.Err() == nil {
		c := sotw.NewADSClient(ctx, node, typ)
		if err := c.InitConnect(x.conn); err != nil {
			x.setErr(err)
			sleep(ctx, 50*time.Millisecond)
			continue
		}
		for {
			resp, err := c.Fetch()
			if err != nil {
				x.setErr(err)
				break
			}
			if err := x.apply(typ, resp); err != nil {
				_ = c.Nack(err.Error())
				continue
			}
			if err := c.Ack(); err != nil {
				x.setErr(err)
				break
			}
		}
		sleep(ctx, 50*time.Millisecond)
	}
}

func sleep(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}

func (x *XDSEndpoints) setErr(err error) {
	x.mu.Lock()
	x.err = err
	x.mu.Unlock()
}

// apply replaces the state of one type with a SotW response.
func (x *XDSEndpoints) apply(typ string, resp *sotw.Response) error {
	switch typ {
	case resource.ClusterType:
		clusters, h2, tr := map[string]bool{}, map[string]bool{}, map[string]bool{}
		for _, a := range resp.Resources {
			var c clusterv3.Cluster
			if err := a.UnmarshalTo(&c); err != nil {
				return fmt.Errorf("cluster: %w", err)
			}
			clusters[c.GetName()] = true
			isH2, trailers, err := clusterProtocol(&c)
			if err != nil {
				return fmt.Errorf("cluster %s: %w", c.GetName(), err)
			}
			h2[c.GetName()], tr[c.GetName()] = isH2, trailers
		}
		x.mu.Lock()
		x.clusters, x.http2, x.trailers = clusters, h2, tr
		x.notifyLocked()
		x.mu.Unlock()
	case resource.EndpointType:
		eps := map[string][]Endpoint{}
		for _, a := range resp.Resources {
			var cla endpointv3.ClusterLoadAssignment
			if err := a.UnmarshalTo(&cla); err != nil {
				return fmt.Errorf("endpoints: %w", err)
			}
			eps[cla.GetClusterName()] = endpointsOf(&cla)
		}
		x.mu.Lock()
		x.eps = eps
		x.notifyLocked()
		x.mu.Unlock()
	}
	return nil
}

func (x *XDSEndpoints) notifyLocked() {
	close(x.changed)
	x.changed = make(chan struct{})
}

func endpointsOf(cla *endpointv3.ClusterLoadAssignment) []Endpoint {
	var out []Endpoint
	for _, loc := range cla.GetEndpoints() {
		for _, lb := range loc.GetLbEndpoints() {
			sa := lb.GetEndpoint().GetAddress().GetSocketAddress()
			if sa == nil {
				continue
			}
			healthy := true
			switch lb.GetHealthStatus() {
			case corev3.HealthStatus_UNHEALTHY, corev3.HealthStatus_DRAINING, corev3.HealthStatus_TIMEOUT:
				healthy = false
			}
			out = append(out, Endpoint{
				Address:  net.JoinHostPort(sa.GetAddress(), strconv.FormatUint(uint64(sa.GetPortValue()), 10)),
				Healthy:  healthy,
				Priority: loc.GetPriority(),
			})
		}
	}
	return out
}

// UpstreamHTTP2 reports whether CDS configures cluster for HTTP/2 upstreams.
func (x *XDSEndpoints) UpstreamHTTP2(cluster string) bool {
	x.mu.RLock()
	defer x.mu.RUnlock()
	return x.http2[cluster]
}

// HTTP1Trailers reports whether CDS enables trailers on cluster's HTTP/1 upstreams.
func (x *XDSEndpoints) HTTP1Trailers(cluster string) bool {
	x.mu.RLock()
	defer x.mu.RUnlock()
	return x.trailers[cluster]
}

// clusterProtocol reads the cluster's envoy.extensions.upstreams.http.v3.HttpProtocolOptions:
// explicit HTTP/2 means prior-knowledge HTTP/2 to the hosts; trailers reports HTTP/1
// http_protocol_options.enable_trailers (explicit or auto config).
func clusterProtocol(c *clusterv3.Cluster) (http2, trailers bool, err error) {
	a, ok := c.GetTypedExtensionProtocolOptions()[httpProtocolOptionsName]
	if !ok {
		return false, false, nil
	}
	var o httpv3.HttpProtocolOptions
	if err := a.UnmarshalTo(&o); err != nil {
		return false, false, err
	}
	h1 := o.GetExplicitHttpConfig().GetHttpProtocolOptions()
	if h1 == nil {
		h1 = o.GetAutoConfig().GetHttpProtocolOptions()
	}
	return o.GetExplicitHttpConfig().GetHttp2ProtocolOptions() != nil, h1.GetEnableTrailers(), nil
}

const httpProtocolOptionsName = "envoy.extensions.upstreams.http.v3.HttpProtocolOptions"

// Endpoints implements EndpointSource.
func (x *XDSEndpoints) Endpoints(cluster string) []Endpoint {
	x.mu.RLock()
	defer x.mu.RUnlock()
	if !x.clusters[cluster] {
		return nil
	}
	return x.eps[cluster]
}

// Addresses returns the sorted addresses of a cluster's endpoints.
func (x *XDSEndpoints) Addresses(cluster string) []string {
	var out []string
	for _, ep := range x.Endpoints(cluster) {
		out = append(out, ep.Address)
	}
	slices.Sort(out)
	return out
}

// Wait blocks until cond holds (checked after every update) or ctx ends.
func (x *XDSEndpoints) Wait(ctx context.Context, cond func() bool) error {
	for {
		x.mu.RLock()
		ch := x.changed
		x.mu.RUnlock()
		if cond() {
			return nil
		}
		select {
		case <-ctx.Done():
			x.mu.RLock()
			last := x.err
			x.mu.RUnlock()
			if last == nil {
				return fmt.Errorf("envoyharness: waiting for xDS (no stream error): %w", ctx.Err())
			}
			return fmt.Errorf("envoyharness: waiting for xDS (last stream error: %w): %w", last, ctx.Err())
		case <-ch:
		}
	}
}

// Close stops the streams and the connection.
func (x *XDSEndpoints) Close() error {
	x.cancel()
	err := x.conn.Close()
	x.wg.Wait()
	return err
}
