package xds

import (
	"bytes"
	"cmp"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strconv"
	"time"

	bootstrapv3 "github.com/envoyproxy/go-control-plane/envoy/config/bootstrap/v3"
	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	listenerv3 "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	tlsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"
	httpv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/upstreams/http/v3"
	matcherv3 "github.com/envoyproxy/go-control-plane/envoy/type/matcher/v3"
	"go.yaml.in/yaml/v3"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/tether-dev/tether/pkg/registry"
	"github.com/tether-dev/tether/pkg/wire"
)

// Bootstrap defaults.
const (
	DefaultNodeID       = "tether-envoy"
	DefaultNodeCluster  = "tether"
	DefaultAdminAddress = "127.0.0.1:9901"
)

// BootstrapParams are the settings of a generated Envoy bootstrap. The zero value of every
// optional field takes its documented default.
type BootstrapParams struct {
	Params
	// NodeID is the Envoy node id (default tether-envoy). tether serves every node id the
	// default snapshot unless a per-node override exists.
	NodeID string
	// NodeCluster is the Envoy node cluster (default tether).
	NodeCluster string
	// XDSAddress is tether's ADS listener, host:port. Required.
	XDSAddress string
	// ExtProcAddress is tether's ext_proc listener, host:port. Required.
	ExtProcAddress string
	// AdminAddress is Envoy's admin listener, ip:port (default 127.0.0.1:9901).
	AdminAddress string
	// ControlPlaneTLS, if set, makes Envoy reach tether's xDS and ext_proc listeners over TLS.
	// With several replicas, every replica's certificate must carry ServerName.
	ControlPlaneTLS *ControlPlaneTLS
	// Replicas lists every tether replica Envoy may use. Empty means the one replica at
	// XDSAddress and ExtProcAddress. With more than one, both control-plane clusters list every
	// replica, are gRPC-health-checked (XDSServiceName, wire.ExtProcServiceName) and have outlier
	// detection; see envoy/README.md. Replica addresses must be reachable as written (an
	// unspecified host is refused).
	Replicas []Replica
	// Standby puts Replicas[0] at priority 0 and the other replicas at priority 1: Envoy uses a
	// standby only while the active replica is unhealthy or ejected (active/standby, for
	// replicas that share no session store). Without it every replica takes traffic
	// (active-active, which needs a shared store). Ignored with fewer than two replicas.
	Standby bool
}

// Replica is one tether replica: its ADS listener and its ext_proc listener, host:port.
type Replica struct {
	XDSAddress     string
	ExtProcAddress string
}

// ControlPlaneTLS is Envoy's side of TLS to tether's gRPC listeners: an
// envoy.transport_sockets.tls UpstreamTlsContext on both control-plane clusters, offering
// ALPN h2 (grpc-go servers refuse a TLS client that negotiates no ALPN). Paths are files on
// Envoy's host.
type ControlPlaneTLS struct {
	// CAFile is the CA that signed tether's certificate. Required.
	CAFile string
	// CertFile and KeyFile are Envoy's client certificate, for tether's mutual TLS; "" sends
	// none.
	CertFile, KeyFile string
	// ServerName is sent as SNI and required among the certificate's DNS SANs; "" verifies
	// the chain only.
	ServerName string
}

// Bootstrap builds an Envoy bootstrap that works with tether out of the box:
//
//   - static clusters XDSClusterName and ExtProcClusterName (HTTP/2 with keepalive; the
//     ext_proc cluster gRPC-health-checked with service wire.ExtProcServiceName and with the same
//     high circuit breakers as the service clusters, since every HTTP request holds one ext_proc
//     stream);
//   - dynamic resources over ADS (api_type GRPC, transport v3) for CDS and, through the
//     clusters' EDS config, EDS; plus LDS when ManagedListeners (the listener then names its
//     routes over RDS);
//   - when listeners are not managed, a static ListenerName with the routes of services inline
//     (regenerate the bootstrap when services change);
//   - admin on AdminAddress and a layered runtime (empty static layer + admin layer) so runtime
//     flags can be set by file or at runtime without code changes.
//
// Addresses whose host is unspecified (0.0.0.0, ::, or empty) are rewritten to loopback: the
// bootstrap then assumes Envoy runs next to tether. Host names make STRICT_DNS clusters.
func Bootstrap(services []registry.Service, bp BootstrapParams) (*bootstrapv3.Bootstrap, error) {
	bp.Params = bp.withDefaults() // promoted from the embedded Params
	if bp.NodeID == "" {
		bp.NodeID = DefaultNodeID
	}
	if bp.NodeCluster == "" {
		bp.NodeCluster = DefaultNodeCluster
	}
	if bp.AdminAddress == "" {
		bp.AdminAddress = DefaultAdminAddress
	}
	xdsCluster, extProcCluster, err := controlPlaneClusters(bp)
	if err != nil {
		return nil, err
	}
	adminHost, adminPort, err := hostPort(bp.AdminAddress)
	if err != nil {
		return nil, fmt.Errorf("bootstrap: admin: %w", err)
	}
	static := &bootstrapv3.Bootstrap_StaticResources{Clusters: []*clusterv3.Cluster{extProcCluster, xdsCluster}}
	slices.SortFunc(static.Clusters, func(a, b *clusterv3.Cluster) int { return cmp.Compare(a.Name, b.Name) })
	dynamic := &bootstrapv3.Bootstrap_DynamicResources{
		AdsConfig: &corev3.ApiConfigSource{
			ApiType:             corev3.ApiConfigSource_GRPC,
			TransportApiVersion: corev3.ApiVersion_V3,
			GrpcServices: []*corev3.GrpcService{{TargetSpecifier: &corev3.GrpcService_EnvoyGrpc_{
				EnvoyGrpc: &corev3.GrpcService_EnvoyGrpc{ClusterName: XDSClusterName},
			}}},
			SetNodeOnFirstMessageOnly: true,
		},
		CdsConfig: adsConfigSource(),
	}
	if bp.ManagedListeners {
		dynamic.LdsConfig = adsConfigSource()
	} else {
		routes, err := RouteConfiguration(RouteConfigName, services)
		if err != nil {
			return nil, fmt.Errorf("bootstrap: %w", err)
		}
		l, err := staticListener(bp.Params, routes)
		if err != nil {
			return nil, fmt.Errorf("bootstrap: %w", err)
		}
		static.Listeners = []*listenerv3.Listener{l}
	}
	return &bootstrapv3.Bootstrap{
		Node:             &corev3.Node{Id: bp.NodeID, Cluster: bp.NodeCluster},
		StaticResources:  static,
		DynamicResources: dynamic,
		Admin:            &bootstrapv3.Admin{Address: socketAddress(adminHost, adminPort)},
		LayeredRuntime: &bootstrapv3.LayeredRuntime{Layers: []*bootstrapv3.RuntimeLayer{
			{Name: "static", LayerSpecifier: &bootstrapv3.RuntimeLayer_StaticLayer{StaticLayer: &structpb.Struct{}}},
			{Name: "admin", LayerSpecifier: &bootstrapv3.RuntimeLayer_AdminLayer_{AdminLayer: &bootstrapv3.RuntimeLayer_AdminLayer{}}},
		}},
	}, nil
}

// controlPlaneClusters builds the static clusters reaching tether's ADS and ext_proc
// listeners, one endpoint per replica.
func controlPlaneClusters(bp BootstrapParams) (xdsCluster, extProcCluster *clusterv3.Cluster, err error) {
	replicas := bp.Replicas
	if len(replicas) == 0 {
		replicas = []Replica{{XDSAddress: bp.XDSAddress, ExtProcAddress: bp.ExtProcAddress}}
	}
	multi := len(replicas) > 1
	var xdsAddrs, extProcAddrs []string
	for _, r := range replicas {
		xdsAddrs, extProcAddrs = append(xdsAddrs, r.XDSAddress), append(extProcAddrs, r.ExtProcAddress)
	}
	standby := multi && bp.Standby
	xdsCluster, err = controlPlaneCluster(XDSClusterName, xdsAddrs, multi, standby, bp.ControlPlaneTLS)
	if err != nil {
		return nil, nil, fmt.Errorf("bootstrap: xds: %w", err)
	}
	extProcCluster, err = controlPlaneCluster(ExtProcClusterName, extProcAddrs, multi, standby, bp.ControlPlaneTLS)
	if err != nil {
		return nil, nil, fmt.Errorf("bootstrap: ext_proc: %w", err)
	}
	extProcCluster.CircuitBreakers = highCircuitBreakers()
	extProcCluster.HealthChecks = []*corev3.HealthCheck{grpcHealthCheck(wire.FilterContract().HealthCheck.Service)}
	if multi {
		xdsCluster.HealthChecks = []*corev3.HealthCheck{grpcHealthCheck(XDSServiceName)}
		xdsCluster.OutlierDetection = outlierDetection()
		extProcCluster.OutlierDetection = outlierDetection()
	}
	return xdsCluster, extProcCluster, nil
}

// grpcHealthCheck is the grpc.health.v1 check of a control-plane cluster: a replica that
// fails twice (or reports NOT_SERVING, as tether does while draining) leaves the cluster
// within about 10 s; one success brings it back.
func grpcHealthCheck(service string) *corev3.HealthCheck {
	return &corev3.HealthCheck{
		Timeout:            durationpb.New(wire.HealthCheckTimeout),
		Interval:           durationpb.New(wire.HealthCheckInterval),
		UnhealthyThreshold: wrapperspb.UInt32(wire.HealthCheckUnhealthyThreshold),
		HealthyThreshold:   wrapperspb.UInt32(wire.HealthCheckHealthyThreshold),
		HealthChecker: &corev3.HealthCheck_GrpcHealthCheck_{GrpcHealthCheck: &corev3.HealthCheck_GrpcHealthCheck{
			ServiceName: service,
		}},
	}
}

// outlierDetection ejects a replica whose gRPC streams fail locally (connect failures,
// resets, timeouts: split_external_local_origin_errors) three times in a row, before the next
// health check would notice. At most half the replicas are ejected (Envoy ejects one even
// when half is less than one), so a two-replica set never loses both to ejection.
func outlierDetection() *clusterv3.OutlierDetection {
	return &clusterv3.OutlierDetection{
		SplitExternalLocalOriginErrors:         true,
		ConsecutiveLocalOriginFailure:          wrapperspb.UInt32(3),
		EnforcingConsecutiveLocalOriginFailure: wrapperspb.UInt32(100),
		ConsecutiveGatewayFailure:              wrapperspb.UInt32(3),
		EnforcingConsecutiveGatewayFailure:     wrapperspb.UInt32(100),
		Interval:                               durationpb.New(5 * time.Second),
		BaseEjectionTime:                       durationpb.New(15 * time.Second),
		MaxEjectionPercent:                     wrapperspb.UInt32(50),
	}
}

// controlPlaneCluster is a static HTTP/2 cluster reaching one of tether's gRPC listeners at
// each of addrs, over TLS when t is set. A single address whose host is unspecified is
// rewritten to loopback; with several replicas (multi) every address must be reachable as
// written. standby puts every address after the first at priority 1.
func controlPlaneCluster(name string, addrs []string, multi, standby bool, t *ControlPlaneTLS) (*clusterv3.Cluster, error) {
	typ := clusterv3.Cluster_STATIC
	var localities []*endpointv3.LocalityLbEndpoints
	seen := map[string]bool{}
	for i, addr := range addrs {
		if addr == "" {
			return nil, fmt.Errorf("address is required")
		}
		host, port, dns, err := controlPlaneHost(addr, multi)
		if err != nil {
			return nil, err
		}
		if dns {
			typ = clusterv3.Cluster_STRICT_DNS
		}
		key := net.JoinHostPort(host, strconv.Itoa(int(port)))
		if seen[key] {
			return nil, fmt.Errorf("replica address %s is listed twice", key)
		}
		seen[key] = true
		ep := &endpointv3.LbEndpoint{HostIdentifier: &endpointv3.LbEndpoint_Endpoint{Endpoint: &endpointv3.Endpoint{Address: socketAddress(host, port)}}}
		var priority uint32
		if standby && i > 0 {
			priority = 1
		}
		if len(localities) == 0 || localities[len(localities)-1].Priority != priority {
			localities = append(localities, &endpointv3.LocalityLbEndpoints{Priority: priority})
		}
		l := localities[len(localities)-1]
		l.LbEndpoints = append(l.LbEndpoints, ep)
	}
	h2, err := toAny(&httpv3.HttpProtocolOptions{
		UpstreamProtocolOptions: &httpv3.HttpProtocolOptions_ExplicitHttpConfig_{
			ExplicitHttpConfig: &httpv3.HttpProtocolOptions_ExplicitHttpConfig{
				ProtocolConfig: &httpv3.HttpProtocolOptions_ExplicitHttpConfig_Http2ProtocolOptions{
					Http2ProtocolOptions: &corev3.Http2ProtocolOptions{
						ConnectionKeepalive: &corev3.KeepaliveSettings{
							Interval: durationpb.New(wire.KeepaliveInterval),
							Timeout:  durationpb.New(wire.KeepaliveTimeout),
						},
					},
				},
			},
		},
	})
	if err != nil {
		return nil, err
	}
	c := &clusterv3.Cluster{
		Name:                          name,
		ClusterDiscoveryType:          &clusterv3.Cluster_Type{Type: typ},
		ConnectTimeout:                durationpb.New(time.Second),
		TypedExtensionProtocolOptions: map[string]*anypb.Any{httpProtocolOptionsName: h2},
		LoadAssignment:                &endpointv3.ClusterLoadAssignment{ClusterName: name, Endpoints: localities},
	}
	if t != nil {
		ts, err := controlPlaneTransportSocket(t)
		if err != nil {
			return nil, err
		}
		c.TransportSocket = ts
	}
	return c, nil
}

// controlPlaneHost splits a control-plane address into the host Envoy connects to and the
// port; dns reports a host name (the cluster resolves it). An IP is written canonically; an
// unspecified or empty host is loopback for a single replica (multi false) and refused for
// several.
func controlPlaneHost(addr string, multi bool) (host string, port uint32, dns bool, err error) {
	host, port, err = hostPort(addr)
	if err != nil {
		return "", 0, false, err
	}
	if ip, err := netip.ParseAddr(host); err == nil {
		switch {
		case multi && ip.IsUnspecified():
			return "", 0, false, fmt.Errorf("replica address %q: an unspecified host is not an address Envoy can reach", addr)
		case ip.Is4() && ip.IsUnspecified():
			return "127.0.0.1", port, false, nil
		case ip.IsUnspecified():
			return "::1", port, false, nil
		default:
			return ip.String(), port, false, nil
		}
	}
	if host == "" {
		if multi {
			return "", 0, false, fmt.Errorf("replica address %q: the host is required", addr)
		}
		return "127.0.0.1", port, false, nil
	}
	return host, port, true, nil
}

// controlPlaneTransportSocket is the UpstreamTlsContext of a control-plane cluster.
func controlPlaneTransportSocket(t *ControlPlaneTLS) (*corev3.TransportSocket, error) {
	if t.CAFile == "" {
		return nil, fmt.Errorf("tls: the CA file Envoy trusts for tether's certificate is required")
	}
	if (t.CertFile == "") != (t.KeyFile == "") {
		return nil, fmt.Errorf("tls: set both Envoy's client certificate and key, or neither")
	}
	file := func(path string) *corev3.DataSource {
		return &corev3.DataSource{Specifier: &corev3.DataSource_Filename{Filename: path}}
	}
	validation := &tlsv3.CertificateValidationContext{TrustedCa: file(t.CAFile)}
	if t.ServerName != "" {
		validation.MatchTypedSubjectAltNames = []*tlsv3.SubjectAltNameMatcher{{
			SanType: tlsv3.SubjectAltNameMatcher_DNS,
			Matcher: &matcherv3.StringMatcher{MatchPattern: &matcherv3.StringMatcher_Exact{Exact: t.ServerName}},
		}}
	}
	ctx := &tlsv3.UpstreamTlsContext{
		Sni: t.ServerName,
		CommonTlsContext: &tlsv3.CommonTlsContext{
			AlpnProtocols:         []string{"h2"},
			ValidationContextType: &tlsv3.CommonTlsContext_ValidationContext{ValidationContext: validation},
		},
	}
	if t.CertFile != "" {
		ctx.CommonTlsContext.TlsCertificates = []*tlsv3.TlsCertificate{{
			CertificateChain: file(t.CertFile),
			PrivateKey:       file(t.KeyFile),
		}}
	}
	a, err := toAny(ctx)
	if err != nil {
		return nil, err
	}
	return &corev3.TransportSocket{Name: "envoy.transport_sockets.tls", ConfigType: &corev3.TransportSocket_TypedConfig{TypedConfig: a}}, nil
}

// BootstrapYAML renders Bootstrap(services, bp) as YAML: proto field names, fields in
// declaration order, two-space indent, no flow style. The output is byte-for-byte
// deterministic for equal inputs.
func BootstrapYAML(services []registry.Service, bp BootstrapParams) ([]byte, error) {
	b, err := Bootstrap(services, bp)
	if err != nil {
		return nil, err
	}
	js, err := protojson.MarshalOptions{UseProtoNames: true}.Marshal(b)
	if err != nil {
		return nil, fmt.Errorf("bootstrap: marshal: %w", err)
	}
	// JSON is YAML: decoding it into a node tree keeps protojson's field order, and clearing the
	// styles turns {"a": "b"} into block style with quotes only where YAML needs them.
	var doc yaml.Node
	if err := yaml.Unmarshal(js, &doc); err != nil {
		return nil, fmt.Errorf("bootstrap: reparse: %w", err)
	}
	clearStyle(&doc)
	var buf bytes.Buffer
	enc := yaml.NewEncoder(&buf)
	enc.SetIndent(2)
	if err := enc.Encode(&doc); err != nil {
		return nil, fmt.Errorf("bootstrap: encode: %w", err)
	}
	if err := enc.Close(); err != nil {
		return nil, fmt.Errorf("bootstrap: encode: %w", err)
	}
	return buf.Bytes(), nil
}

func clearStyle(n *yaml.Node) {
	n.Style = 0
	for _, c := range n.Content {
		clearStyle(c)
	}
}
