package xds

import (
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/tether-dev/tether/pkg/wire"
)

// ExtProcRequestAttributes are the CEL attributes Envoy sends with request_headers. tether
// uses the downstream address and port (the default HTTP consistent-hash key, and logs) and
// Envoy's request id (log correlation).
func ExtProcRequestAttributes() []string { return wire.FilterContract().RequestAttributes }

// ExternalProcessor builds the ext_proc HTTP filter configuration of the wire contract
// (wire.FilterContract, the one source the recipes are checked against too):
//
//   - gRPC service: the static cluster ExtProcClusterName (Envoy's own gRPC client, so the
//     cluster's health check and circuit breakers apply). No grpc_service timeout: the
//     side stream lives as long as its HTTP request, which may be a long-lived stream.
//     retry_policy (ExtProcRetryPolicy): a side stream that cannot start on a replica (refused
//     connection, REFUSED_STREAM, UNAVAILABLE before any answer) is retried on another one, so
//     a replica that stopped before the health check noticed costs no request. Envoy gRPC
//     clients apply GrpcService.retry_policy to their streams (core/v3/grpc_service.proto:
//     "Data-plane gRPC clients (for example external authorization or external processing
//     filters) must use GrpcService.retry_policy"); the ext_proc filter starts its stream with
//     setBufferBodyForRetry(true) so the first message can be replayed.
//   - processing mode: wire.BaseProcessingMode: request and response headers SEND; bodies NONE; request trailers SKIP;
//     response trailers SEND. Sending response trailers is what keeps the side stream open until
//     the HTTP exchange ends on Envoy ≥ 1.37 (otherwise Envoy closes it right after the
//     response_headers answer, and tether could not release the request slot at the real end of
//     a long response). The runtime guard envoy.reloadable_features.ext_proc_stream_close_optimization
//     is left at its default (true).
//   - allow_mode_override: MCP SSE asks for a STREAMED response body on that one response.
//   - message_timeout from Params; failure_mode_allow false with status_on_error 503: when
//     tether cannot decide, the request fails closed with 503 instead of reaching an arbitrary
//     instance.
//   - metadata_options: Envoy accepts dynamic metadata only in LBNamespace (tether's choice for
//     override_host) and forwards that namespace back (the served host on response_headers).
//   - request_attributes: ExtProcRequestAttributes.
func ExternalProcessor(p Params) *extprocv3.ExternalProcessor {
	p = p.withDefaults()
	fc := wire.FilterContract()
	ns := &extprocv3.MetadataOptions_MetadataNamespaces{Untyped: []string{p.LBNamespace}}
	return &extprocv3.ExternalProcessor{
		GrpcService: &corev3.GrpcService{
			TargetSpecifier: &corev3.GrpcService_EnvoyGrpc_{EnvoyGrpc: &corev3.GrpcService_EnvoyGrpc{ClusterName: ExtProcClusterName}},
			RetryPolicy:     ExtProcRetryPolicy(),
		},
		ProcessingMode:    processingMode(fc.Mode),
		AllowModeOverride: fc.AllowModeOverride,
		MessageTimeout:    durationpb.New(p.MessageTimeout),
		FailureModeAllow:  fc.FailureModeAllow,
		StatusOnError:     &typev3.HttpStatus{Code: typev3.StatusCode(fc.StatusOnError)},
		MetadataOptions: &extprocv3.MetadataOptions{
			ReceivingNamespaces:  ns,
			ForwardingNamespaces: &extprocv3.MetadataOptions_MetadataNamespaces{Untyped: []string{p.LBNamespace}},
		},
		RequestAttributes: fc.RequestAttributes,
	}
}

// ExtProcRetryPolicy is the ext_proc side stream's retry policy: two more attempts, 25–250 ms
// apart, when the stream could not start (connect-failure, refused-stream) or tether refused
// it with UNAVAILABLE before answering. A retry happens only before tether's first answer (the
// router does not retry once response headers arrived), so no exchange is decided twice.
func ExtProcRetryPolicy() *corev3.RetryPolicy {
	return &corev3.RetryPolicy{
		RetryOn:    "connect-failure,refused-stream,unavailable",
		NumRetries: wrapperspb.UInt32(2),
		RetryBackOff: &corev3.BackoffStrategy{
			BaseInterval: durationpb.New(25 * time.Millisecond),
			MaxInterval:  durationpb.New(250 * time.Millisecond),
		},
	}
}

// ExtProcPerRoute names the route's service to tether: the ext_proc stream of every request on
// the route carries gRPC initial metadata ServiceMetadataKey: service.
func ExtProcPerRoute(service string) *extprocv3.ExtProcPerRoute {
	return &extprocv3.ExtProcPerRoute{Override: &extprocv3.ExtProcPerRoute_Overrides{Overrides: &extprocv3.ExtProcOverrides{
		GrpcInitialMetadata: []*corev3.HeaderValue{{Key: wire.ServiceMetadataKey, Value: service}},
	}}}
}

// extProcFilter wraps ExternalProcessor as an HCM HTTP filter.
func extProcFilter(p Params) (*hcmv3.HttpFilter, error) {
	a, err := toAny(ExternalProcessor(p))
	if err != nil {
		return nil, err
	}
	return &hcmv3.HttpFilter{Name: extProcFilterName, ConfigType: &hcmv3.HttpFilter_TypedConfig{TypedConfig: a}}, nil
}

// processingMode converts a wire processing mode (whose values are Envoy's enum values).
func processingMode(m wire.ProcessingMode) *extprocv3.ProcessingMode {
	return &extprocv3.ProcessingMode{
		RequestHeaderMode:   extprocv3.ProcessingMode_HeaderSendMode(m.RequestHeaders),
		ResponseHeaderMode:  extprocv3.ProcessingMode_HeaderSendMode(m.ResponseHeaders),
		RequestBodyMode:     extprocv3.ProcessingMode_BodySendMode(m.RequestBody),
		ResponseBodyMode:    extprocv3.ProcessingMode_BodySendMode(m.ResponseBody),
		RequestTrailerMode:  extprocv3.ProcessingMode_HeaderSendMode(m.RequestTrailers),
		ResponseTrailerMode: extprocv3.ProcessingMode_HeaderSendMode(m.ResponseTrailers),
	}
}
