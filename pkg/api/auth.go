package api

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"slices"
	"strings"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/tether-dev/tether/pkg/config"
)

// ErrInsecureListener is returned by CheckListenerSecurity for a listener that would expose
// the API without authentication.
var ErrInsecureListener = errors.New("insecure api listener")

// CheckListenerSecurity refuses (ErrInsecureListener) an API listener address that is not
// loopback when auth has no tokens, unless auth.AllowInsecure is set, in which case it logs a
// warning on log (nil discards) and returns nil. Loopback means "localhost" or a loopback IP
// literal; an empty host (":9000"), an unspecified address or any other host name counts as
// exposed. A malformed address is an error too.
func CheckListenerSecurity(addr string, auth config.Auth, log *slog.Logger) error {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("api listener %q: %w", addr, err)
	}
	if isLoopback(host) || len(auth.Tokens) > 0 {
		return nil
	}
	if auth.AllowInsecure {
		if log != nil {
			log.Warn("the API listener is not loopback and has no auth tokens: anyone who can reach it may read and change sessions and instances (auth.allowInsecure is set)", "addr", addr)
		}
		return nil
	}
	return fmt.Errorf("api listener %q is not loopback and auth has no tokens; configure auth.tokens or set auth.allowInsecure: %w", addr, ErrInsecureListener)
}

func isLoopback(host string) bool {
	if strings.EqualFold(host, "localhost") {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// Access levels a call needs.
type access int

const (
	accessRead access = iota + 1
	accessWrite
)

// principal is an authenticated token: its name and what it may touch.
type principal struct {
	name     string
	all      bool     // services contains "*"
	services []string // sorted
	write    bool
}

func (p *principal) may(service string, a access) bool {
	if a == accessWrite && !p.write {
		return false
	}
	if p.all {
		return true
	}
	_, ok := slices.BinarySearch(p.services, service)
	return ok
}

type tokenEntry struct {
	digest [sha256.Size]byte
	p      *principal
}

// authenticator checks bearer tokens. Tokens are kept as SHA-256 digests and compared in
// constant time against every configured token, so neither the match position nor the
// token length leaks through timing. A nil or empty authenticator accepts everyone.
type authenticator struct {
	tokens []tokenEntry
}

func newAuthenticator(a config.Auth) *authenticator {
	out := &authenticator{}
	for _, t := range a.Tokens {
		p := &principal{name: t.Name, write: t.Access == config.AccessWrite}
		for _, svc := range t.Services {
			if svc == "*" {
				p.all = true
			} else {
				p.services = append(p.services, svc)
			}
		}
		slices.Sort(p.services)
		out.tokens = append(out.tokens, tokenEntry{digest: sha256.Sum256([]byte(t.Token)), p: p})
	}
	return out
}

func (a *authenticator) enabled() bool { return a != nil && len(a.tokens) > 0 }

// authenticate resolves an Authorization value ("Bearer <token>"). With auth disabled it
// returns nil, nil.
func (a *authenticator) authenticate(authorization string) (*principal, error) {
	if !a.enabled() {
		return nil, nil
	}
	scheme, tok, ok := strings.Cut(strings.TrimSpace(authorization), " ")
	if authorization == "" {
		return nil, status.Error(codes.Unauthenticated, "missing bearer token (Authorization: Bearer <token>)")
	}
	if !ok || !strings.EqualFold(scheme, "bearer") || strings.TrimSpace(tok) == "" {
		return nil, status.Error(codes.Unauthenticated, "malformed authorization: want \"Bearer <token>\"")
	}
	d := sha256.Sum256([]byte(strings.TrimSpace(tok)))
	var found *principal
	for _, e := range a.tokens {
		if subtle.ConstantTimeCompare(d[:], e.digest[:]) == 1 && found == nil {
			found = e.p
		}
	}
	if found == nil {
		return nil, status.Error(codes.Unauthenticated, "unknown bearer token")
	}
	return found, nil
}

type principalKey struct{}

// principalOf returns the authenticated caller in ctx, or nil (auth off, or an endpoint that
// needs none).
func principalOf(ctx context.Context) *principal {
	p, _ := ctx.Value(principalKey{}).(*principal)
	return p
}

// caller is the one check every call's authorization starts with: with auth off it returns
// nil, nil (everyone may do everything); otherwise the authenticated caller, or Unauthenticated.
func (s *Server) caller(ctx context.Context) (*principal, error) {
	if !s.authn().enabled() {
		return nil, nil
	}
	p := principalOf(ctx)
	if p == nil {
		return nil, status.Error(codes.Unauthenticated, "missing bearer token")
	}
	return p, nil
}

// authorize checks that the caller in ctx may access service at level a. It returns a gRPC
// status error (Unauthenticated, PermissionDenied) or nil.
func (s *Server) authorize(ctx context.Context, service string, a access) error {
	p, err := s.caller(ctx)
	if p == nil {
		return err
	}
	if !p.may(service, a) {
		verb := "read"
		if a == accessWrite {
			verb = "write"
		}
		return status.Errorf(codes.PermissionDenied, "token %q may not %s service %q", p.name, verb, service)
	}
	return nil
}

// requireAll checks that the caller may read every service ("*").
func (s *Server) requireAll(ctx context.Context) error {
	p, err := s.caller(ctx)
	if p == nil {
		return err
	}
	if !p.all {
		return status.Errorf(codes.PermissionDenied, "token %q: this needs a token scoped to every service (\"*\")", p.name)
	}
	return nil
}

// mayRead reports whether the caller in ctx may read service (for filtering listings).
func (s *Server) mayRead(ctx context.Context, service string) bool {
	return s.authorize(ctx, service, accessRead) == nil
}

// authHTTP authenticates every HTTP request except the health endpoints and stores the
// principal in the request context; a missing or unknown token is answered with 401.
func (s *Server) authHTTP(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		auth := s.authn()
		if !auth.enabled() || r.URL.Path == "/healthz" || r.URL.Path == "/readyz" || s.isUIPath(r.URL.Path) {
			next.ServeHTTP(w, r)
			return
		}
		p, err := auth.authenticate(r.Header.Get("Authorization"))
		if err != nil {
			w.Header().Set("WWW-Authenticate", `Bearer realm="tether"`)
			writeStatus(w, err)
			return
		}
		next.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), principalKey{}, p)))
	})
}

// authUnary authenticates gRPC calls from the "authorization" metadata.
func (s *Server) authUnary(ctx context.Context, req any, _ *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	auth := s.authn()
	if !auth.enabled() {
		return handler(ctx, req)
	}
	var authz string
	if md, ok := metadata.FromIncomingContext(ctx); ok {
		if v := md.Get("authorization"); len(v) > 0 {
			authz = v[0]
		}
	}
	p, err := auth.authenticate(authz)
	if err != nil {
		return nil, err
	}
	return handler(context.WithValue(ctx, principalKey{}, p), req)
}

// principalAttr names the caller's token in logs ("" with auth off).
func principalAttr(ctx context.Context) slog.Attr {
	name := ""
	if p := principalOf(ctx); p != nil {
		name = p.name
	}
	return slog.String("token", name)
}
