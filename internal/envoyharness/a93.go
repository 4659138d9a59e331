package envoyharness

import (
	"strings"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/protobuf/types/known/structpb"
)

// With GRPCSemantics the harness stands in for gRPC's own ext_proc filter (gRFC A93, grpc-go
// internal/xds/httpfilter/extproc), which differs from Envoy's in what it sends and in how an
// ImmediateResponse reaches the caller:
//
//   - request_headers carry only the application's metadata (httpfilter.ConstructHeaderMap over
//     the outgoing metadata): no pseudo headers, no content-type, te, user-agent or grpc-*
//     transport headers, and none the connection manager would add (x-request-id,
//     x-forwarded-proto);
//   - request attributes: request.path and request.url_path (the method), request.host,
//     request.method (POST), request.headers, request.id only when the application set
//     x-request-id; no source.* (constructRequestAttributes);
//   - an ImmediateResponse fails the call with grpc_status (INTERNAL when absent) and the
//     details as the status message (handleImmediateResponse); status, headers and body are
//     not seen by the application.

// a93Headers is what gRPC's filter sends as request_headers for h.
func a93Headers(h *headerMap) *corev3.HeaderMap {
	out := &corev3.HeaderMap{}
	for _, e := range h.entries {
		if a93Transport(e.key) {
			continue
		}
		out.Headers = append(out.Headers, &corev3.HeaderValue{Key: e.key, RawValue: []byte(e.value)})
	}
	return out
}

// a93Transport reports a header gRPC's transport writes itself, never part of the
// application's outgoing metadata.
func a93Transport(key string) bool {
	switch key {
	case "content-type", "te", "user-agent", "content-length", "accept-encoding":
		return true
	}
	return strings.HasPrefix(key, ":") || strings.HasPrefix(key, "grpc-")
}

// a93Attributes are the request attributes gRPC's filter sends, for the attributes Envoy's
// configuration of the harness names (source.address, source.port, request.id): only
// request.id, and only when the application sent x-request-id.
func a93Attributes(h *headerMap) map[string]*structpb.Struct {
	id := h.first("x-request-id")
	if id == "" {
		return nil
	}
	return map[string]*structpb.Struct{"envoy.filters.http.ext_proc": {Fields: map[string]*structpb.Value{
		"request.id": structpb.NewStringValue(id),
	}}}
}

// a93Status is the gRPC status gRPC's filter fails a call with on an ImmediateResponse:
// grpc_status (UNKNOWN above 16), else INTERNAL, with the details as the message.
func a93Status(grpcStatus *extprocv3.GrpcStatus, details string) (code int, msg string) {
	code = 13 // INTERNAL
	if grpcStatus != nil {
		code = int(grpcStatus.GetStatus())
		if code > 16 {
			code = 2 // UNKNOWN
		}
	}
	return code, details
}
