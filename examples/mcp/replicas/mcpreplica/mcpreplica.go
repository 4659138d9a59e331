// Package mcpreplica runs real MCP server replicas built with the official Go SDK: the servers
// of the examples/mcp deployment (see ../main.go) and of tether's MCP affinity tests. Each replica
// identifies itself: its session ids start with its name, and its tools answer with the name, so a
// client can tell which replica served a call.
package mcpreplica

import (
	"context"
	"crypto/rand"
	"encoding/json"
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
	// Handles adds the handle tools of a sessionless (2026-07-28) server that keeps state
	// across calls: "open" mints a handle "<name>:<random>", returns it and announces it in
	// the HandleHeader response header; "use" takes it in its "handle" argument, marked
	// x-mcp-header HandleParam so clients mirror it in "Mcp-Param-Handle", and fails on a
	// handle this replica did not mint. Responses are JSON (not SSE) so that the header can
	// follow the tool's result.
	Handles bool
}

// Handle affinity names (Options.Handles).
const (
	// HandleHeader is the response header announcing a minted handle.
	HandleHeader = "Mcp-Handle"
	// HandleParam is the x-mcp-header name of "use"'s handle argument.
	HandleParam = "Handle"
	// mintHeader carries a fresh candidate handle from the HTTP layer to the "open" tool.
	mintHeader = "X-Replica-Mint"
)

// Handle is the structured result of the "open" tool.
type Handle struct {
	Handle   string `json:"handle"`
	Instance string `json:"instance"`
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
	// handles holds the handles this replica minted (Options.Handles).
	handles sync.Map
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
		if opts.Handles {
			s.addHandleTools(srv)
		}
		return srv
	}
	shared := newServer()
	get := func(*http.Request) *mcp.Server { return shared }

	mux := http.NewServeMux()
	mux.Handle("/mcp", mcp.NewStreamableHTTPHandler(get, &mcp.StreamableHTTPOptions{
		Stateless:                  opts.Stateless,
		JSONResponse:               opts.Handles,
		DisableLocalhostProtection: true,
	}))
	sse := mcp.NewSSEHandler(get, &mcp.SSEOptions{DisableLocalhostProtection: true})
	mux.Handle("/sse", sse)
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("ok")) })

	s.srv = &http.Server{
		Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			s.requests.Add(1)
			rec := Record{Method: r.Method, URI: r.URL.RequestURI(), Session: r.Header.Get("Mcp-Session-Id"),
				ProtocolVersion: r.Header.Get("Mcp-Protocol-Version"), MCPMethod: r.Header.Get("Mcp-Method"),
				MCPName: r.Header.Get("Mcp-Name"), Handle: r.Header.Get("Mcp-Param-" + HandleParam), Start: time.Now()}
			s.mu.Lock()
			s.perPath[r.Method+" "+r.URL.Path]++
			i := len(s.log)
			s.log = append(s.log, rec)
			s.mu.Unlock()
			w.Header().Set(InstanceHeader, name)
			if opts.Handles && r.Method == http.MethodPost {
				cand := name + ":" + rand.Text()
				r.Header.Set(mintHeader, cand)
				w = &mintWriter{ResponseWriter: w, cand: cand, minted: &s.handles}
			}
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

// addHandleTools adds "open" and "use" (Options.Handles).
func (s *Server) addHandleTools(srv *mcp.Server) {
	mcp.AddTool(srv, &mcp.Tool{Name: "open", Description: "mints a handle for state kept on this replica"},
		func(_ context.Context, req *mcp.CallToolRequest, _ struct{}) (*mcp.CallToolResult, Handle, error) {
			h := req.Extra.Header.Get(mintHeader)
			if h == "" {
				return nil, Handle{}, errors.New("no handle to mint (not called over HTTP)")
			}
			s.handles.Store(h, true)
			return nil, Handle{Handle: h, Instance: s.Name}, nil
		})
	useSchema := json.RawMessage(`{"type":"object","properties":{"handle":{"type":"string","x-mcp-header":"` + HandleParam + `"}},"required":["handle"]}`)
	srv.AddTool(&mcp.Tool{Name: "use", Description: "uses a handle minted by open", InputSchema: useSchema},
		func(_ context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
			var args struct {
				Handle string `json:"handle"`
			}
			if err := json.Unmarshal(req.Params.Arguments, &args); err != nil {
				return nil, fmt.Errorf("arguments: %w", err)
			}
			if _, ok := s.handles.Load(args.Handle); !ok {
				return &mcp.CallToolResult{IsError: true,
					Content: []mcp.Content{&mcp.TextContent{Text: fmt.Sprintf("replica %s never minted handle %q", s.Name, args.Handle)}}}, nil
			}
			res := WhoAmI{Instance: s.Name, Session: args.Handle}
			b, _ := json.Marshal(res)
			return &mcp.CallToolResult{StructuredContent: res, Content: []mcp.Content{&mcp.TextContent{Text: string(b)}}}, nil
		})
}

// mintWriter announces the candidate handle in HandleHeader when the request's tool minted it.
type mintWriter struct {
	http.ResponseWriter
	cand        string
	minted      *sync.Map
	wroteHeader bool
}

func (w *mintWriter) WriteHeader(code int) {
	if !w.wroteHeader {
		w.wroteHeader = true
		if _, ok := w.minted.Load(w.cand); ok {
			w.Header().Set(HandleHeader, w.cand)
		}
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *mintWriter) Write(b []byte) (int, error) {
	if !w.wroteHeader {
		w.WriteHeader(http.StatusOK)
	}
	return w.ResponseWriter.Write(b)
}

func (w *mintWriter) Flush() {
	if f, ok := w.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
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
	// MCPMethod and MCPName are the Mcp-Method and Mcp-Name headers (MCP 2026-07-28).
	MCPMethod, MCPName string
	// Handle is the Mcp-Param-Handle header: the handle a client mirrored from the "use"
	// tool's handle argument (Options.Handles).
	Handle string
	Start  time.Time
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
