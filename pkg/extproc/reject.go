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

// ErrorBody is the JSON body of every rejection tether sends.
type ErrorBody struct {
	ErrorCode    string `json:"errorCode"`
	ErrorMessage string `json:"errorMessage"`
}

// rejectResponse turns a rejection into an ImmediateResponse: the class's status, a JSON
// body, content-type application/json, retry-after (wire.RetryAfterSeconds) for retryable
// classes, and details "tether_<code>" for Envoy's %RESPONSE_CODE_DETAILS%. For a gRPC request
// (grpc) it also carries the class's gRPC code as grpc_status — Envoy turns the reply into a
// trailers-only gRPC response with that status; without it Envoy maps the HTTP status (429
// becomes UNAVAILABLE) and gRPC's ext_proc (A93) reports INTERNAL — and, for retryable
// classes, grpc-retry-pushback-ms with the same delay as retry-after.
func rejectResponse(r *affinity.Reject, grpc bool) *extprocv3.ProcessingResponse {
	row := wire.Lookup(r.Class)
	code := r.Code
	if code == "" {
		code = row.Code
	}
	var secs int64
	if row.Retryable {
		secs = wire.RetryAfterSeconds(r.RetryAfter)
	}
	resp := immediate(row.HTTPStatus, code, r.Message, secs)
	if grpc {
		withGRPCStatus(resp, row, secs)
	}
	return resp
}

func internalErrorResponse(grpc bool) *extprocv3.ProcessingResponse {
	row := wire.Lookup(0)
	resp := immediate(row.HTTPStatus, row.Code, "tether could not decide where this request goes", 0)
	if grpc {
		withGRPCStatus(resp, row, 0)
	}
	return resp
}

// expiredResponse is the reset of an exchange that outlived its limit: 504 (DEADLINE_EXCEEDED
// for gRPC), code ExchangeLifetimeExceeded. Sent after the response started, Envoy resets the
// downstream stream instead.
func expiredResponse(grpc bool) *extprocv3.ProcessingResponse {
	resp := immediate(504, "ExchangeLifetimeExceeded", "the exchange outlived its limit (extProc.maxRequestLifetime, or the service's maxLifetime for a stream)", 0)
	if grpc {
		withGRPCStatus(resp, wire.Rejection{GRPCCode: codes.DeadlineExceeded}, 0)
	}
	return resp
}

// withGRPCStatus adds the row's gRPC code as grpc_status and, when retrySecs > 0,
// grpc-retry-pushback-ms.
func withGRPCStatus(resp *extprocv3.ProcessingResponse, row wire.Rejection, retrySecs int64) {
	imm := resp.GetImmediateResponse()
	imm.GrpcStatus = &extprocv3.GrpcStatus{Status: uint32(row.GRPCCode)}
	if retrySecs > 0 {
		imm.Headers.SetHeaders = append(imm.Headers.SetHeaders,
			overwriteHeader(GRPCRetryPushbackHeader, strconv.FormatInt(retrySecs*1000, 10)))
	}
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
	body, _ := json.Marshal(ErrorBody{ErrorCode: code, ErrorMessage: msg}) // cannot fail: two strings
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
