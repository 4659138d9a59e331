package wire

// Names of the Envoy wire contract (ext_proc + override_host), shared by the ext_proc server,
// the xDS builders and the config's defaults.
const (
	// DestinationHeader carries the chosen instance's ip:port to Envoy's override_host policy
	// (Gateway API Inference Extension's name). Also the key under LBNamespace in the dynamic
	// metadata tether returns. Configurable: extProc.destinationHeader.
	DestinationHeader = "x-gateway-destination-endpoint"
	// LBNamespace is the dynamic-metadata namespace of the destination and of the host Envoy
	// reports it used. Configurable: extProc.metadataNamespace.
	LBNamespace = "envoy.lb"
	// ServedHostKey is the key under LBNamespace where override_host reports the host it
	// actually used (selected_host_key). Configurable: extProc.servedHostKey.
	ServedHostKey = "x-gateway-destination-endpoint-served"
	// ServiceMetadataKey is the gRPC initial metadata key with which the per-route ext_proc
	// override names the route's service to tether.
	ServiceMetadataKey = "x-tether-service"
	// DataPlaneMetadataKey is the gRPC initial metadata key with which tether's xDS tells
	// tether's ext_proc server what runs the filter; DataPlaneGRPC names a proxyless gRPC client
	// (gRFC A93), whose rejections must carry a gRPC status (see pkg/extproc).
	DataPlaneMetadataKey = "x-tether-data-plane"
	DataPlaneGRPC        = "grpc"
	// DefaultSessionHeader is the header a proxyless gRPC client's route hashes (tether's xDS)
	// when a service names no headerField; the engine mirrors that hash (package ringhash).
	DefaultSessionHeader = "x-tether-session"
	// MetadataNamespace is the route and endpoint metadata namespace tether writes for
	// observability (route: service; endpoint: instance). It is deliberately not LBNamespace,
	// whose keys the subset load balancer would treat as match criteria.
	MetadataNamespace = "tether"
	// ExtProcServiceName is the gRPC service name of the ext_proc server, also the
	// grpc.health.v1 service name Envoy health-checks.
	ExtProcServiceName = "envoy.service.ext_proc.v3.ExternalProcessor"
	// LivenessService and ReadinessService are the grpc.health.v1 service names an endpoint
	// picker answers under the Gateway API Inference Extension's protocol: liveness stays
	// SERVING while the process runs (draining included); readiness follows
	// ExtProcServiceName.
	LivenessService  = "liveness"
	ReadinessService = "readiness"
	// SubsetHintNamespace and SubsetHintKey are where an Inference Extension data plane puts
	// the endpoint picker's subset hint (ext_proc metadata_context filter metadata): the
	// ip:port endpoints eligible for the request.
	SubsetHintNamespace = "envoy.lb.subset_hint"
	SubsetHintKey       = "x-gateway-destination-endpoint-subset"
	// ExtProcFilterName is the ext_proc HTTP filter's name; Envoy keys the filter's request
	// attributes by it.
	ExtProcFilterName = "envoy.filters.http.ext_proc"
)

// Headers of tether's SIP decision endpoint (Kamailio ↔ tether).
const (
	// SIPServiceHeader names the service when the decision path does not.
	SIPServiceHeader = "X-Tether-Service"
	// SIPSourceHeader optionally carries the SIP client's "ip:port" (Kamailio's $si:$sp).
	SIPSourceHeader = "X-Tether-Source"
	// SIPInstanceHeader, on a 200 answer, names the chosen instance's id.
	SIPInstanceHeader = "X-Tether-Instance"
)

// ClientHeader marks an API call as coming from one of tether's own clients (the CLI, the
// dashboard, pkg/api/client; any value). It is not a CORS-safelisted header, so a page on
// another origin cannot send it without a preflight, which the API never grants: a
// state-changing call without a token must carry it (pkg/api).
const ClientHeader = "X-Tether-Client"

// HTTP headers every rejection may carry.
const (
	// RetryAfterHeader carries the retry hint of a retryable rejection in whole seconds.
	RetryAfterHeader = "retry-after"
)
