package api

import (
	"context"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"

	"github.com/tether-dev/tether/pkg/affinity"
	tetherv1 "github.com/tether-dev/tether/pkg/api/gen/tether/v1"
	"github.com/tether-dev/tether/pkg/calls"
	"github.com/tether-dev/tether/pkg/config"
	"github.com/tether-dev/tether/pkg/registry"
	"github.com/tether-dev/tether/pkg/session"
	tstatus "github.com/tether-dev/tether/pkg/status"
)

// Timeouts the API's http.Server should have (tether serve sets them): ReadTimeout bounds
// reading a whole request, body included; WriteTimeout bounds a call from the end of its
// headers to the end of its answer. The handlers that outlive it set their own deadlines: the
// status stream before every event, a drain for its wait; gRPC calls have none (their deadline
// is the caller's, and the HTTP/2 connection is bounded by the listener's cap).
const (
	ReadTimeout  = 30 * time.Second
	WriteTimeout = 60 * time.Second
)

// Engine is what the API needs from the affinity engine; *affinity.Engine implements it.
// Implementations must be safe for concurrent use.
type Engine interface {
	CreateSession(ctx context.Context, service string, o affinity.CreateOptions) (session.Session, error)
	GetSession(ctx context.Context, service, id string) (session.Session, error)
	UpdateSession(ctx context.Context, service, id string, o affinity.UpdateOptions) (session.Session, error)
	ListSessions(ctx context.Context, f session.Filter, pageToken string, limit int) ([]session.Session, string, error)
	DeleteSession(ctx context.Context, service, id string) error
	Usage(service string) ([]affinity.InstanceUsage, error)
	WaitDrained(ctx context.Context, k registry.Key) error
	DesiredInstances(service string) int
}

var _ Engine = (*affinity.Engine)(nil)

// ReadyCheck is one readiness condition for /readyz. It returns nil when the condition holds.
// Checks are called concurrently from request goroutines and must be safe for concurrent use.
type ReadyCheck func(ctx context.Context) error

// Option configures a Server.
type Option func(*Server)

// WithLogger sets the logger; the default discards.
func WithLogger(l *slog.Logger) Option { return func(s *Server) { s.log = l } }

// WithReadyCheck adds a named readiness condition: /readyz answers 503 naming the first failing
// check. Checks run in the order they were added.
func WithReadyCheck(name string, check ReadyCheck) Option {
	return func(s *Server) { s.ready = append(s.ready, namedCheck{name: name, check: check}) }
}

// WithStoreTimeout bounds each session-store call a SessionAPI call makes (default
// config.DefaultAPIStoreTimeout; tether serve passes api.storeTimeout; d ≤ 0 keeps the default).
// It replaces the store's own bound, which is the request path's (session.WithCallTimeout).
func WithStoreTimeout(d time.Duration) Option {
	return func(s *Server) {
		if d > 0 {
			s.storeTimeout = d
		}
	}
}

// WithEngine serves the SessionAPI over e and adds slot usage to instance listings and
// drain-and-wait. Without an engine, SessionService calls answer UNAVAILABLE and instances are
// listed without usage.
func WithEngine(e Engine) Option { return func(s *Server) { s.engine = e } }

// WithCalls adds each instance's SIP call load (calls.Tracker.Loads) to instance listings, as
// the status snapshot has it.
func WithCalls(loads func(service string) []calls.Load) Option {
	return func(s *Server) { s.calls = loads }
}

// WithAuth sets the bearer tokens (config's auth section). With no tokens every caller may do
// everything; CheckListenerSecurity decides whether that is acceptable for a listener. Token
// values are copied; the Config is not retained.
func WithAuth(a config.Auth) Option { return func(s *Server) { s.SetAuth(a) } }

// SetAuth replaces the bearer tokens and client identities (a config reload): every request
// and call that starts after SetAuth returns is checked against the new ones only, so a
// removed token stops working at once, and open status streams re-authenticate at once and
// end if their credential is gone (or no longer reaches every service). Other calls already
// past authentication finish. Safe for concurrent use.
func (s *Server) SetAuth(a config.Auth) {
	if old := s.auth.Swap(newAuthenticator(a)); old != nil {
		close(old.replaced) // open status streams re-authenticate against the new one
	}
}

// authn returns the tokens in force.
func (s *Server) authn() *authenticator { return s.auth.Load() }

type namedCheck struct {
	name  string
	check ReadyCheck
}

// Server holds the API's dependencies and builds its http.Handler. A Server is safe for
// concurrent use; it holds no per-request state.
type Server struct {
	reg    *registry.Registry
	engine Engine
	// storeTimeout bounds each store call of a SessionAPI call (WithStoreTimeout).
	storeTimeout time.Duration
	auth         atomic.Pointer[authenticator]
	log          *slog.Logger
	ready        []namedCheck
	// operator holds the endpoints mounted with WithOperatorHandler.
	operator []operatorHandler
	// status, statusInterval and statusStreams serve the operator snapshot (WithStatus).
	status         func() *tetherv1.Status
	statusInterval time.Duration
	statusStreams  chan struct{}
	statusHistory  *tstatus.History
	// streamsMu guards streamsByCaller: status streams held per caller name.
	streamsMu       sync.Mutex
	streamsByCaller map[string]int
	// ui serves the dashboard's assets (WithUI).
	ui http.Handler
	// calls are the SIP call loads (WithCalls), or nil.
	calls func(service string) []calls.Load
	// hosts and origins are the browser guard's names beside the built-in ones (WithHosts,
	// WithOrigins; lower case).
	hosts, origins []string
}

// NewServer returns a Server over reg. reg must not be nil.
func NewServer(reg *registry.Registry, opts ...Option) *Server {
	s := &Server{reg: reg, log: slog.New(slog.DiscardHandler), storeTimeout: config.DefaultAPIStoreTimeout}
	s.SetAuth(config.Auth{})
	for _, o := range opts {
		o(s)
	}
	return s
}

// NewAdminHandler is shorthand for NewServer(reg, opts...).Handler().
func NewAdminHandler(reg *registry.Registry, opts ...Option) http.Handler {
	return NewServer(reg, opts...).Handler()
}

// Handler returns one http.Handler serving everything on one listener: gRPC (HTTP/2 requests
// whose content type is application/grpc, dispatched to the tether.v1 services) and HTTP/JSON
// (the admin endpoints and the /v1 resource paths). For gRPC clients without TLS the
// http.Server must accept unencrypted HTTP/2: see EnableH2C. Each call builds a new handler
// with its own gRPC server.
func (s *Server) Handler() http.Handler {
	gs := s.GRPCServer()
	mux := http.NewServeMux()
	s.registerAdmin(mux)
	s.registerSessions(mux)
	s.registerInstances(mux)
	s.registerOperator(mux)
	s.registerStatus(mux)
	s.registerRing(mux)
	s.registerUI(mux)
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		writeError(w, codes.NotFound, "", "no such endpoint: "+r.Method+" "+r.URL.Path)
	})
	rest := s.authHTTP(s.guardBrowser(mux))
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.ProtoMajor == 2 && strings.HasPrefix(r.Header.Get("Content-Type"), "application/grpc") {
			_ = http.NewResponseController(w).SetWriteDeadline(time.Time{}) // see WriteTimeout
			gs.ServeHTTP(w, r)
			return
		}
		rest.ServeHTTP(w, r)
	})
}

// GRPCServer returns a new gRPC server with the tether.v1 services registered and auth
// enforced, for callers that want a listener of its own. Handler uses one internally.
func (s *Server) GRPCServer() *grpc.Server {
	gs := grpc.NewServer(grpc.ChainUnaryInterceptor(codeUnary, s.authUnary))
	tetherv1.RegisterSessionServiceServer(gs, sessionService{s: s})
	tetherv1.RegisterInstanceServiceServer(gs, instanceService{s: s})
	tetherv1.RegisterStatusServiceServer(gs, statusService{s: s})
	return gs
}

// EnableH2C configures srv to accept unencrypted HTTP/2 (prior knowledge, as gRPC clients with
// insecure credentials speak it) beside HTTP/1.1, so Handler can serve gRPC and HTTP/JSON on
// one plain-text listener. It keeps any protocols srv already enables.
func EnableH2C(srv *http.Server) {
	p := new(http.Protocols)
	if srv.Protocols != nil {
		*p = *srv.Protocols
	} else {
		p.SetHTTP2(true) // net/http's default set: HTTP/1 and HTTP/2 over TLS
	}
	p.SetHTTP1(true)
	p.SetUnencryptedHTTP2(true)
	srv.Protocols = p
}
