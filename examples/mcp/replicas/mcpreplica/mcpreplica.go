// Package mcpreplica runs real MCP server replicas built with the official Go SDK: the servers
// of the examples/mcp deployment (see ../main.go) and of tether's MCP affinity tests. Each replica
// identifies itself: its session ids start with its name, and its tools answer with the name, so a
// client can tell which replica served a call.
package mcpreplica

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// InstanceHeader is the response header naming the replica; every response carries it.
const InstanceHeader = "X-Instance"

// WhoAmI is the structured result of the "whoami" and "roots" tools.
type WhoAmI struct {
	Instance string `json:"instance"`
	Session  string `json:"session"`
	// Roots is the number of roots the client reported ("roots" tool only).
	Roots int `json:"roots"`
}

// Options configures a replica.
type Options struct {
	// ProtocolVersions narrows the versions the server negotiates (e.g. "2025-06-18"); empty
	// means every version the SDK supports.
	ProtocolVersions []string
	// Stateless serves Streamable HTTP without sessions (the 2026-07-28 style).
	Stateless bool
	// Addr is the listen address, host:port (default 127.0.0.1:0, a free loopback port).
	Addr string
}

// Server is one running replica. It serves Streamable HTTP at /mcp, HTTP+SSE at /sse (endpoint
// /sse?sessionid=…) and /healthz; every response carries InstanceHeader.
// Its methods are safe for concurrent use.
type Server struct {
	Name string
	// Addr is host:port of the listener.
	Addr string
	// Host and Port split Addr.
	Host string
	Port int

	srv      *http.Server
	requests atomic.Int64
	mu       sync.Mutex
	perPath  map[string]int
	log      []Record
	closed   atomic.Bool
}

// Start runs a replica named name on opts.Addr (default: 127.0.0.1 at a free port) until ctx
// ends or Close is called.
func Start(ctx context.Context, name string, opts Options) (*Server, error) {
	addr := opts.Addr
	if addr == "" {
		addr = "127.0.0.1:0"
	}
	lis, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("listen: %w", err)
	}
	host, portStr, _ := net.SplitHostPort(lis.Addr().String())
	port, _ := strconv.Atoi(portStr)
	s := &Server{Name: name, Addr: lis.Addr().String(), Host: host, Port: port, perPath: map[string]int{}}

	newServer := func() *mcp.Server {
		srv := mcp.NewServer(&mcp.Implementation{Name: name, Version: "v1"}, &mcp.ServerOptions{
			GetSessionID:              func() string { return name + "-" + rand.Text() },
			SupportedProtocolVersions: opts.ProtocolVersions,
		})
		mcp.AddTool(srv, &mcp.Tool{Name: "whoami", Description: "names the replica and session"},
			func(ctx context.Context, req *mcp.CallToolRequest, _ struct{}) (*mcp.CallToolResult, WhoAmI, error) {
				return nil, WhoAmI{Instance: name, Session: req.Session.ID()}, nil
			})
		mcp.AddTool(srv, &mcp.Tool{Name: "roots", Description: "asks the client for its roots (server→client request)"},
			func(ctx context.Context, req *mcp.CallToolRequest, _ struct{}) (*mcp.CallToolResult, WhoAmI, error) {
				// Roots are deprecated as of protocol 2026-07-28 but still served; a 2025-era
				// server→client request is exactly what the affinity tests must pin.
				res, err := req.Session.ListRoots(ctx, nil) //nolint:staticcheck // deliberate, see above
				if err != nil {
					return nil, WhoAmI{}, fmt.Errorf("list roots: %w", err)
				}
				return nil, WhoAmI{Instance: name, Session: req.Session.ID(), Roots: len(res.Roots)}, nil
			})
		return srv
	}
	shared := newServer()
	get := func(*http.Request) *mcp.Server { return shared }

	mux := http.NewServeMux()
	mux.Handle("/mcp", mcp.NewStreamableHTTPHandler(get, &mcp.StreamableHTTPOptions{
		Stateless:                  opts.Stateless,
		DisableLocalhostProtection: true,
	}))
	sse := mcp.NewSSEHandler(get, &mcp.SSEOptions{DisableLocalhostProtection: true})
	mux.Handle("/sse", sse)
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("ok")) })

	s.srv = &http.Server{
		Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			s.requests.Add(1)
			rec := Record{Method: r.Method, URI: r.URL.RequestURI(), Session: r.Header.Get("Mcp-Session-Id"),
				ProtocolVersion: r.Header.Get("Mcp-Protocol-Version"), Start: time.Now()}
			s.mu.Lock()
			s.perPath[r.Method+" "+r.URL.Path]++
			i := len(s.log)
			s.log = append(s.log, rec)
			s.mu.Unlock()
			w.Header().Set(InstanceHeader, name)
			sw := &statusWriter{ResponseWriter: w}
			mux.ServeHTTP(sw, r)
			s.mu.Lock()
			s.log[i].Status, s.log[i].Duration, s.log[i].Canceled = sw.status, time.Since(rec.Start), r.Context().Err() != nil
			s.mu.Unlock()
		}),
		ReadHeaderTimeout: 5 * time.Second,
	}
	go func() { _ = s.srv.Serve(lis) }()
	go func() {
		<-ctx.Done()
		s.Close()
	}()
	return s, nil
}

// Requests returns how many HTTP requests the replica has received.
func (s *Server) Requests() int64 { return s.requests.Load() }

// RequestsFor returns how many requests with this method and path the replica has received.
func (s *Server) RequestsFor(method, path string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.perPath[method+" "+path]
}

// Record is one request a replica received.
type Record struct {
	Method string
	// URI is the path and query.
	URI             string
	Session         string // Mcp-Session-Id header
	ProtocolVersion string // Mcp-Protocol-Version header
	Start           time.Time
	// Status is the response status (0 while the request is being served, or when the handler
	// wrote nothing); Duration is how long the handler ran (0 while it runs).
	Status   int
	Duration time.Duration
	// Canceled reports that the client had gone away when the handler returned.
	Canceled bool
}

// Log returns the requests received so far, in arrival order.
func (s *Server) Log() []Record {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]Record(nil), s.log...)
}

// statusWriter records the response status; it keeps http.Flusher reachable through Unwrap
// (http.ResponseController) and Flush.
type statusWriter struct {
	http.ResponseWriter
	status int
}

func (w *statusWriter) WriteHeader(code int) {
	if w.status == 0 {
		w.status = code
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *statusWriter) Write(b []byte) (int, error) {
	if w.status == 0 {
		w.status = http.StatusOK
	}
	return w.ResponseWriter.Write(b)
}

func (w *statusWriter) Flush() {
	if f, ok := w.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}

func (w *statusWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// Close stops the replica at once, cutting open streams (an instance crash as clients see it).
func (s *Server) Close() {
	if s.closed.Swap(true) {
		return
	}
	if err := s.srv.Close(); err != nil && !errors.Is(err, http.ErrServerClosed) {
		return
	}
}
