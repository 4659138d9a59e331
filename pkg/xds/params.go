package xds

import (
	"fmt"
	"net"
	"strconv"
	"time"

	"github.com/tether-dev/tether/pkg/wire"
)

// Well-known names shared by the builders, the shipped bootstrap and tether's ext_proc server.
const (
	// ExtProcClusterName is the static bootstrap cluster that reaches tether's ext_proc server.
	ExtProcClusterName = "tether_ext_proc"
	// XDSClusterName is the static bootstrap cluster that reaches tether's ADS server.
	XDSClusterName = "tether_xds"
	// ListenerName is the data-plane listener (static in the bootstrap, or served over LDS when
	// listeners are managed).
	ListenerName = "tether_http"
	// RouteConfigName is the route configuration of ListenerName (inline in the static
	// listener, or served over RDS when listeners are managed).
	RouteConfigName = "tether_routes"
	// XDSServiceName is the gRPC service name of the ADS server, also the grpc.health.v1
	// service name the xDS listener reports and Envoy's health check of XDSClusterName (with
	// several replicas) asks for.
	XDSServiceName = "envoy.service.discovery.v3.AggregatedDiscoveryService"
)

// Envoy extension names used in the generated configuration.
const (
	extProcFilterName       = wire.ExtProcFilterName
	routerFilterName        = "envoy.filters.http.router"
	hcmFilterName           = "envoy.filters.network.http_connection_manager"
	overrideHostPolicyName  = "envoy.load_balancing_policies.override_host"
	roundRobinPolicyName    = "envoy.load_balancing_policies.round_robin"
	leastRequestPolicyName  = "envoy.load_balancing_policies.least_request"
	maglevPolicyName        = "envoy.load_balancing_policies.maglev"
	ringHashPolicyName      = "envoy.load_balancing_policies.ring_hash"
	httpProtocolOptionsName = "envoy.extensions.upstreams.http.v3.HttpProtocolOptions"
	earlyHeaderMutationName = "envoy.http.early_header_mutation.header_mutation"
)

// Defaults applied by Params.withDefaults. They mirror the config file's defaults.
const (
	DefaultListenerAddress = "0.0.0.0:10000"
	DefaultConnectTimeout  = 2 * time.Second
)

// Params are the deployment-wide settings the builders need besides the registry model.
// The zero value is usable: every empty field takes the documented default. Params is a plain
// value; builders never modify it.
type Params struct {
	// DestinationHeader is the request header carrying the chosen ip:port
	// (default x-gateway-destination-endpoint). It is also the key under LBNamespace in the
	// dynamic metadata that override_host reads first.
	DestinationHeader string
	// LBNamespace is the dynamic metadata namespace ext_proc writes and Envoy forwards back to
	// it (default envoy.lb).
	LBNamespace string
	// ServedHostKey is the key under LBNamespace where override_host records the host it
	// actually chose (default x-gateway-destination-endpoint-served).
	ServedHostKey string
	// MessageTimeout bounds each ext_proc message exchange (default 500ms).
	MessageTimeout time.Duration
	// ManagedListeners makes tether serve the data-plane listener and its routes over LDS/RDS
	// instead of placing them statically in the bootstrap.
	ManagedListeners bool
	// ListenerAddress is the data-plane listener's ip:port (default 0.0.0.0:10000). It must be
	// an IP literal: Envoy listeners bind addresses, not names.
	ListenerAddress string
	// GRPCExtProcTarget, for the gRPC profile only, is tether's ext_proc server as proxyless
	// gRPC clients dial it (a gRPC target URI, e.g. dns:///tether.tether-system:9002; it must
	// equal the key of the clients' bootstrap allowed_grpc_services entry). Empty: gRPC clients
	// get no ext_proc filter (hashing only).
	GRPCExtProcTarget string
}

func (p Params) withDefaults() Params {
	if p.DestinationHeader == "" {
		p.DestinationHeader = wire.DestinationHeader
	}
	if p.LBNamespace == "" {
		p.LBNamespace = wire.LBNamespace
	}
	if p.ServedHostKey == "" {
		p.ServedHostKey = wire.ServedHostKey
	}
	if p.MessageTimeout == 0 {
		p.MessageTimeout = wire.DefaultMessageTimeout
	}
	if p.ListenerAddress == "" {
		p.ListenerAddress = DefaultListenerAddress
	}
	return p
}

// hostPort splits an address into host and port, accepting "host:port" and "[v6]:port".
func hostPort(addr string) (string, uint32, error) {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return "", 0, fmt.Errorf("address %q: %w", addr, err)
	}
	n, err := strconv.ParseUint(port, 10, 16)
	if err != nil || n == 0 {
		return "", 0, fmt.Errorf("address %q: port must be 1..65535", addr)
	}
	return host, uint32(n), nil
}
