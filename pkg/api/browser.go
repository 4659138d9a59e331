package api

import (
	"fmt"
	"mime"
	"net"
	"net/http"
	"net/netip"
	"slices"
	"strings"

	"google.golang.org/grpc/codes"

	"github.com/tether-dev/tether/pkg/wire"
)

// The browser guard keeps web pages the operator happens to visit from driving the API, which
// a browser can reach wherever the operator can (loopback included). It applies to the
// HTTP/JSON routes; gRPC needs HTTP/2 with a non-simple content type, which no page can send
// to another origin, and a browser speaks HTTP/2 only over TLS, whose certificate a rebinding
// name does not match.
//
//   - Host: a request must name the listener — an IP literal, a loopback name ("localhost",
//     "*.localhost", which browsers resolve to loopback themselves), the listener's own host
//     or a name given with WithHosts — unless it authenticates. A DNS-rebinding page (its name
//     re-resolved to 127.0.0.1) is same-origin with the API and can send anything, but it
//     carries its own name in Host and has the victim's network position, not a token. IP
//     literals are safe: a page served from an address cannot re-point it.
//   - Origin: a request a browser marks with an Origin other than the listener's own (the
//     dashboard's, scheme://Host) or one given with WithOrigins is refused, reads included.
//   - Non-simple writes: a state-changing call (any method but GET, HEAD, OPTIONS) must carry
//     Authorization, or wire.ClientHeader and, with a body, Content-Type application/json.
//     Neither can be sent to another origin without a CORS preflight, which this API never
//     grants (it sends no Access-Control-* headers), so a page's fetch(…, {mode: "no-cors"})
//     or form post is refused even where Origin is missing (older browsers, some redirects).
//
// Refusals are 403 PermissionDenied (400 InvalidArgument for a body that is not JSON) in the
// API's one error model, naming what to send instead.

// WithHosts adds host names (without port, case-insensitive) the API answers to beside IP
// literals and loopback names: the listener's own host name and api.hosts.
func WithHosts(names ...string) Option {
	return func(s *Server) {
		for _, n := range names {
			if n = strings.ToLower(strings.TrimSpace(n)); n != "" {
				s.hosts = append(s.hosts, n)
			}
		}
	}
}

// WithOrigins adds browser origins (scheme://host[:port], case-insensitive) allowed to call
// the API beside the listener's own.
func WithOrigins(origins ...string) Option {
	return func(s *Server) {
		for _, o := range origins {
			if o = strings.ToLower(strings.TrimSuffix(strings.TrimSpace(o), "/")); o != "" {
				s.origins = append(s.origins, o)
			}
		}
	}
}

// guardBrowser applies the browser guard (above) in front of next. It runs after
// authentication, so it knows whether the request carried a valid credential.
func (s *Server) guardBrowser(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if msg := s.browserRefusal(r); msg != "" {
			writeError(w, codes.PermissionDenied, "", msg)
			return
		}
		if msg := simpleBodyRefusal(r); msg != "" {
			writeError(w, codes.InvalidArgument, "", msg)
			return
		}
		next.ServeHTTP(w, r)
	})
}

// browserRefusal returns why r is refused by the Host, Origin or non-simple rule, or "".
func (s *Server) browserRefusal(r *http.Request) string {
	authenticated := principalOf(r.Context()) != nil
	if !authenticated && !s.knownHost(r.Host) {
		return fmt.Sprintf("host %q does not name this API listener (a DNS-rebinding page would): use its address, localhost, or a name listed in api.hosts", r.Host)
	}
	if o := r.Header.Get("Origin"); o != "" && !s.allowedOrigin(r, o) {
		return fmt.Sprintf("origin %q may not call this API: only the dashboard's own origin and those listed in api.origins may", o)
	}
	if !safeMethod(r.Method) && r.Header.Get("Authorization") == "" && r.Header.Get(wire.ClientHeader) == "" {
		return fmt.Sprintf("%s without a token must carry the header %s (any value), which a page on another origin cannot send: tether's CLI and dashboard do", r.Method, wire.ClientHeader)
	}
	return ""
}

// simpleBodyRefusal refuses a token-less state-changing call whose body is not declared
// JSON: text/plain, form and untyped bodies are what a page can send without a preflight.
func simpleBodyRefusal(r *http.Request) string {
	if safeMethod(r.Method) || r.Header.Get("Authorization") != "" || r.ContentLength == 0 {
		return ""
	}
	mt, _, err := mime.ParseMediaType(r.Header.Get("Content-Type"))
	if err != nil || mt != "application/json" {
		return fmt.Sprintf("a request body must be Content-Type application/json, not %q", r.Header.Get("Content-Type"))
	}
	return ""
}

func safeMethod(m string) bool {
	return m == http.MethodGet || m == http.MethodHead || m == http.MethodOptions
}

// hostOnly strips the port (and IPv6 brackets) from a Host value and lower-cases it.
func hostOnly(hostport string) string {
	h := hostport
	if host, _, err := net.SplitHostPort(hostport); err == nil {
		h = host
	}
	return strings.ToLower(strings.TrimSuffix(strings.Trim(h, "[]"), "."))
}

// knownHost reports whether a Host value names this listener.
func (s *Server) knownHost(hostport string) bool {
	h := hostOnly(hostport)
	if h == "" {
		return false
	}
	if _, err := netip.ParseAddr(h); err == nil {
		return true
	}
	if h == "localhost" || strings.HasSuffix(h, ".localhost") {
		return true
	}
	return slices.Contains(s.hosts, h)
}

// allowedOrigin reports whether a browser on origin o may call: the listener's own origin
// (scheme and Host of the request itself, which is how the dashboard it serves calls) or a
// configured one.
func (s *Server) allowedOrigin(r *http.Request, o string) bool {
	o = strings.ToLower(o)
	scheme := "http"
	if r.TLS != nil {
		scheme = "https"
	}
	if o == scheme+"://"+strings.ToLower(r.Host) {
		return true
	}
	return slices.Contains(s.origins, o)
}
