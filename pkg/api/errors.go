package api

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"strconv"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/tether-dev/tether/pkg/affinity"
	"github.com/tether-dev/tether/pkg/fleet"
	"github.com/tether-dev/tether/pkg/registry"
	"github.com/tether-dev/tether/pkg/session"
	"github.com/tether-dev/tether/pkg/wire"
)

// rejected is a gRPC status error of an engine rejection; a retryable one also carries its
// retry hint in whole seconds (Retry-After on HTTP, a google.rpc.RetryInfo detail on gRPC).
type rejected struct {
	st        *status.Status
	retrySecs int64 // 0: not retryable
}

func (r *rejected) Error() string              { return r.st.Err().Error() }
func (r *rejected) GRPCStatus() *status.Status { return r.st }

// toStatus maps an engine, store or registry error to a gRPC status error. This is the only
// place where domain errors become codes:
//
//	unknown service (ClassNoService)                     → NotFound
//	unknown instance, session not found (ClassNotFound)  → NotFound
//	invalid argument, invalid session, bad page token    → InvalidArgument (ClassBadRequest)
//	unsupported affinity mode, session expired or ended  → FailedPrecondition
//	session / instance exists (ClassConflict)            → AlreadyExists
//	*affinity.Reject                                     → its class's code (wire.Lookup):
//	                                                       no capacity → Unavailable, request
//	                                                       slots full → ResourceExhausted,
//	                                                       both with RetryInfo
//	shared registry unreachable (registry.ErrUnavailable) → Unavailable
//	shared registry full (fleet.ErrFull)                 → ResourceExhausted
//	context deadline / cancellation                      → DeadlineExceeded / Canceled
//	anything else                                        → Internal (logged, message hidden)
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
		row := wire.Lookup(rej.Class)
		r := &rejected{st: status.New(row.GRPCCode, rej.Message)}
		if row.Retryable {
			r.retrySecs = wire.RetryAfterSeconds(rej.RetryAfter)
			if st, err := r.st.WithDetails(&errdetails.RetryInfo{RetryDelay: durationpb.New(time.Duration(r.retrySecs) * time.Second)}); err == nil {
				r.st = st
			}
		}
		return r
	}
	var c codes.Code
	switch {
	case errors.Is(err, affinity.ErrUnknownService), errors.Is(err, registry.ErrUnknownService):
		c = wire.Lookup(wire.ClassNoService).GRPCCode
	case errors.Is(err, registry.ErrUnknownInstance), errors.Is(err, session.ErrNotFound):
		c = wire.Lookup(wire.ClassNotFound).GRPCCode
	case errors.Is(err, affinity.ErrInvalidArgument), errors.Is(err, session.ErrInvalid),
		errors.Is(err, session.ErrInvalidPageToken), errors.Is(err, registry.ErrInvalid):
		c = wire.Lookup(wire.ClassBadRequest).GRPCCode
	case errors.Is(err, affinity.ErrUnsupported), errors.Is(err, session.ErrExpired), errors.Is(err, session.ErrEnded):
		c = codes.FailedPrecondition
	case errors.Is(err, session.ErrExists), errors.Is(err, registry.ErrExists):
		c = wire.Lookup(wire.ClassConflict).GRPCCode
	case errors.Is(err, registry.ErrUnavailable):
		c = codes.Unavailable
	case errors.Is(err, fleet.ErrFull):
		c = codes.ResourceExhausted
	case errors.Is(err, context.DeadlineExceeded):
		c = codes.DeadlineExceeded
	case errors.Is(err, context.Canceled):
		c = codes.Canceled
	default:
		s.log.LogAttrs(ctx, slog.LevelError, "api: internal error", slog.Any("err", err))
		return status.Error(codes.Internal, "internal error")
	}
	return status.Error(c, err.Error())
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

// writeStatus writes err (a gRPC status error) as the HTTP error model
// {"errorCode": "<gRPC code name>", "errorMessage": "..."}, with Retry-After when the error
// carries a retry hint.
func writeStatus(w http.ResponseWriter, err error) {
	var rej *rejected
	if errors.As(err, &rej) && rej.retrySecs > 0 {
		w.Header().Set("Retry-After", strconv.FormatInt(rej.retrySecs, 10))
	}
	st := status.Convert(err)
	writeError(w, httpStatus(st.Code()), st.Code().String(), st.Message())
}
