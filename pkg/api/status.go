package api

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	tetherv1 "github.com/tether-dev/tether/pkg/api/gen/tether/v1"
	tstatus "github.com/tether-dev/tether/pkg/status"
)

// MaxStatusStreams bounds the concurrent /v1/status/stream (SSE) clients; more are answered 503.
// With auth on, one caller (token or client identity) may hold MaxStatusStreamsPerCaller of
// them, so one token cannot take them all.
const (
	MaxStatusStreams          = 64
	MaxStatusStreamsPerCaller = 8
)

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
		s.streamsByCaller = map[string]int{}
	}
}

// WithStatusHistory makes every /v1/status/stream begin with one "history" event before the
// first snapshot: h's samples as JSON, {"stepSeconds": n, "samples": [{"time", "decisions":
// {service: {outcome: count}}}]}, so that a page opened now charts the last window at once.
func WithStatusHistory(h *tstatus.History) Option { return func(s *Server) { s.statusHistory = h } }

// historyEvent is the "history" event's data.
type historyEvent struct {
	StepSeconds float64          `json:"stepSeconds"`
	Samples     []tstatus.Sample `json:"samples"`
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
	p := principalOf(r.Context())
	release, msg := s.takeStatusStream(p)
	if msg != "" {
		w.Header().Set("Retry-After", "5")
		writeError(w, codes.Unavailable, "", msg)
		return
	}
	defer release()
	auth := s.authn()
	rc := http.NewResponseController(w)
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(http.StatusOK)
	if s.writeHistory(rc, w) != nil {
		return
	}
	t := time.NewTicker(s.statusInterval)
	defer t.Stop()
	for {
		b, err := jsonCompact.Marshal(s.status())
		if err != nil {
			s.log.Error("status stream: marshal", "err", err)
			return
		}
		if writeEvent(rc, w, "status", b) != nil || rc.Flush() != nil {
			return
		}
		select {
		case <-r.Context().Done():
			return
		case <-auth.replaced:
			// A reload replaced the credentials: the stream goes on only if its own still
			// authenticate and reach every service.
			auth = s.authn()
			if p, err = reauthenticate(auth, r, p); err != nil {
				s.log.Info("status stream ended: its credential was revoked", "token", nameOf(p), "err", err)
				return
			}
		case now := <-t.C:
			if p != nil && p.expired(now) {
				s.log.Info("status stream ended: its credential expired", "token", p.name)
				return
			}
		}
	}
}

// writeHistory writes the status history as the stream's first event, if the server keeps
// one.
func (s *Server) writeHistory(rc *http.ResponseController, w http.ResponseWriter) error {
	h := s.statusHistory
	if h == nil {
		return nil
	}
	b, err := json.Marshal(historyEvent{StepSeconds: h.Step().Seconds(), Samples: h.Samples()})
	if err != nil {
		s.log.Error("status stream: marshal history", "err", err)
		return err
	}
	return writeEvent(rc, w, "history", b)
}

// writeEvent writes one server-sent event. Each event gets WriteTimeout to go out: a reader
// that stops reading is cut then.
func writeEvent(rc *http.ResponseController, w http.ResponseWriter, event string, data []byte) error {
	if err := rc.SetWriteDeadline(time.Now().Add(WriteTimeout)); err != nil && !errors.Is(err, http.ErrNotSupported) {
		return err
	}
	_, err := fmt.Fprintf(w, "event: %s\ndata: %s\n\n", event, data)
	return err
}

// reauthenticate authenticates r's credentials again with auth, which must still reach every
// service; on an error it returns prev, the principal they were (for the log).
func reauthenticate(auth *authenticator, r *http.Request, prev *principal) (*principal, error) {
	np, err := auth.authenticate(httpCredentials(r), time.Now())
	if err == nil && auth.enabled() && !np.all {
		err = errors.New("no longer scoped to every service")
	}
	if err != nil {
		return prev, err
	}
	return np, nil
}

// takeStatusStream takes a status-stream slot for caller p (nil with auth off): one of
// MaxStatusStreams, and with auth on one of the caller's MaxStatusStreamsPerCaller. It returns
// the release, or why none is free.
func (s *Server) takeStatusStream(p *principal) (release func(), refused string) {
	select {
	case s.statusStreams <- struct{}{}:
	default:
		return nil, fmt.Sprintf("too many status streams (at most %d)", MaxStatusStreams)
	}
	if p == nil {
		return func() { <-s.statusStreams }, ""
	}
	s.streamsMu.Lock()
	defer s.streamsMu.Unlock()
	if s.streamsByCaller[p.name] >= MaxStatusStreamsPerCaller {
		<-s.statusStreams
		return nil, fmt.Sprintf("%q holds %d status streams, the most one caller may", p.name, MaxStatusStreamsPerCaller)
	}
	s.streamsByCaller[p.name]++
	return func() {
		s.streamsMu.Lock()
		if s.streamsByCaller[p.name]--; s.streamsByCaller[p.name] == 0 {
			delete(s.streamsByCaller, p.name)
		}
		s.streamsMu.Unlock()
		<-s.statusStreams
	}, ""
}

func nameOf(p *principal) string {
	if p == nil {
		return ""
	}
	return p.name
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
