package extproc

import (
	"encoding/json"
	"strconv"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"

	"github.com/tether-dev/tether/pkg/affinity"
	"github.com/tether-dev/tether/pkg/wire"
)

// StatusFor returns the HTTP status tether answers for a rejection class (wire.Lookup: 400,
// 404, 409, 429, 503, 404 for no service; 500 for an unknown class).
func StatusFor(c affinity.Class) int { return wire.Lookup(c).HTTPStatus }

// ErrorBody is the JSON body of every rejection tether sends.
type ErrorBody struct {
	ErrorCode    string `json:"errorCode"`
	ErrorMessage string `json:"errorMessage"`
}

// rejectResponse turns a rejection into an ImmediateResponse: the class's status, a JSON
// body, content-type application/json, retry-after (wire.RetryAfterSeconds) for retryable
// classes, and details "tether_<code>" for Envoy's %RESPONSE_CODE_DETAILS%.
func rejectResponse(r *affinity.Reject) *extprocv3.ProcessingResponse {
	row := wire.Lookup(r.Class)
	code := r.Code
	if code == "" {
		code = row.Code
	}
	var retry string
	if row.Retryable {
		retry = strconv.FormatInt(wire.RetryAfterSeconds(r.RetryAfter), 10)
	}
	return immediate(row.HTTPStatus, code, r.Message, retry)
}

func internalErrorResponse() *extprocv3.ProcessingResponse {
	return immediate(500, "InternalServerError", "tether could not decide where this request goes", "")
}

func immediate(st int, code, msg, retryAfter string) *extprocv3.ProcessingResponse {
	body, _ := json.Marshal(ErrorBody{ErrorCode: code, ErrorMessage: msg}) // cannot fail: two strings
	set := []*corev3.HeaderValueOption{overwriteHeader("content-type", "application/json")}
	if retryAfter != "" {
		set = append(set, overwriteHeader(wire.RetryAfterHeader, retryAfter))
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
