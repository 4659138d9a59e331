package api

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"slices"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	grpccredentials "google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
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
	if isLoopback(host) || auth.Enabled() {
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

// principal is an authenticated caller (a token or a TLS client identity): its name, what it
// may touch and until when.
type principal struct {
	name     string
	all      bool     // services contains "*"
	services []string // sorted
	write    bool
	notAfter time.Time // zero: no expiry
}

func newPrincipal(name string, services []string, access string, notAfter time.Time) *principal {
	p := &principal{name: name, write: access == config.AccessWrite, notAfter: notAfter}
	for _, svc := range services {
		if svc == "*" {
			p.all = true
		} else {
			p.services = append(p.services, svc)
		}
	}
	slices.Sort(p.services)
	return p
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

// expired reports whether p's notAfter has passed at now.
func (p *principal) expired(now time.Time) bool { return !p.notAfter.IsZero() && now.After(p.notAfter) }

type tokenEntry struct {
	digest [sha256.Size]byte
	p      *principal
}

// authenticator checks bearer tokens and TLS client identities. Tokens are kept as SHA-256
// digests and compared in constant time against every configured token, so neither the match
// position nor the token length leaks through timing. A nil or empty authenticator accepts
// everyone. replaced is closed when SetAuth puts another in its place, so long-lived calls
// (the status stream) re-authenticate at once.
type authenticator struct {
	tokens   []tokenEntry
	clients  map[string]*principal // by certificate SAN
	replaced chan struct{}
}

func newAuthenticator(a config.Auth) *authenticator {
	out := &authenticator{clients: map[string]*principal{}, replaced: make(chan struct{})}
	for _, t := range a.Tokens {
		out.tokens = append(out.tokens, tokenEntry{digest: sha256.Sum256([]byte(t.Token)), p: newPrincipal(t.Name, t.Services, t.Access, t.NotAfter)})
	}
	for _, c := range a.Clients {
		out.clients[c.ID] = newPrincipal(c.Name, c.Services, c.Access, c.NotAfter)
	}
	return out
}

func (a *authenticator) enabled() bool { return a != nil && (len(a.tokens) > 0 || len(a.clients) > 0) }

// credentials are what a call presents: its Authorization value and its TLS state (nil
// without TLS).
type credentials struct {
	authorization string
	tls           *tls.ConnectionState
}

// authenticate is the one check of a caller's credentials, for HTTP and gRPC alike: a bearer
// token when Authorization is set, else the verified client certificate's identity (a URI or
// DNS SAN listed in auth.clients). Expired ones are refused. With auth disabled it returns
// nil, nil.
func (a *authenticator) authenticate(c credentials, now time.Time) (*principal, error) {
	if !a.enabled() {
		return nil, nil
	}
	var p *principal
	switch {
	case c.authorization != "":
		scheme, tok, ok := strings.Cut(strings.TrimSpace(c.authorization), " ")
		if !ok || !strings.EqualFold(scheme, "bearer") || strings.TrimSpace(tok) == "" {
			return nil, status.Error(codes.Unauthenticated, "malformed authorization: want \"Bearer <token>\"")
		}
		d := sha256.Sum256([]byte(strings.TrimSpace(tok)))
		for _, e := range a.tokens {
			if subtle.ConstantTimeCompare(d[:], e.digest[:]) == 1 && p == nil {
				p = e.p
			}
		}
		if p == nil {
			return nil, status.Error(codes.Unauthenticated, "unknown bearer token")
		}
	default:
		p = a.client(c.tls)
		if p == nil {
			if c.tls != nil && len(c.tls.VerifiedChains) > 0 {
				return nil, status.Error(codes.Unauthenticated, "the client certificate names no identity in auth.clients, and no bearer token was sent")
			}
			return nil, status.Error(codes.Unauthenticated, "missing bearer token (Authorization: Bearer <token>)")
		}
	}
	if p.expired(now) {
		return nil, status.Errorf(codes.Unauthenticated, "credential %q expired at %s", p.name, p.notAfter.Format(time.RFC3339))
	}
	return p, nil
}

// client maps a verified client certificate to its identity: the first of its URI SANs, then
// DNS SANs, listed in auth.clients. Unverified certificates (no client CA) name nobody.
func (a *authenticator) client(st *tls.ConnectionState) *principal {
	if st == nil || len(st.VerifiedChains) == 0 || len(st.PeerCertificates) == 0 {
		return nil
	}
	leaf := st.PeerCertificates[0]
	for _, u := range leaf.URIs {
		if p := a.clients[u.String()]; p != nil {
			return p
		}
	}
	for _, d := range leaf.DNSNames {
		if p := a.clients[d]; p != nil {
			return p
		}
	}
	return nil
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

// authorizeService is the check every per-service call starts with: a service name
// (InvalidArgument without one), then authorize.
func (s *Server) authorizeService(ctx context.Context, service string, a access) error {
	if service == "" {
		return status.Error(codes.InvalidArgument, "service is required")
	}
	return s.authorize(ctx, service, a)
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
func (s *Server) requireAll(ctx context.Context) error { return s.requireAllAt(ctx, accessRead) }

// requireAllAt checks that the caller may access every service ("*") at level a.
func (s *Server) requireAllAt(ctx context.Context, a access) error {
	p, err := s.caller(ctx)
	if p == nil {
		return err
	}
	if !p.all {
		return status.Errorf(codes.PermissionDenied, "token %q: this needs a token scoped to every service (\"*\")", p.name)
	}
	if !p.may("*", a) {
		return status.Errorf(codes.PermissionDenied, "token %q: this changes the whole deployment and needs a write token scoped to every service (\"*\")", p.name)
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
		p, err := auth.authenticate(httpCredentials(r), time.Now())
		if err != nil {
			w.Header().Set("WWW-Authenticate", `Bearer realm="tether"`)
			writeStatus(w, err)
			return
		}
		next.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), principalKey{}, p)))
	})
}

func httpCredentials(r *http.Request) credentials {
	return credentials{authorization: r.Header.Get("Authorization"), tls: r.TLS}
}

// authUnary authenticates gRPC calls from the "authorization" metadata.
func (s *Server) authUnary(ctx context.Context, req any, _ *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	auth := s.authn()
	if !auth.enabled() {
		return handler(ctx, req)
	}
	var c credentials
	if md, ok := metadata.FromIncomingContext(ctx); ok {
		if v := md.Get("authorization"); len(v) > 0 {
			c.authorization = v[0]
		}
	}
	if pr, ok := peer.FromContext(ctx); ok {
		if ti, ok := pr.AuthInfo.(grpccredentials.TLSInfo); ok {
			c.tls = &ti.State
		}
	}
	p, err := auth.authenticate(c, time.Now())
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
