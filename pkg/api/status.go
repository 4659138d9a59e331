package api

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	tetherv1 "github.com/tether-dev/tether/pkg/api/gen/tether/v1"
)

// MaxStatusStreams bounds the concurrent /v1/status/stream (SSE) clients; more are answered 503.
const MaxStatusStreams = 64

// DefaultStatusInterval is how often /v1/status/stream pushes a snapshot.
const DefaultStatusInterval = time.Second

// WithStatus serves the operator snapshot: GET /v1/status (HTTP/JSON), tether.v1.StatusService
// (gRPC) and GET /v1/status/stream (server-sent events: one "status" event with the snapshot
// as JSON at once and then every interval, 0 for DefaultStatusInterval). snapshot must be safe
// for concurrent use and return a new message on each call. With auth configured every one
// needs a token that may read every service ("*"), since the snapshot describes them all.
func WithStatus(snapshot func() *tetherv1.Status, interval time.Duration) Option {
	if interval <= 0 {
		interval = DefaultStatusInterval
	}
	return func(s *Server) {
		s.status = snapshot
		s.statusInterval = interval
		s.statusStreams = make(chan struct{}, MaxStatusStreams)
	}
}

func (s *Server) registerStatus(mux *http.ServeMux) {
	if s.status == nil {
		return
	}
	mux.HandleFunc("GET /v1/status", func(w http.ResponseWriter, r *http.Request) {
		if err := s.requireAll(r.Context()); err != nil {
			writeStatus(w, err)
			return
		}
		writeProto(w, http.StatusOK, s.status())
	})
	mux.HandleFunc("GET /v1/status/stream", s.statusStream)
}

// statusStream pushes snapshots as server-sent events until the client goes away.
func (s *Server) statusStream(w http.ResponseWriter, r *http.Request) {
	if err := s.requireAll(r.Context()); err != nil {
		writeStatus(w, err)
		return
	}
	select {
	case s.statusStreams <- struct{}{}:
		defer func() { <-s.statusStreams }()
	default:
		w.Header().Set("Retry-After", "5")
		writeError(w, http.StatusServiceUnavailable, codes.Unavailable.String(),
			fmt.Sprintf("too many status streams (at most %d)", MaxStatusStreams))
		return
	}
	rc := http.NewResponseController(w)
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(http.StatusOK)
	t := time.NewTicker(s.statusInterval)
	defer t.Stop()
	for {
		b, err := jsonCompact.Marshal(s.status())
		if err != nil {
			s.log.Error("status stream: marshal", "err", err)
			return
		}
		// Each event gets WriteTimeout to go out: a reader that stops reading is cut then.
		if err := rc.SetWriteDeadline(time.Now().Add(WriteTimeout)); err != nil && !errors.Is(err, http.ErrNotSupported) {
			return
		}
		if _, err := fmt.Fprintf(w, "event: status\ndata: %s\n\n", b); err != nil {
			return
		}
		if err := rc.Flush(); err != nil {
			return
		}
		select {
		case <-r.Context().Done():
			return
		case <-t.C:
		}
	}
}

type statusService struct {
	tetherv1.UnimplementedStatusServiceServer
	s *Server
}

func (x statusService) GetStatus(ctx context.Context, _ *tetherv1.GetStatusRequest) (*tetherv1.GetStatusResponse, error) {
	if x.s.status == nil {
		return nil, status.Error(codes.Unavailable, "status is not served by this server")
	}
	if err := x.s.requireAll(ctx); err != nil {
		return nil, err
	}
	return &tetherv1.GetStatusResponse{Status: x.s.status()}, nil
}

// uiPrefix is where WithUI mounts the dashboard.
const uiPrefix = "/ui/"

// WithUI serves the dashboard's static assets at /ui/ (GET /ui redirects there). They are
// served without authentication — they hold no data; the page calls the API with the token
// its user types — and every API call the page makes is authorized as usual.
func WithUI(h http.Handler) Option { return func(s *Server) { s.ui = h } }

func (s *Server) isUIPath(p string) bool {
	return s.ui != nil && (p == "/ui" || strings.HasPrefix(p, uiPrefix))
}

func (s *Server) registerUI(mux *http.ServeMux) {
	if s.ui == nil {
		return
	}
	mux.Handle("GET "+uiPrefix, s.ui)
	mux.HandleFunc("GET /ui", func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, uiPrefix, http.StatusMovedPermanently)
	})
}
