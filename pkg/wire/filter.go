package wire

import (
	"encoding/json"
	"time"
)

// Filter is the one source of what tether needs from the ext_proc filter of every data plane
// that attaches it, and from the cluster that filter dials: tether's generated Envoy bootstrap
// and xDS listeners (pkg/xds), the proxyless gRPC profile (pkg/xds GRPCExternalProcessor), and
// the recipes for other projects (deploy/envoy-gateway, deploy/istio), which cannot import Go
// and are checked against FilterContractFile, the JSON rendering of FilterContract.
type Filter struct {
	// Mode is the processing mode of a headers-only service; FullDuplexMode that of a service
	// whose bodies stream through tether (and of Envoy Gateway, whose API sends response
	// trailers only with full-duplex bodies). GRPCMode is what a proxyless gRPC client's filter
	// is given (gRFC A93 knows only NONE and GRPC bodies and no request trailers).
	Mode, FullDuplexMode, GRPCMode ProcessingMode `json:"-"`
	// AllowModeOverride lets tether stream an MCP SSE response body (Envoy only).
	AllowModeOverride bool `json:"allowModeOverride"`
	// MessageTimeout bounds each message exchange (Envoy; gRPC ignores it). The default of
	// extProc.messageTimeout.
	MessageTimeout time.Duration `json:"-"`
	// FailureModeAllow false: when tether cannot answer, the request fails (closed).
	FailureModeAllow bool `json:"failureModeAllow"`
	// StatusOnError is the HTTP status Envoy answers when the side stream fails.
	StatusOnError int `json:"statusOnError"`
	// Namespace is the dynamic metadata namespace tether writes (receiving) and reads back
	// (forwarding): LBNamespace.
	Namespace string `json:"metadataNamespace"`
	// DestinationHeader and ServedHostKey: the header (and envoy.lb key) carrying tether's
	// choice to override_host, and the key override_host reports the host it used under.
	DestinationHeader string `json:"destinationHeader"`
	ServedHostKey     string `json:"servedHostKey"`
	// RequestAttributes are the CEL attributes Envoy sends with request_headers: the
	// downstream address and port (the default HTTP hash key, logs) and the request id.
	// GRPCRequestAttributes are those of a gRPC client's filter, which has no source.*: the
	// channel's authority and the full method, read in place of :authority and :path.
	RequestAttributes     []string `json:"requestAttributes"`
	GRPCRequestAttributes []string `json:"grpcRequestAttributes"`
	// CircuitBreakerLimit is max_connections, max_pending_requests and max_requests of the
	// ext_proc cluster and of every backend cluster: far above Envoy's default 1,024, so only
	// tether's request slots limit concurrency (with full-duplex bodies every request in
	// flight holds a side stream).
	CircuitBreakerLimit uint32 `json:"circuitBreakerLimit"`
	// HealthCheck is the active grpc.health.v1 check of the ext_proc cluster.
	HealthCheck HealthCheck `json:"healthCheck"`
	// Keepalive is the HTTP/2 PING keepalive on the ext_proc cluster's connections.
	Keepalive Keepalive `json:"keepalive"`
}

// HealthCheck is an active gRPC health check: a replica that fails UnhealthyThreshold times
// in a row (or answers NOT_SERVING, as tether does while draining) leaves the cluster within
// about Interval × UnhealthyThreshold; HealthyThreshold successes bring it back.
type HealthCheck struct {
	Service            string        `json:"service"`
	Interval           time.Duration `json:"-"`
	Timeout            time.Duration `json:"-"`
	UnhealthyThreshold uint32        `json:"unhealthyThreshold"`
	HealthyThreshold   uint32        `json:"healthyThreshold"`
}

// Keepalive is HTTP/2 PING keepalive: a PING after Interval without frames, the connection
// closed when no answer comes within Timeout.
type Keepalive struct {
	Interval time.Duration `json:"-"`
	Timeout  time.Duration `json:"-"`
}

// Constants of the filter contract that other packages need as constants.
const (
	// DefaultMessageTimeout is Filter.MessageTimeout (extProc.messageTimeout's default).
	DefaultMessageTimeout = 500 * time.Millisecond
	// CircuitBreakerLimit is Filter.CircuitBreakerLimit.
	CircuitBreakerLimit = 1_000_000
)

// FilterContract returns tether's ext_proc filter contract. Callers may modify the result.
func FilterContract() Filter {
	return Filter{
		Mode:                  BaseProcessingMode(),
		FullDuplexMode:        FullDuplexProcessingMode(),
		GRPCMode:              BaseProcessingMode(),
		AllowModeOverride:     true,
		MessageTimeout:        DefaultMessageTimeout,
		FailureModeAllow:      false,
		StatusOnError:         503,
		Namespace:             LBNamespace,
		DestinationHeader:     DestinationHeader,
		ServedHostKey:         ServedHostKey,
		RequestAttributes:     []string{"source.address", "source.port", "request.id"},
		GRPCRequestAttributes: []string{"request.host", "request.path"},
		CircuitBreakerLimit:   CircuitBreakerLimit,
		HealthCheck: HealthCheck{
			Service: ExtProcServiceName, Interval: HealthCheckInterval, Timeout: HealthCheckTimeout,
			UnhealthyThreshold: HealthCheckUnhealthyThreshold, HealthyThreshold: HealthCheckHealthyThreshold,
		},
		Keepalive: Keepalive{Interval: KeepaliveInterval, Timeout: KeepaliveTimeout},
	}
}

// FilterContractFile is where the repository keeps FilterContract as JSON (make generate; a
// pkg/wire test fails when it is stale), relative to the repository root.
const FilterContractFile = "deploy/filter-contract.json"

// modeJSON is a processing mode by Envoy's enum names.
type modeJSON struct {
	RequestHeaders   string `json:"requestHeaderMode"`
	ResponseHeaders  string `json:"responseHeaderMode"`
	RequestBody      string `json:"requestBodyMode"`
	ResponseBody     string `json:"responseBodyMode"`
	RequestTrailers  string `json:"requestTrailerMode"`
	ResponseTrailers string `json:"responseTrailerMode"`
}

func (m ProcessingMode) jsonForm() modeJSON {
	return modeJSON{m.RequestHeaders.String(), m.ResponseHeaders.String(), m.RequestBody.String(),
		m.ResponseBody.String(), m.RequestTrailers.String(), m.ResponseTrailers.String()}
}

// String is Envoy's name of the mode.
func (m HeaderMode) String() string {
	switch m {
	case HeaderSend:
		return "SEND"
	case HeaderSkip:
		return "SKIP"
	}
	return "DEFAULT"
}

// String is Envoy's name of the mode.
func (m BodyMode) String() string {
	switch m {
	case BodyStreamed:
		return "STREAMED"
	case BodyFullDuplexStreamed:
		return "FULL_DUPLEX_STREAMED"
	}
	return "NONE"
}

// MarshalJSON renders the contract for FilterContractFile: modes by Envoy's enum names,
// durations in seconds as Envoy's JSON writes them ("0.5s").
func (f Filter) MarshalJSON() ([]byte, error) {
	type plain Filter // without this method
	type hc struct {
		HealthCheck
		Interval string `json:"interval"`
		Timeout  string `json:"timeout"`
	}
	return json.Marshal(struct {
		plain
		Mode           modeJSON `json:"processingMode"`
		FullDuplexMode modeJSON `json:"fullDuplexProcessingMode"`
		GRPCMode       modeJSON `json:"grpcProcessingMode"`
		MessageTimeout string   `json:"messageTimeout"`
		HealthCheck    hc       `json:"healthCheck"`
		Keepalive      struct {
			Interval string `json:"interval"`
			Timeout  string `json:"timeout"`
		} `json:"keepalive"`
	}{
		plain:          plain(f),
		Mode:           f.Mode.jsonForm(),
		FullDuplexMode: f.FullDuplexMode.jsonForm(),
		GRPCMode:       f.GRPCMode.jsonForm(),
		MessageTimeout: seconds(f.MessageTimeout),
		HealthCheck:    hc{f.HealthCheck, seconds(f.HealthCheck.Interval), seconds(f.HealthCheck.Timeout)},
		Keepalive: struct {
			Interval string `json:"interval"`
			Timeout  string `json:"timeout"`
		}{seconds(f.Keepalive.Interval), seconds(f.Keepalive.Timeout)},
	})
}

// seconds is d as protobuf JSON writes a Duration: "0.500s" trimmed to "0.5s", "5s".
func seconds(d time.Duration) string {
	return jsonNumber(d.Seconds()) + "s"
}

func jsonNumber(f float64) string {
	b, _ := json.Marshal(f) // a finite float: cannot fail
	return string(b)
}
