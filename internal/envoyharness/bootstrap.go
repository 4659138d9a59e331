package envoyharness

import (
	"fmt"
	"net"
	"strconv"
	"time"

	bootstrapv3 "github.com/envoyproxy/go-control-plane/envoy/config/bootstrap/v3"
	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
)

// BootstrapExtProc is what a bootstrap gives the ext_proc filter's side streams, read from its
// static resources: the cluster the filter's grpc_service names, that cluster's hosts by
// priority and its gRPC health check, and the filter's retry_policy and message_timeout. It is
// how the harness is configured from the bootstrap a real Envoy would get (Options).
type BootstrapExtProc struct {
	// Cluster is the ext_proc cluster's name; Type its discovery type (STATIC, STRICT_DNS…).
	Cluster, Type string
	// Active are the hosts at priority 0 and Standby those at priority 1, each ip:port.
	Active, Standby []string
	// HealthCheck is the cluster's gRPC health check (nil: the cluster has none).
	HealthCheck *HealthCheck
	// RetryPolicy is the grpc_service's retry_policy (nil: none).
	RetryPolicy *corev3.RetryPolicy
	// MessageTimeout is the filter's message_timeout (0: unset).
	MessageTimeout time.Duration
}

// ExtProcFromBootstrap finds the one ext_proc filter in b's static listeners (the HTTP
// connection manager's http_filters, each packed in an Any) and reads what its side streams
// get from b. It is an error if there is none or more than one, if its grpc_service is not an
// envoy_grpc one, if the cluster it names is not a static resource, if that cluster has a
// health check that is not a gRPC one, or has priorities other than 0 and 1.
func ExtProcFromBootstrap(b *bootstrapv3.Bootstrap) (BootstrapExtProc, error) {
	var out BootstrapExtProc
	var found []*extprocv3.ExternalProcessor
	for _, l := range b.GetStaticResources().GetListeners() {
		for _, fc := range l.GetFilterChains() {
			for _, f := range fc.GetFilters() {
				var hcm hcmv3.HttpConnectionManager
				if f.GetTypedConfig() == nil || f.GetTypedConfig().UnmarshalTo(&hcm) != nil {
					continue
				}
				for _, hf := range hcm.GetHttpFilters() {
					var ep extprocv3.ExternalProcessor
					if hf.GetTypedConfig() != nil && hf.GetTypedConfig().UnmarshalTo(&ep) == nil {
						found = append(found, &ep)
					}
				}
			}
		}
	}
	if len(found) != 1 {
		return out, fmt.Errorf("envoyharness: the bootstrap's static listeners have %d ext_proc filters, want 1", len(found))
	}
	ep := found[0]
	eg := ep.GetGrpcService().GetEnvoyGrpc()
	if eg == nil {
		return out, fmt.Errorf("envoyharness: the ext_proc filter's grpc_service is not envoy_grpc")
	}
	out.Cluster, out.RetryPolicy = eg.GetClusterName(), ep.GetGrpcService().GetRetryPolicy()
	if mt := ep.GetMessageTimeout(); mt != nil {
		out.MessageTimeout = mt.AsDuration()
	}
	var c *clusterv3.Cluster
	for _, sc := range b.GetStaticResources().GetClusters() {
		if sc.GetName() == out.Cluster {
			c = sc
		}
	}
	if c == nil {
		return out, fmt.Errorf("envoyharness: the ext_proc cluster %q is not among the bootstrap's static clusters", out.Cluster)
	}
	out.Type = c.GetType().String()
	var err error
	if out.Active, out.Standby, err = ClusterHosts(c); err != nil {
		return out, err
	}
	switch hcs := c.GetHealthChecks(); len(hcs) {
	case 0:
	case 1:
		g := hcs[0].GetGrpcHealthCheck()
		if g == nil {
			return out, fmt.Errorf("envoyharness: the ext_proc cluster's health check is not a gRPC one")
		}
		out.HealthCheck = &HealthCheck{
			Interval: hcs[0].GetInterval().AsDuration(), Timeout: hcs[0].GetTimeout().AsDuration(),
			UnhealthyThreshold: hcs[0].GetUnhealthyThreshold().GetValue(), HealthyThreshold: hcs[0].GetHealthyThreshold().GetValue(),
			Service: g.GetServiceName(),
		}
	default:
		return out, fmt.Errorf("envoyharness: the ext_proc cluster has %d health checks, want at most 1", len(hcs))
	}
	return out, nil
}

// ClusterHosts returns the socket addresses of c's load assignment as ip:port, those at
// priority 0 and those at priority 1 (any other priority, or an endpoint without a socket
// address, is an error).
func ClusterHosts(c *clusterv3.Cluster) (active, standby []string, err error) {
	for _, le := range c.GetLoadAssignment().GetEndpoints() {
		for _, lb := range le.GetLbEndpoints() {
			sa := lb.GetEndpoint().GetAddress().GetSocketAddress()
			if sa == nil {
				return nil, nil, fmt.Errorf("envoyharness: cluster %s: an endpoint without a socket address", c.GetName())
			}
			addr := net.JoinHostPort(sa.GetAddress(), strconv.Itoa(int(sa.GetPortValue())))
			switch le.GetPriority() {
			case 0:
				active = append(active, addr)
			case 1:
				standby = append(standby, addr)
			default:
				return nil, nil, fmt.Errorf("envoyharness: cluster %s: priority %d (the harness models 0 and 1)", c.GetName(), le.GetPriority())
			}
		}
	}
	return active, standby, nil
}

// Options configures the harness's ext_proc side streams as b does: the cluster of its hosts
// with its health check (WithExtProcCluster; none when the bootstrap has no health check), the
// retry_policy (WithRetryPolicy) and the message_timeout (when set). With a health check, give
// New an empty ext_proc address (the cluster's hosts are b's); without one, New's address is
// the side streams' one host, as before.
func (b BootstrapExtProc) Options() []Option {
	var opts []Option
	if b.HealthCheck != nil {
		opts = append(opts, WithExtProcCluster(b.Active, b.Standby, *b.HealthCheck))
	}
	opts = append(opts, WithRetryPolicy(b.RetryPolicy))
	if b.MessageTimeout > 0 {
		opts = append(opts, WithMessageTimeout(b.MessageTimeout))
	}
	return opts
}
