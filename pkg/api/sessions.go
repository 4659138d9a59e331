package api

import (
	"context"
	"log/slog"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/tether-dev/tether/pkg/affinity"
	tetherv1 "github.com/tether-dev/tether/pkg/api/gen/tether/v1"
	"github.com/tether-dev/tether/pkg/session"
)

// sessionService implements tetherv1.SessionServiceServer over the Server's engine. The HTTP
// handlers call the same methods, so both transports share validation, auth and error mapping.
type sessionService struct {
	tetherv1.UnimplementedSessionServiceServer
	s *Server
}

var _ tetherv1.SessionServiceServer = sessionService{}

// begin runs the checks every call starts with: a service name, the caller's access to it,
// and an engine to serve it. It returns ctx with the SessionAPI's own store bound
// (WithStoreTimeout), which the call's store calls run under instead of the request path's.
func (x sessionService) begin(ctx context.Context, service string, a access) (context.Context, error) {
	if err := x.s.authorizeService(ctx, service, a); err != nil {
		return ctx, err
	}
	if x.s.engine == nil {
		return ctx, status.Error(codes.Unavailable, "the SessionAPI is not enabled on this server")
	}
	return session.WithCallTimeout(ctx, x.s.storeTimeout), nil
}

// beginSession is begin for a call on one session: its id must be valid as well.
func (x sessionService) beginSession(ctx context.Context, service, id string, a access) (context.Context, error) {
	ctx, err := x.begin(ctx, service, a)
	if err != nil {
		return ctx, err
	}
	return ctx, checkID(id)
}

func checkID(id string) error {
	if id == "" {
		return status.Error(codes.InvalidArgument, "session id is required")
	}
	if !session.ValidID(id) {
		return status.Errorf(codes.InvalidArgument, "session id %q is malformed: want 1-64 characters, first a letter, digit or '_', then letters, digits, '_' or '-'", id)
	}
	return nil
}

// duration converts an optional proto duration; unset is nil.
func duration(field string, d *durationpb.Duration) (*time.Duration, error) {
	if d == nil {
		return nil, nil
	}
	if err := d.CheckValid(); err != nil {
		return nil, status.Errorf(codes.InvalidArgument, "%s: %v", field, err)
	}
	v := d.AsDuration()
	if v < 0 {
		return nil, status.Errorf(codes.InvalidArgument, "%s: %v is negative", field, v)
	}
	return &v, nil
}

// CreateSession implements tetherv1.SessionServiceServer.
func (x sessionService) CreateSession(ctx context.Context, req *tetherv1.CreateSessionRequest) (*tetherv1.CreateSessionResponse, error) {
	ctx, err := x.begin(ctx, req.GetService(), accessWrite)
	if err != nil {
		return nil, err
	}
	if id := req.GetSessionId(); id != "" {
		if err := checkID(id); err != nil {
			return nil, err
		}
	}
	if _, ok := req.GetAttributes()[affinity.ProvisionalAttribute]; ok {
		// Reserved: it marks sessions the data plane created for a client not yet back (their
		// short idle timeout and per-client limits); a SessionAPI session is never one.
		return nil, status.Errorf(codes.InvalidArgument, "attribute %q is reserved for tether", affinity.ProvisionalAttribute)
	}
	o := affinity.CreateOptions{ID: req.GetSessionId(), Attributes: req.GetAttributes()}
	ttl, err := duration("ttl", req.GetTtl())
	if err != nil {
		return nil, err
	}
	if ttl != nil {
		o.TTL = *ttl
	}
	idle, err := duration("idle_timeout", req.GetIdleTimeout())
	if err != nil {
		return nil, err
	}
	if idle != nil {
		o.IdleTimeout = *idle
	}
	if req.DisableSessionIdReuse != nil {
		v := req.GetDisableSessionIdReuse()
		o.DisableReuse = &v
	}
	sess, err := x.s.engine.CreateSession(ctx, req.GetService(), o)
	if err != nil {
		return nil, x.s.toStatus(ctx, err)
	}
	x.s.log.LogAttrs(ctx, slog.LevelInfo, "api: session created", principalAttr(ctx),
		slog.String("service", sess.Service), slog.String("session", sess.ID), slog.String("instance", sess.Instance))
	return &tetherv1.CreateSessionResponse{Session: sessionToProto(sess)}, nil
}

// GetSession implements tetherv1.SessionServiceServer.
func (x sessionService) GetSession(ctx context.Context, req *tetherv1.GetSessionRequest) (*tetherv1.GetSessionResponse, error) {
	ctx, err := x.beginSession(ctx, req.GetService(), req.GetSessionId(), accessRead)
	if err != nil {
		return nil, err
	}
	sess, err := x.s.engine.GetSession(ctx, req.GetService(), req.GetSessionId())
	if err != nil {
		return nil, x.s.toStatus(ctx, err)
	}
	return &tetherv1.GetSessionResponse{Session: sessionToProto(sess)}, nil
}

// UpdateSession implements tetherv1.SessionServiceServer.
func (x sessionService) UpdateSession(ctx context.Context, req *tetherv1.UpdateSessionRequest) (*tetherv1.UpdateSessionResponse, error) {
	ctx, err := x.beginSession(ctx, req.GetService(), req.GetSessionId(), accessWrite)
	if err != nil {
		return nil, err
	}
	var o affinity.UpdateOptions
	if o.TTL, err = duration("ttl", req.GetTtl()); err != nil {
		return nil, err
	}
	if o.IdleTimeout, err = duration("idle_timeout", req.GetIdleTimeout()); err != nil {
		return nil, err
	}
	if req.DisableSessionIdReuse != nil {
		v := req.GetDisableSessionIdReuse()
		o.DisableReuse = &v
	}
	sess, err := x.s.engine.UpdateSession(ctx, req.GetService(), req.GetSessionId(), o)
	if err != nil {
		return nil, x.s.toStatus(ctx, err)
	}
	return &tetherv1.UpdateSessionResponse{Session: sessionToProto(sess)}, nil
}

// ListSessions implements tetherv1.SessionServiceServer.
func (x sessionService) ListSessions(ctx context.Context, req *tetherv1.ListSessionsRequest) (*tetherv1.ListSessionsResponse, error) {
	ctx, err := x.begin(ctx, req.GetService(), accessRead)
	if err != nil {
		return nil, err
	}
	if req.GetPageSize() < 0 {
		return nil, status.Errorf(codes.InvalidArgument, "page_size %d is negative", req.GetPageSize())
	}
	st, ok := statusFromProto(req.GetStatus())
	if !ok {
		return nil, status.Errorf(codes.InvalidArgument, "status %v is not a session status", req.GetStatus())
	}
	if id := req.GetSessionId(); id != "" {
		if err := checkID(id); err != nil {
			return nil, err
		}
	}
	f := session.Filter{Service: req.GetService(), Instance: req.GetInstance(), ID: req.GetSessionId(), Status: st}
	list, next, err := x.s.engine.ListSessions(ctx, f, req.GetPageToken(), int(req.GetPageSize()))
	if err != nil {
		return nil, x.s.toStatus(ctx, err)
	}
	out := &tetherv1.ListSessionsResponse{Sessions: make([]*tetherv1.Session, len(list)), NextPageToken: next}
	for i, sess := range list {
		out.Sessions[i] = sessionToProto(sess)
	}
	return out, nil
}

// DeleteSession implements tetherv1.SessionServiceServer.
func (x sessionService) DeleteSession(ctx context.Context, req *tetherv1.DeleteSessionRequest) (*tetherv1.DeleteSessionResponse, error) {
	ctx, err := x.beginSession(ctx, req.GetService(), req.GetSessionId(), accessWrite)
	if err != nil {
		return nil, err
	}
	if err := x.s.engine.DeleteSession(ctx, req.GetService(), req.GetSessionId()); err != nil {
		return nil, x.s.toStatus(ctx, err)
	}
	x.s.log.LogAttrs(ctx, slog.LevelInfo, "api: session deleted", principalAttr(ctx),
		slog.String("service", req.GetService()), slog.String("session", req.GetSessionId()))
	return &tetherv1.DeleteSessionResponse{}, nil
}
