package extproc

import (
	"encoding/json"
	"math"
	"strconv"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"

	"github.com/tether-dev/tether/pkg/affinity"
)

// StatusFor returns the HTTP status tether answers for a rejection class: 400, 404, 409, 429,
// 503, 404 (no service); 500 for an unknown class.
func StatusFor(c affinity.Class) int {
	switch c {
	case affinity.ClassBadRequest:
		return 400
	case affinity.ClassNotFound, affinity.ClassNoService:
		return 404
	case affinity.ClassConflict:
		return 409
	case affinity.ClassTooManyRequests:
		return 429
	case affinity.ClassNoCapacity:
		return 503
	default:
		return 500
	}
}

// defaultCode names a class when the engine gave no code.
func defaultCode(c affinity.Class) string {
	switch c {
	case affinity.ClassBadRequest:
		return "InvalidArgument"
	case affinity.ClassNotFound:
		return "SessionNotFound"
	case affinity.ClassConflict:
		return "Conflict"
	case affinity.ClassTooManyRequests:
		return "ResourceExhausted"
	case affinity.ClassNoCapacity:
		return "ResourceThrottled"
	case affinity.ClassNoService:
		return "ServiceNotFound"
	default:
		return "InternalServerError"
	}
}

// ErrorBody is the JSON body of every rejection tether sends.
type ErrorBody struct {
	ErrorCode    string `json:"errorCode"`
	ErrorMessage string `json:"errorMessage"`
}

// rejectResponse turns a rejection into an ImmediateResponse: the class's status, a JSON
// body, content-type application/json, retry-after (whole seconds, at least 1) for 429 and
// 503, and details "tether_<code>" for Envoy's %RESPONSE_CODE_DETAILS%.
func rejectResponse(r *affinity.Reject) *extprocv3.ProcessingResponse {
	code := r.Code
	if code == "" {
		code = defaultCode(r.Class)
	}
	st := StatusFor(r.Class)
	var retry string
	if st == 429 || st == 503 {
		secs := int64(math.Ceil(r.RetryAfter.Seconds()))
		if secs < 1 {
			secs = 1
		}
		retry = strconv.FormatInt(secs, 10)
	}
	return immediate(st, code, r.Message, retry)
}

func internalErrorResponse() *extprocv3.ProcessingResponse {
	return immediate(500, "InternalServerError", "tether could not decide where this request goes", "")
}

func immediate(st int, code, msg, retryAfter string) *extprocv3.ProcessingResponse {
	body, _ := json.Marshal(ErrorBody{ErrorCode: code, ErrorMessage: msg}) // cannot fail: two strings
	set := []*corev3.HeaderValueOption{overwriteHeader("content-type", "application/json")}
	if retryAfter != "" {
		set = append(set, overwriteHeader("retry-after", retryAfter))
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
