// Package upstream runs small real HTTP servers on loopback that stand in for a service's
// instances in tests. Every response names the instance that served it (header
// X-Upstream-Instance and, for plain responses, the body), so a test can tell where the data
// plane sent each request.
//
// Behaviour is chosen per request by path and request headers:
//
//	any path          200, body "<id>\n"
//	/block...         holds the request until Release is called or the client goes away
//	/sse...           a text/event-stream: an "endpoint" event naming a fresh session id, then
//	                  a "ping" comment every 50 ms until Release or the client goes away
//	/count...         a text/event-stream of numbered events "data: <n>\n\n" (n from 0) every
//	                  20 ms (query interval=<duration> to change) until Release or the client
//	                  goes away, then "event: bye"
//	/empty            204 without a body
//	/trailers         200 with body and an X-Upstream-Trailer trailer
//	.../echo          200 streaming the request body back as it arrives
//	/healthz          200 "ok" (or 503 after SetHealthy(false))
//
// Request headers that steer the response:
//
//	X-Upstream-Set-Cookie: name=value     the response sets this cookie (repeatable)
//	X-Upstream-SSE-Framing: lf|crlf|cr    line ends of the SSE stream (default lf)
//	X-Upstream-SSE-Split: n               write the SSE prologue in n-byte chunks, flushing each
//	X-Upstream-SSE-Param: name            query parameter naming the session (default sessionId)
package upstream

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// InstanceHeader is the response header naming the instance that served a request.
const InstanceHeader = "X-Upstream-Instance"

// Request is what an upstream recorded about one request it received.
type Request struct {
	Method string
	Path   string
	Header http.Header
}

// Server is one upstream instance. All methods are safe for concurrent use.
type Server struct {
	id   string
	ln   net.Listener
	srv  *http.Server
	addr string

	healthy atomic.Bool
	served  atomic.Int64
	active  atomic.Int64 // requests in a handler now
	blocked atomic.Int64 // requests parked in /block or /sse now

	mu       sync.Mutex
	gate     chan struct{} // closed by Release
	seen     []Request
	sessions []string // SSE session ids announced
}

// Start starts an upstream named id on 127.0.0.1 with a random port.
func Start(id string) (*Server, error) {
	return StartOn(id, "127.0.0.1:0")
}

// StartOn starts an upstream named id on addr.
func StartOn(id, addr string) (*Server, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("upstream %s: listen: %w", id, err)
	}
	s := &Server{id: id, ln: ln, addr: ln.Addr().String(), gate: make(chan struct{})}
	s.healthy.Store(true)
	s.srv = &http.Server{Handler: s, ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = s.srv.Serve(ln) }()
	return s, nil
}

// ID returns the instance id.
func (s *Server) ID() string { return s.id }

// Addr returns the listening address as ip:port.
func (s *Server) Addr() string { return s.addr }

// Host returns the listening IP.
func (s *Server) Host() string { h, _, _ := net.SplitHostPort(s.addr); return h }

// Port returns the listening port.
func (s *Server) Port() int {
	_, p, _ := net.SplitHostPort(s.addr)
	n, _ := strconv.Atoi(p)
	return n
}

// URL returns http://ip:port.
func (s *Server) URL() string { return "http://" + s.addr }

// Served returns how many requests reached a handler (health checks excluded).
func (s *Server) Served() int64 { return s.served.Load() }

// Active returns how many requests are inside a handler now.
func (s *Server) Active() int64 { return s.active.Load() }

// Blocked returns how many requests are parked in /block or /sse now.
func (s *Server) Blocked() int64 { return s.blocked.Load() }

// SetHealthy makes /healthz answer 200 (true) or 503 (false).
func (s *Server) SetHealthy(ok bool) { s.healthy.Store(ok) }

// Release lets every request parked in /block or /sse finish, and re-arms the gate for later
// ones.
func (s *Server) Release() {
	s.mu.Lock()
	close(s.gate)
	s.gate = make(chan struct{})
	s.mu.Unlock()
}

// Requests returns a copy of the requests received so far (health checks excluded), oldest
// first.
func (s *Server) Requests() []Request {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]Request, len(s.seen))
	copy(out, s.seen)
	return out
}

// SSESessions returns the session ids announced on /sse streams, oldest first.
func (s *Server) SSESessions() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.sessions...)
}

// WaitBlocked waits until at least n requests are parked, or ctx ends.
func (s *Server) WaitBlocked(ctx context.Context, n int64) error {
	t := time.NewTicker(2 * time.Millisecond)
	defer t.Stop()
	for s.blocked.Load() < n {
		select {
		case <-ctx.Done():
			return fmt.Errorf("upstream %s: %d of %d requests blocked: %w", s.id, s.blocked.Load(), n, ctx.Err())
		case <-t.C:
		}
	}
	return nil
}

// Close stops the server and every open connection.
func (s *Server) Close() error {
	s.Release()
	return s.srv.Close()
}

func (s *Server) gateChan() <-chan struct{} {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.gate
}

// ServeHTTP implements http.Handler.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path == "/healthz" {
		if !s.healthy.Load() {
			http.Error(w, "unhealthy", http.StatusServiceUnavailable)
			return
		}
		_, _ = w.Write([]byte("ok"))
		return
	}
	s.served.Add(1)
	s.active.Add(1)
	defer s.active.Add(-1)
	s.mu.Lock()
	s.seen = append(s.seen, Request{Method: r.Method, Path: r.URL.RequestURI(), Header: r.Header.Clone()})
	s.mu.Unlock()

	w.Header().Set(InstanceHeader, s.id)
	for _, c := range r.Header.Values("X-Upstream-Set-Cookie") {
		w.Header().Add("Set-Cookie", c)
	}
	switch {
	case strings.HasPrefix(r.URL.Path, "/block"):
		s.block(w, r)
	case strings.HasPrefix(r.URL.Path, "/sse"):
		s.sse(w, r)
	case strings.HasPrefix(r.URL.Path, "/count"):
		s.count(w, r)
	case r.URL.Path == "/empty":
		w.WriteHeader(http.StatusNoContent)
	case strings.HasSuffix(r.URL.Path, "/echo"):
		_ = http.NewResponseController(w).EnableFullDuplex()
		w.Header().Set("Content-Type", "application/octet-stream")
		w.WriteHeader(http.StatusOK)
		_, _ = io.Copy(w, r.Body) // a failed copy shows as a short body at the client
	case r.URL.Path == "/trailers":
		w.Header().Set("Trailer", "X-Upstream-Trailer")
		_, _ = w.Write([]byte(s.id + "\n"))
		w.Header().Set("X-Upstream-Trailer", s.id)
	default:
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		_, _ = w.Write([]byte(s.id + "\n"))
	}
}

func (s *Server) block(w http.ResponseWriter, r *http.Request) {
	gate := s.gateChan()
	s.blocked.Add(1)
	defer s.blocked.Add(-1)
	select {
	case <-gate:
	case <-r.Context().Done():
		return
	}
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	_, _ = w.Write([]byte(s.id + "\n"))
}

// count streams numbered events, so a client can tell a lost or repeated byte.
func (s *Server) count(w http.ResponseWriter, r *http.Request) {
	fl, ok := w.(http.Flusher)
	if !ok {
		http.Error(w, "no flusher", http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/event-stream")
	w.WriteHeader(http.StatusOK)
	fl.Flush()
	gate := s.gateChan()
	s.blocked.Add(1)
	defer s.blocked.Add(-1)
	every := 20 * time.Millisecond
	if d, err := time.ParseDuration(r.URL.Query().Get("interval")); err == nil && d > 0 {
		every = d
	}
	t := time.NewTicker(every)
	defer t.Stop()
	for n := 0; ; n++ {
		if _, err := fmt.Fprintf(w, "data: %d\n\n", n); err != nil {
			return
		}
		fl.Flush()
		select {
		case <-gate:
			_, _ = io.WriteString(w, "event: bye\ndata: "+s.id+"\n\n")
			return
		case <-r.Context().Done():
			return
		case <-t.C:
		}
	}
}

func (s *Server) sse(w http.ResponseWriter, r *http.Request) {
	fl, ok := w.(http.Flusher)
	if !ok {
		http.Error(w, "no flusher", http.StatusInternalServerError)
		return
	}
	eol := "\n"
	switch r.Header.Get("X-Upstream-SSE-Framing") {
	case "crlf":
		eol = "\r\n"
	case "cr":
		eol = "\r"
	}
	param := r.Header.Get("X-Upstream-SSE-Param")
	if param == "" {
		param = "sessionId"
	}
	split, _ := strconv.Atoi(r.Header.Get("X-Upstream-SSE-Split"))
	var b [16]byte
	_, _ = rand.Read(b[:])
	sid := hex.EncodeToString(b[:])
	s.mu.Lock()
	s.sessions = append(s.sessions, sid)
	s.mu.Unlock()

	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-cache")
	w.WriteHeader(http.StatusOK)
	prologue := ": " + s.id + eol + eol +
		"event: endpoint" + eol + "data: /messages?" + param + "=" + sid + eol + eol
	if split <= 0 {
		split = len(prologue)
	}
	for i := 0; i < len(prologue); i += split {
		_, _ = w.Write([]byte(prologue[i:min(i+split, len(prologue))]))
		fl.Flush()
	}
	gate := s.gateChan()
	s.blocked.Add(1)
	defer s.blocked.Add(-1)
	t := time.NewTicker(50 * time.Millisecond)
	defer t.Stop()
	for {
		select {
		case <-gate:
			_, _ = w.Write([]byte("event: bye" + eol + "data: " + s.id + eol + eol))
			return
		case <-r.Context().Done():
			return
		case <-t.C:
			if _, err := w.Write([]byte(": ping" + eol + eol)); err != nil {
				return
			}
			fl.Flush()
		}
	}
}
