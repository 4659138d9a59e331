package api

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"slices"
	"strconv"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/protoadapt"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/tether-dev/tether/pkg/affinity"
	"github.com/tether-dev/tether/pkg/fleet"
	"github.com/tether-dev/tether/pkg/registry"
	"github.com/tether-dev/tether/pkg/session"
	"github.com/tether-dev/tether/pkg/wire"
)

// rejected is a gRPC status error of an engine rejection: its stable code in a
// google.rpc.ErrorInfo detail (errorCode on HTTP) and, when retryable, its retry hint in whole
// seconds (Retry-After on HTTP, a google.rpc.RetryInfo detail on gRPC).
type rejected struct {
	st        *status.Status
	retrySecs int64 // 0: not retryable
}

func (r *rejected) Error() string              { return r.st.Err().Error() }
func (r *rejected) GRPCStatus() *status.Status { return r.st }

// toStatus maps an engine, store or registry error to a gRPC status error. This is the only
// place where domain errors become codes. Where the error is one of the engine's rejection
// classes, the status carries the class's stable code (the engine's own for a Reject) as the
// Reason of a google.rpc.ErrorInfo detail in wire.ErrorDomain — the code ext_proc and the SIP
// endpoint put in errorCode, which the HTTP binding puts there too:
//
//	unknown service (ClassNoService)                     → NotFound, ServiceNotFound
//	session not found (ClassNotFound)                    → NotFound, SessionNotFound
//	unknown instance                                     → NotFound
//	invalid argument, invalid session, bad page token    → InvalidArgument, InvalidArgument
//	unsupported affinity mode, session expired or ended  → FailedPrecondition
//	session / instance exists (ClassConflict)            → AlreadyExists, Conflict
//	*affinity.Reject                                     → its class's code (wire.Lookup) and
//	                                                       the engine's code: no capacity →
//	                                                       Unavailable, NoCapacity; request
//	                                                       slots full → ResourceExhausted,
//	                                                       ResourceExhausted; both with
//	                                                       RetryInfo
//	shared registry unreachable (registry.ErrUnavailable) → Unavailable
//	shared registry full (fleet.ErrFull)                 → ResourceExhausted
//	context deadline / cancellation                      → DeadlineExceeded / Canceled
//	anything else                                        → Internal, InternalServerError
//	                                                       (logged, message hidden)
//
// Errors that already carry a gRPC status pass through.
func (s *Server) toStatus(ctx context.Context, err error) error {
	if err == nil {
		return nil
	}
	if _, ok := status.FromError(err); ok {
		return err
	}
	var rej *affinity.Reject
	if errors.As(err, &rej) {
		return rejectStatus(rej)
	}
	for _, m := range errorStatuses {
		if !slices.ContainsFunc(m.errs, func(target error) bool { return errors.Is(err, target) }) {
			continue
		}
		if m.code == codes.OK {
			return classStatus(m.class, err.Error())
		}
		return status.Error(m.code, err.Error())
	}
	s.log.LogAttrs(ctx, slog.LevelError, "api: internal error", slog.Any("err", err))
	return coded(codes.Internal, wire.InternalCode, "internal error", 0).Err()
}

// errorStatuses map the engine's, registry's and store's errors to statuses, first match
// first: a rejection class's (code OK), else a bare gRPC code.
var errorStatuses = []struct {
	errs  []error
	class wire.Class
	code  codes.Code
}{
	{errs: []error{affinity.ErrUnknownService, registry.ErrUnknownService}, class: wire.ClassNoService},
	{errs: []error{session.ErrNotFound}, class: wire.ClassNotFound},
	{errs: []error{registry.ErrUnknownInstance}, code: codes.NotFound},
	{errs: []error{affinity.ErrInvalidArgument, session.ErrInvalid, session.ErrInvalidPageToken, registry.ErrInvalid}, class: wire.ClassBadRequest},
	{errs: []error{affinity.ErrUnsupported, session.ErrExpired, session.ErrEnded}, code: codes.FailedPrecondition},
	{errs: []error{session.ErrExists, registry.ErrExists}, class: wire.ClassConflict},
	{errs: []error{registry.ErrUnavailable}, code: codes.Unavailable},
	{errs: []error{fleet.ErrFull}, code: codes.ResourceExhausted},
	{errs: []error{context.DeadlineExceeded}, code: codes.DeadlineExceeded},
	{errs: []error{context.Canceled}, code: codes.Canceled},
}

// rejectStatus is an engine rejection's status: its class's gRPC code, its own code (else
// the class's) and, for a retryable class, its Retry-After.
func rejectStatus(rej *affinity.Reject) *rejected {
	row := wire.Lookup(rej.Class)
	code := rej.Code
	if code == "" {
		code = row.Code
	}
	r := &rejected{}
	if row.Retryable {
		r.retrySecs = wire.RetryAfterSeconds(rej.RetryAfter)
	}
	r.st = coded(row.GRPCCode, code, rej.Message, r.retrySecs)
	return r
}

// classStatus is the status of an error of a rejection class: the class's gRPC code and code.
func classStatus(c wire.Class, msg string) error {
	row := wire.Lookup(c)
	return coded(row.GRPCCode, row.Code, msg, 0).Err()
}

// coded returns a status carrying tether's stable code as a google.rpc.ErrorInfo (Reason code,
// Domain wire.ErrorDomain) and, when retrySecs > 0, a google.rpc.RetryInfo of that many
// seconds.
func coded(c codes.Code, code, msg string, retrySecs int64) *status.Status {
	st := status.New(c, msg)
	details := []protoadapt.MessageV1{&errdetails.ErrorInfo{Reason: code, Domain: wire.ErrorDomain}}
	if retrySecs > 0 {
		details = append(details, &errdetails.RetryInfo{RetryDelay: durationpb.New(time.Duration(retrySecs) * time.Second)})
	}
	if withDetails, err := st.WithDetails(details...); err == nil {
		return withDetails
	}
	return st
}

// codeUnary makes every error status of a unary call carry a stable code (coded), as the
// HTTP binding's errorCode does: one the handler set, else the gRPC code's name.
func codeUnary(ctx context.Context, req any, _ *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	resp, err := handler(ctx, req)
	if err == nil {
		return resp, nil
	}
	st := status.Convert(err)
	if _, ok := reasonOf(st); ok {
		return resp, err
	}
	withCode, derr := st.WithDetails(&errdetails.ErrorInfo{Reason: st.Code().String(), Domain: wire.ErrorDomain})
	if derr != nil {
		return resp, err
	}
	return resp, withCode.Err()
}

// codeOf returns the stable code a status carries (its ErrorInfo in wire.ErrorDomain), else
// the gRPC code's name.
func codeOf(st *status.Status) string {
	if reason, ok := reasonOf(st); ok {
		return reason
	}
	return st.Code().String()
}

// reasonOf returns the reason of st's ErrorInfo in wire.ErrorDomain, if it has one.
func reasonOf(st *status.Status) (string, bool) {
	for _, d := range st.Details() {
		if info, ok := d.(*errdetails.ErrorInfo); ok && info.GetDomain() == wire.ErrorDomain {
			return info.GetReason(), true
		}
	}
	return "", false
}

// httpStatus is the HTTP status of each gRPC code in the HTTP/JSON API (the google.rpc.Code
// mapping that grpc-gateway uses as well).
func httpStatus(c codes.Code) int {
	switch c {
	case codes.OK:
		return http.StatusOK
	case codes.InvalidArgument, codes.FailedPrecondition, codes.OutOfRange:
		return http.StatusBadRequest
	case codes.Unauthenticated:
		return http.StatusUnauthorized
	case codes.PermissionDenied:
		return http.StatusForbidden
	case codes.NotFound:
		return http.StatusNotFound
	case codes.AlreadyExists, codes.Aborted:
		return http.StatusConflict
	case codes.ResourceExhausted:
		return http.StatusTooManyRequests
	case codes.Canceled:
		return 499 // client closed request
	case codes.Unimplemented:
		return http.StatusNotImplemented
	case codes.Unavailable:
		return http.StatusServiceUnavailable
	case codes.DeadlineExceeded:
		return http.StatusGatewayTimeout
	default:
		return http.StatusInternalServerError
	}
}

// writeStatus writes err (a gRPC status error) as the HTTP error model wire.ErrorBody
// {"errorCode": "<stable code>", "errorMessage": "...", "status": "<gRPC code name>"}, the
// code being the status's ErrorInfo reason (else the gRPC code's name), with Retry-After when
// the error carries a retry hint.
func writeStatus(w http.ResponseWriter, err error) {
	var rej *rejected
	if errors.As(err, &rej) && rej.retrySecs > 0 {
		w.Header().Set("Retry-After", strconv.FormatInt(rej.retrySecs, 10))
	}
	st := status.Convert(err)
	writeError(w, st.Code(), codeOf(st), st.Message())
}
