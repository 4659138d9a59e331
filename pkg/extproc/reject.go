package extproc

import (
	"encoding/json"
	"strconv"
	"strings"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/grpc/codes"

	"github.com/tether-dev/tether/pkg/affinity"
	"github.com/tether-dev/tether/pkg/wire"
)

// StatusFor returns the HTTP status tether answers for a rejection class (wire.Lookup: 400,
// 404, 409, 429, 503, 404 for no service; 500 for an unknown class).
func StatusFor(c affinity.Class) int { return wire.Lookup(c).HTTPStatus }

// GRPCRetryPushbackHeader is gRPC's retry pushback (gRFC A6): the delay, in milliseconds,
// before a gRPC client's retry policy may try again.
const GRPCRetryPushbackHeader = "grpc-retry-pushback-ms"

// replyKind is who turns an ImmediateResponse into what the client sees.
type replyKind int

const (
	// replyHTTP: Envoy, for a plain HTTP request: the HTTP status, headers and body.
	replyHTTP replyKind = iota
	// replyEnvoyGRPC: Envoy, for a gRPC request (content-type application/grpc): a
	// trailers-only response with grpc_status; the body becomes grpc-message.
	replyEnvoyGRPC
	// replyProxylessGRPC: gRPC's own ext_proc filter (gRFC A93): the call fails with
	// grpc_status (INTERNAL when absent) and the details as its message; body and HTTP status
	// are ignored.
	replyProxylessGRPC
)

// replyKind is how this exchange's rejections reach the client.
func (ex *exchange) replyKind() replyKind {
	switch {
	case ex.proxyless:
		return replyProxylessGRPC
	case ex.grpc:
		return replyEnvoyGRPC
	}
	return replyHTTP
}

// isProxylessGRPC reports an exchange run by gRPC's own ext_proc filter (gRFC A93) from what
// the exchange is, not from a header the client may omit: tether's xDS names the data plane in
// the filter's initial metadata (dataPlane, wire.DataPlaneMetadataKey) for the gRPC clients it
// configures, and a filter configured elsewhere is recognised by its request headers carrying
// no :method — Envoy always sends the pseudo headers, gRPC's filter sends none (nor a
// content-type: only the application's metadata).
func isProxylessGRPC(dataPlane string, sawMethod bool) bool {
	return dataPlane == wire.DataPlaneGRPC || !sawMethod
}

// rejectResponse turns a rejection into an ImmediateResponse: the class's status, a JSON
// body, content-type application/json, retry-after (wire.RetryAfterSeconds) for retryable
// classes, and details "tether_<code>" for Envoy's %RESPONSE_CODE_DETAILS%. For a gRPC
// exchange it also carries the class's gRPC code as grpc_status — Envoy turns the reply into a
// trailers-only gRPC response with that status (without it Envoy maps the HTTP status: 429
// becomes UNAVAILABLE), gRPC's ext_proc (A93) fails the call with it (without it: INTERNAL) —
// and, for retryable classes, grpc-retry-pushback-ms with the same delay as retry-after. For
// gRPC's own filter the details are the status message the application sees: "<code>:
// <message>", so the stable code reaches it (status details may not survive the client side).
func rejectResponse(r *affinity.Reject, k replyKind) *extprocv3.ProcessingResponse {
	row := wire.Lookup(r.Class)
	code := r.Code
	if code == "" {
		code = row.Code
	}
	var secs int64
	if row.Retryable {
		secs = wire.RetryAfterSeconds(r.RetryAfter)
	}
	return withReplyKind(immediate(row.HTTPStatus, code, r.Message, secs), k, row.GRPCCode, code, r.Message, secs)
}

func internalErrorResponse(k replyKind) *extprocv3.ProcessingResponse {
	row := wire.Lookup(0)
	const msg = "tether could not decide where this request goes"
	return withReplyKind(immediate(row.HTTPStatus, row.Code, msg, 0), k, row.GRPCCode, row.Code, msg, 0)
}

// expiredResponse is the reset of an exchange that outlived its limit: 504 (DEADLINE_EXCEEDED
// for gRPC), code ExchangeLifetimeExceeded. Sent after the response started, Envoy resets the
// downstream stream instead.
func expiredResponse(k replyKind) *extprocv3.ProcessingResponse {
	const code, msg = "ExchangeLifetimeExceeded", "the exchange outlived its limit (extProc.maxRequestLifetime, or the service's maxLifetime for a stream)"
	return withReplyKind(immediate(504, code, msg, 0), k, codes.DeadlineExceeded, code, msg, 0)
}

// withReplyKind completes an ImmediateResponse for a gRPC exchange: grpc_status, and
// grpc-retry-pushback-ms when retrySecs > 0; for gRPC's own filter the details "<code>: <msg>".
func withReplyKind(resp *extprocv3.ProcessingResponse, k replyKind, gc codes.Code, code, msg string, retrySecs int64) *extprocv3.ProcessingResponse {
	if k == replyHTTP {
		return resp
	}
	imm := resp.GetImmediateResponse()
	imm.GrpcStatus = &extprocv3.GrpcStatus{Status: uint32(gc)}
	if retrySecs > 0 {
		imm.Headers.SetHeaders = append(imm.Headers.SetHeaders,
			overwriteHeader(GRPCRetryPushbackHeader, strconv.FormatInt(retrySecs*1000, 10)))
	}
	if k == replyProxylessGRPC {
		imm.Details = code
		if msg != "" {
			imm.Details += ": " + msg
		}
	}
	return resp
}

// isGRPCRequest reports a gRPC request by its content-type (application/grpc or
// application/grpc+<codec>), as Envoy's Grpc::Common::isGrpcRequestHeaders does.
func isGRPCRequest(contentType string) bool {
	ct, _, _ := strings.Cut(contentType, ";")
	ct = strings.ToLower(strings.TrimSpace(ct))
	return ct == "application/grpc" || strings.HasPrefix(ct, "application/grpc+")
}

// immediate builds an ImmediateResponse; retrySecs > 0 adds retry-after.
func immediate(st int, code, msg string, retrySecs int64) *extprocv3.ProcessingResponse {
	body, _ := json.Marshal(wire.ErrorBody{ErrorCode: code, ErrorMessage: msg}) // cannot fail: two strings
	set := []*corev3.HeaderValueOption{overwriteHeader("content-type", "application/json")}
	if retrySecs > 0 {
		set = append(set, overwriteHeader(wire.RetryAfterHeader, strconv.FormatInt(retrySecs, 10)))
	}
	return &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ImmediateResponse{
		ImmediateResponse: &extprocv3.ImmediateResponse{
			Status:  &typev3.HttpStatus{Code: typev3.StatusCode(st)},
			Headers: &extprocv3.HeaderMutation{SetHeaders: set},
			Body:    body,
			Details: "tether_" + code,
		},
	}}
}
