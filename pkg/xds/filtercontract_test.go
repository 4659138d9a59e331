package xds_test

import (
	"testing"

	bootstrapv3 "github.com/envoyproxy/go-control-plane/envoy/config/bootstrap/v3"
	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	listenerv3 "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	httpv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/upstreams/http/v3"
	"github.com/google/go-cmp/cmp"

	"github.com/tether-dev/tether/pkg/registry"
	"github.com/tether-dev/tether/pkg/wire"
	"github.com/tether-dev/tether/pkg/xds"
)

// observedFilter reads the contract's filter fields back from a built ext_proc filter.
func observedFilter(ep *extprocv3.ExternalProcessor) wire.Filter {
	pm := ep.GetProcessingMode()
	mode := wire.ProcessingMode{
		RequestHeaders: wire.HeaderMode(pm.GetRequestHeaderMode()), ResponseHeaders: wire.HeaderMode(pm.GetResponseHeaderMode()),
		RequestBody: wire.BodyMode(pm.GetRequestBodyMode()), ResponseBody: wire.BodyMode(pm.GetResponseBodyMode()),
		RequestTrailers: wire.HeaderMode(pm.GetRequestTrailerMode()), ResponseTrailers: wire.HeaderMode(pm.GetResponseTrailerMode()),
	}
	f := wire.Filter{
		Mode:              mode,
		AllowModeOverride: ep.GetAllowModeOverride(),
		MessageTimeout:    ep.GetMessageTimeout().AsDuration(),
		FailureModeAllow:  ep.GetFailureModeAllow(),
		StatusOnError:     int(ep.GetStatusOnError().GetCode()),
		RequestAttributes: ep.GetRequestAttributes(),
	}
	if r, fw := ep.GetMetadataOptions().GetReceivingNamespaces().GetUntyped(), ep.GetMetadataOptions().GetForwardingNamespaces().GetUntyped(); len(r) == 1 && len(fw) == 1 && r[0] == fw[0] {
		f.Namespace = r[0]
	}
	return f
}

// envoyFilterFields is the contract as an Envoy listener's filter must carry it.
func envoyFilterFields(fc wire.Filter) wire.Filter {
	return wire.Filter{Mode: fc.Mode, AllowModeOverride: fc.AllowModeOverride, MessageTimeout: fc.MessageTimeout,
		FailureModeAllow: fc.FailureModeAllow, StatusOnError: fc.StatusOnError, RequestAttributes: fc.RequestAttributes, Namespace: fc.Namespace}
}

func listenerExtProc(t *testing.T, l *listenerv3.Listener) *extprocv3.ExternalProcessor {
	t.Helper()
	var hcm *hcmv3.HttpConnectionManager
	if a := l.GetApiListener().GetApiListener(); a != nil {
		hcm = unpack(t, a, &hcmv3.HttpConnectionManager{})
	} else {
		hcm = unpack(t, l.GetFilterChains()[0].GetFilters()[0].GetTypedConfig(), &hcmv3.HttpConnectionManager{})
	}
	for _, f := range hcm.GetHttpFilters() {
		if f.GetName() == "envoy.filters.http.ext_proc" {
			return unpack(t, f.GetTypedConfig(), &extprocv3.ExternalProcessor{})
		}
	}
	t.Fatalf("listener %s has no ext_proc filter", l.GetName())
	return nil
}

// observedCluster reads the contract's cluster fields back from a cluster: the circuit
// breaker limit (when every threshold of every priority is the same), and for the ext_proc
// cluster the health check and HTTP/2 keepalive.
func observedCluster(t *testing.T, c *clusterv3.Cluster) wire.Filter {
	t.Helper()
	var f wire.Filter
	for i, th := range c.GetCircuitBreakers().GetThresholds() {
		l := th.GetMaxConnections().GetValue()
		if th.GetMaxPendingRequests().GetValue() != l || th.GetMaxRequests().GetValue() != l || (i > 0 && l != f.CircuitBreakerLimit) {
			t.Errorf("cluster %s: circuit breakers differ between fields or priorities: %v", c.GetName(), c.GetCircuitBreakers())
		}
		f.CircuitBreakerLimit = l
	}
	if hcs := c.GetHealthChecks(); len(hcs) == 1 {
		hc := hcs[0]
		f.HealthCheck = wire.HealthCheck{
			Service: hc.GetGrpcHealthCheck().GetServiceName(), Interval: hc.GetInterval().AsDuration(), Timeout: hc.GetTimeout().AsDuration(),
			UnhealthyThreshold: hc.GetUnhealthyThreshold().GetValue(), HealthyThreshold: hc.GetHealthyThreshold().GetValue(),
		}
	}
	if a := c.GetTypedExtensionProtocolOptions()["envoy.extensions.upstreams.http.v3.HttpProtocolOptions"]; a != nil {
		ka := unpack(t, a, &httpv3.HttpProtocolOptions{}).GetExplicitHttpConfig().GetHttp2ProtocolOptions().GetConnectionKeepalive()
		f.Keepalive = wire.Keepalive{Interval: ka.GetInterval().AsDuration(), Timeout: ka.GetTimeout().AsDuration()}
	}
	return f
}

func staticCluster(t *testing.T, b *bootstrapv3.Bootstrap, name string) *clusterv3.Cluster {
	t.Helper()
	for _, c := range b.GetStaticResources().GetClusters() {
		if c.GetName() == name {
			return c
		}
	}
	t.Fatalf("bootstrap has no cluster %s", name)
	return nil
}

// TestBuildersFollowTheFilterContract: every ext_proc filter and cluster tether generates
// carries wire.FilterContract — the bootstrap's static listener and ext_proc cluster, the
// managed xDS listener, the service clusters, and the proxyless gRPC profile's filter (the
// recipes are held to the same contract in deploy/).
func TestBuildersFollowTheFilterContract(t *testing.T) {
	fc := wire.FilterContract()
	svcs := []registry.Service{{Name: "web"}}
	b, err := xds.Bootstrap(svcs, xds.BootstrapParams{XDSAddress: "127.0.0.1:18000", ExtProcAddress: "127.0.0.1:9002"})
	if err != nil {
		t.Fatal(err)
	}
	managed, err := xds.Listener(xds.Params{ManagedListeners: true})
	if err != nil {
		t.Fatal(err)
	}
	for name, l := range map[string]*listenerv3.Listener{"bootstrap listener": b.GetStaticResources().GetListeners()[0], "xDS listener": managed} {
		if d := cmp.Diff(envoyFilterFields(fc), observedFilter(listenerExtProc(t, l))); d != "" {
			t.Errorf("%s ext_proc filter differs from the contract (-contract +built):\n%s", name, d)
		}
	}

	want := wire.Filter{CircuitBreakerLimit: fc.CircuitBreakerLimit, HealthCheck: fc.HealthCheck, Keepalive: fc.Keepalive}
	if d := cmp.Diff(want, observedCluster(t, staticCluster(t, b, xds.ExtProcClusterName))); d != "" {
		t.Errorf("bootstrap ext_proc cluster differs from the contract (-contract +built):\n%s", d)
	}
	svc, err := xds.Cluster(svcs[0], xds.Params{})
	if err != nil {
		t.Fatal(err)
	}
	if got := observedCluster(t, svc).CircuitBreakerLimit; got != fc.CircuitBreakerLimit {
		t.Errorf("service cluster circuit breakers = %d, want %d", got, fc.CircuitBreakerLimit)
	}

	reg := registry.New()
	if err := reg.Apply(svcs, nil); err != nil {
		t.Fatal(err)
	}
	rs, err := xds.Resources(xds.Profile{Kind: xds.KindGRPC, Params: xds.Params{GRPCExtProcTarget: "dns:///t:9002"}}, reg.Snapshot())
	if err != nil {
		t.Fatal(err)
	}
	got := observedFilter(listenerExtProc(t, rs.Listeners[0]))
	got.RequestAttributes, got.GRPCRequestAttributes = nil, got.RequestAttributes
	grpcWant := wire.Filter{Mode: fc.GRPCMode, FailureModeAllow: fc.FailureModeAllow, GRPCRequestAttributes: fc.GRPCRequestAttributes}
	if d := cmp.Diff(grpcWant, got); d != "" {
		t.Errorf("gRPC profile ext_proc filter differs from the contract (-contract +built):\n%s", d)
	}
	if got := observedCluster(t, rs.Clusters[0]).CircuitBreakerLimit; got != fc.CircuitBreakerLimit {
		t.Errorf("gRPC cluster circuit breakers = %d, want %d", got, fc.CircuitBreakerLimit)
	}
}
