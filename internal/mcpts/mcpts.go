// Package mcpts runs the official TypeScript MCP SDK (installed by `make deps` with npm ci in
// this directory) from Go tests: a client driver that runs a fixed script (client.mjs,
// RunClient), an interactive client driven call by call (session.mjs, Connect), a TS-style
// HTTP+SSE server (sse-server.mjs, SDK 1.x) and a sessionless MCP 2026-07-28 server with handle
// tools (handle-server.mjs, @modelcontextprotocol/server 2.x).
package mcpts

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"time"
)

// startWait bounds a Node server's start: loading the SDK takes seconds on a loaded 2-core
// machine (over 15 s at load 35); a server that starts never waits it out.
const startWait = time.Minute

// ErrNotInstalled means node or the npm packages are missing; tests skip on it outside CI.
var ErrNotInstalled = errors.New("node or the @modelcontextprotocol packages are not installed (run make deps)")

// Dir returns the directory holding the scripts and node_modules.
func Dir() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Dir(file)
}

// Available reports whether node and the SDK are installed.
func Available() error {
	if _, err := exec.LookPath("node"); err != nil {
		return ErrNotInstalled
	}
	for _, pkg := range []string{"sdk", "client", "server"} {
		if _, err := os.Stat(filepath.Join(Dir(), "node_modules", "@modelcontextprotocol", pkg)); err != nil {
			return ErrNotInstalled
		}
	}
	return nil
}

// SDK generations client.mjs can drive.
const (
	// SDKv1 is the 1.x @modelcontextprotocol/sdk package (the default).
	SDKv1 = "v1"
	// SDKv2 is the 2.x @modelcontextprotocol/client package.
	SDKv2 = "v2"
)

// ClientConfig is what client.mjs does.
type ClientConfig struct {
	URL       string `json:"url"`
	Transport string `json:"transport"` // "streamable" or "sse"
	Calls     int    `json:"calls"`
	Roots     bool   `json:"roots"`
	Terminate bool   `json:"terminate"`
	// SDK picks the client package: SDKv1 (also when empty) or SDKv2.
	SDK string `json:"sdk,omitempty"`
	// Hold makes the client print {"event":"holding"} after its calls and keep its session
	// open until Release is closed (or ctx ends); then it terminates (if asked) and closes.
	Hold bool `json:"hold"`
	// Release ends a Hold; unused without Hold.
	Release <-chan struct{} `json:"-"`
	// OnEvent, if set, is called with every event as soon as the client prints it, on
	// RunClient's goroutine.
	OnEvent func(Event) `json:"-"`
}

// Event is one line client.mjs prints.
type Event struct {
	Event     string `json:"event"`
	SessionID string `json:"sessionId"`
	// ProtocolVersion is the version the client negotiated ("connected" event only).
	ProtocolVersion string `json:"protocolVersion"`
	Tool            string `json:"tool"`
	Result          struct {
		Instance string `json:"instance"`
		Session  string `json:"session"`
		Roots    int    `json:"roots"`
	} `json:"result"`
	Status  any    `json:"status"`
	Message string `json:"message"`
}

// RunClient runs client.mjs to completion and returns its events. A client-side failure is
// returned as an error carrying the error event's message, with the events so far.
func RunClient(ctx context.Context, cfg ClientConfig) ([]Event, error) {
	if err := Available(); err != nil {
		return nil, err
	}
	arg, err := json.Marshal(cfg)
	if err != nil {
		return nil, fmt.Errorf("marshal config: %w", err)
	}
	cmd := exec.CommandContext(ctx, "node", filepath.Join(Dir(), "client.mjs"), string(arg))
	cmd.Dir = Dir()
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, fmt.Errorf("stdout pipe: %w", err)
	}
	var stdin io.WriteCloser
	if cfg.Hold {
		if stdin, err = cmd.StdinPipe(); err != nil {
			return nil, fmt.Errorf("stdin pipe: %w", err)
		}
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start node: %w", err)
	}
	if stdin != nil {
		done := make(chan struct{})
		defer close(done)
		go func() {
			select {
			case <-cfg.Release:
			case <-ctx.Done():
			case <-done:
			}
			_, _ = io.WriteString(stdin, "release\n")
			_ = stdin.Close()
		}()
	}
	var events []Event
	var failed error
	sc := bufio.NewScanner(stdout)
	for sc.Scan() {
		var ev Event
		if err := json.Unmarshal(sc.Bytes(), &ev); err != nil {
			continue // the SDK may print its own lines
		}
		events = append(events, ev)
		if cfg.OnEvent != nil {
			cfg.OnEvent(ev)
		}
		if ev.Event == "error" && failed == nil {
			failed = fmt.Errorf("ts client: %s (status %v)", ev.Message, ev.Status)
		}
	}
	runErr := cmd.Wait()
	if failed != nil {
		return events, failed
	}
	if runErr != nil {
		return events, fmt.Errorf("ts client: %w: %s", runErr, stderr.String())
	}
	return events, nil
}

// Server is a running TS SDK replica (sse-server.mjs or handle-server.mjs).
type Server struct {
	Name string
	Port int
	cmd  *exec.Cmd
}

// StartSSEServer starts a TS-SDK (1.x) HTTP+SSE server named name on 127.0.0.1; it stops when
// ctx ends or Close is called.
func StartSSEServer(ctx context.Context, name string) (*Server, error) {
	return startServer(ctx, "sse-server.mjs", name)
}

// StartHandleServer starts a sessionless TS SDK 2.x server (@modelcontextprotocol/server,
// MCP 2026-07-28) named name on 127.0.0.1 with the handle tools of the Go replica
// (mcpreplica.Options.Handles: "whoami", "open" minting "<name>:<random>" and naming it in the
// Mcp-Handle response header, "use" taking it in an x-mcp-header "Handle" argument); see
// handle-server.mjs. It stops when ctx ends or Close is called.
func StartHandleServer(ctx context.Context, name string) (*Server, error) {
	return startServer(ctx, "handle-server.mjs", name)
}

func startServer(ctx context.Context, script, name string) (*Server, error) {
	if err := Available(); err != nil {
		return nil, err
	}
	cmd := exec.CommandContext(ctx, "node", filepath.Join(Dir(), script), name)
	cmd.Dir = Dir()
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, fmt.Errorf("stdout pipe: %w", err)
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start node: %w", err)
	}
	lines := make(chan []byte, 1)
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			select {
			case lines <- append([]byte(nil), sc.Bytes()...):
			default:
			}
		}
	}()
	select {
	case line := <-lines:
		var ev struct {
			Port int `json:"port"`
		}
		if err := json.Unmarshal(line, &ev); err != nil || ev.Port == 0 {
			_ = cmd.Process.Kill()
			return nil, fmt.Errorf("%s said %q", script, line)
		}
		return &Server{Name: name, Port: ev.Port, cmd: cmd}, nil
	case <-time.After(startWait):
		_ = cmd.Process.Kill()
		return nil, fmt.Errorf("%s did not start within %v", script, startWait)
	}
}

// Request is one request a handle server received (Server.Log).
type Request struct {
	Method string `json:"method"`
	// MCPMethod and MCPName are the Mcp-Method and Mcp-Name headers.
	MCPMethod string `json:"mcpMethod"`
	MCPName   string `json:"mcpName"`
	// Handle is the Mcp-Param-Handle header.
	Handle string `json:"handle"`
}

// Log returns the requests a handle server has received, in arrival order.
func (s *Server) Log(ctx context.Context) ([]Request, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, fmt.Sprintf("http://127.0.0.1:%d/log", s.Port), nil)
	if err != nil {
		return nil, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, fmt.Errorf("%s log: %w", s.Name, err)
	}
	defer func() { _ = resp.Body.Close() }()
	var log []Request
	if err := json.NewDecoder(resp.Body).Decode(&log); err != nil {
		return nil, fmt.Errorf("%s log: %w", s.Name, err)
	}
	return log, nil
}

// Close kills the server (an instance crash as clients see it).
func (s *Server) Close() {
	_ = s.cmd.Process.Kill()
	_ = s.cmd.Wait()
}
