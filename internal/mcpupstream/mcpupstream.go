// Package mcpupstream runs real MCP server replicas built with the official Go SDK on loopback,
// for tether's MCP affinity tests. Each replica identifies itself: its session ids start with
// its name, and its tools answer with the name, so a test can tell which replica served a call.
package mcpupstream

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
}

// Server is one running replica. It serves Streamable HTTP at /mcp and HTTP+SSE at /sse.
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
	closed   atomic.Bool
}

// Start runs a replica named name on 127.0.0.1 at a free port until ctx ends or Close is called.
func Start(ctx context.Context, name string, opts Options) (*Server, error) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
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
				res, err := req.Session.ListRoots(ctx, nil)
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
			s.mu.Lock()
			s.perPath[r.Method+" "+r.URL.Path]++
			s.mu.Unlock()
			w.Header().Set("X-Instance", name)
			mux.ServeHTTP(w, r)
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

// Close stops the replica at once, cutting open streams (an instance crash as clients see it).
func (s *Server) Close() {
	if s.closed.Swap(true) {
		return
	}
	if err := s.srv.Close(); err != nil && !errors.Is(err, http.ErrServerClosed) {
		return
	}
}
