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
	"os/exec"
	"path/filepath"
	"sync"
	"time"
)

// SessionConfig is how Connect connects session.mjs.
type SessionConfig struct {
	// URL is the Streamable HTTP endpoint.
	URL string `json:"url"`
	// SDK picks the client package: SDKv1 (also when empty) or SDKv2.
	SDK string `json:"sdk,omitempty"`
	// Pin (SDKv2 only) makes the client probe with server/discover and run the sessionless
	// era (MCP 2026-07-28 and later) at exactly this revision, failing to connect if the
	// server does not offer it: ClientOptions.versionNegotiation {mode: {pin}}. Empty runs the
	// 2025-era initialize handshake (the SDK's default mode, 'legacy'). Only in the sessionless
	// era does the client mirror x-mcp-header tool arguments into Mcp-Param-* headers.
	Pin string `json:"pin,omitempty"`
}

// Session is a connected TS SDK client driven command by command. Its methods are safe for
// concurrent use; commands run one at a time.
type Session struct {
	// Era is the client's protocol era, "modern" (sessionless, 2026-07-28+) or "legacy".
	Era string
	// ProtocolVersion is the negotiated protocol revision.
	ProtocolVersion string
	// SessionID is the Mcp-Session-Id of a legacy-era connection ("" when sessionless).
	SessionID string

	mu     sync.Mutex
	cmd    *exec.Cmd
	stdin  io.WriteCloser
	lines  chan []byte
	stderr *lockedWriter
	nextID int
	closed bool
}

// CallError is a command that failed in the client.
type CallError struct {
	// Status is the HTTP status of a non-2xx answer to the request (0 for other failures).
	Status int
	// Message is the SDK's error message.
	Message string
}

func (e *CallError) Error() string {
	if e.Status != 0 {
		return fmt.Sprintf("ts client: HTTP %d %s: %s", e.Status, http.StatusText(e.Status), e.Message)
	}
	return "ts client: " + e.Message
}

// StatusOf returns the HTTP status of a failed command (0 if err is not a CallError with one).
func StatusOf(err error) int {
	var ce *CallError
	if errors.As(err, &ce) {
		return ce.Status
	}
	return 0
}

// answer is one line session.mjs prints.
type answer struct {
	Event           string          `json:"event"`
	Era             string          `json:"era"`
	ProtocolVersion string          `json:"protocolVersion"`
	SessionID       string          `json:"sessionId"`
	ID              int             `json:"id"`
	OK              bool            `json:"ok"`
	Result          json.RawMessage `json:"result"`
	Status          int             `json:"status"`
	Message         string          `json:"message"`
}

// Connect starts session.mjs and connects it to cfg.URL. The process ends with Close or
// when ctx ends.
func Connect(ctx context.Context, cfg SessionConfig) (*Session, error) {
	if err := Available(); err != nil {
		return nil, err
	}
	arg, err := json.Marshal(cfg)
	if err != nil {
		return nil, fmt.Errorf("marshal config: %w", err)
	}
	s := &Session{lines: make(chan []byte, 16), stderr: &lockedWriter{w: &bytes.Buffer{}}}
	s.cmd = exec.CommandContext(ctx, "node", filepath.Join(Dir(), "session.mjs"), string(arg))
	s.cmd.Dir = Dir()
	s.cmd.Stderr = s.stderr
	stdout, err := s.cmd.StdoutPipe()
	if err != nil {
		return nil, fmt.Errorf("stdout pipe: %w", err)
	}
	if s.stdin, err = s.cmd.StdinPipe(); err != nil {
		return nil, fmt.Errorf("stdin pipe: %w", err)
	}
	if err := s.cmd.Start(); err != nil {
		return nil, fmt.Errorf("start node: %w", err)
	}
	go func() {
		defer close(s.lines)
		sc := bufio.NewScanner(stdout)
		sc.Buffer(make([]byte, 0, 64<<10), 16<<20)
		for sc.Scan() {
			s.lines <- append([]byte(nil), sc.Bytes()...)
		}
	}()
	a, err := s.read(ctx, func(a answer) bool { return a.Event != "" })
	if err != nil {
		s.kill()
		return nil, err
	}
	if a.Event != "connected" {
		s.kill()
		return nil, &CallError{Status: a.Status, Message: "connect: " + a.Message}
	}
	s.Era, s.ProtocolVersion, s.SessionID = a.Era, a.ProtocolVersion, a.SessionID
	return s, nil
}

// read returns the next answer that match accepts, skipping lines that are not answers.
func (s *Session) read(ctx context.Context, match func(answer) bool) (answer, error) {
	for {
		select {
		case line, ok := <-s.lines:
			if !ok {
				return answer{}, fmt.Errorf("ts client exited: %s", s.stderrText())
			}
			var a answer
			if json.Unmarshal(line, &a) != nil || !match(a) {
				continue // the SDK may print its own lines
			}
			return a, nil
		case <-ctx.Done():
			return answer{}, ctx.Err()
		}
	}
}

// do runs one command and returns its result.
func (s *Session) do(ctx context.Context, cmd map[string]any) (json.RawMessage, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil, errors.New("ts client: session closed")
	}
	s.nextID++
	id := s.nextID
	cmd["id"] = id
	b, err := json.Marshal(cmd)
	if err != nil {
		return nil, fmt.Errorf("marshal command: %w", err)
	}
	if _, err := s.stdin.Write(append(b, '\n')); err != nil {
		return nil, fmt.Errorf("ts client: write command: %w (%s)", err, s.stderrText())
	}
	a, err := s.read(ctx, func(a answer) bool { return a.Event == "" && a.ID == id })
	if err != nil {
		return nil, err
	}
	if !a.OK {
		return nil, &CallError{Status: a.Status, Message: a.Message}
	}
	return a.Result, nil
}

// Tool is a tool as tools/list lists it.
type Tool struct {
	Name        string          `json:"name"`
	InputSchema json.RawMessage `json:"inputSchema"`
}

// ListTools lists the server's tools. In the sessionless era the client keeps the list and
// mirrors the x-mcp-header arguments it declares into Mcp-Param-* headers of later calls.
func (s *Session) ListTools(ctx context.Context) ([]Tool, error) {
	raw, err := s.do(ctx, map[string]any{"op": "listTools"})
	if err != nil {
		return nil, err
	}
	var res struct {
		Tools []Tool `json:"tools"`
	}
	if err := json.Unmarshal(raw, &res); err != nil {
		return nil, fmt.Errorf("tools/list result %s: %w", raw, err)
	}
	return res.Tools, nil
}

// ToolResult is a tools/call result.
type ToolResult struct {
	StructuredContent json.RawMessage `json:"structuredContent"`
	IsError           bool            `json:"isError"`
	Content           []struct {
		Type string `json:"type"`
		Text string `json:"text"`
	} `json:"content"`
}

// CallTool calls tool name with args.
func (s *Session) CallTool(ctx context.Context, name string, args map[string]any) (*ToolResult, error) {
	if args == nil {
		args = map[string]any{}
	}
	raw, err := s.do(ctx, map[string]any{"op": "callTool", "name": name, "arguments": args})
	if err != nil {
		return nil, err
	}
	var res ToolResult
	if err := json.Unmarshal(raw, &res); err != nil {
		return nil, fmt.Errorf("tools/call result %s: %w", raw, err)
	}
	return &res, nil
}

// closeTimeout bounds how long Close waits for the client to exit before killing it.
const closeTimeout = 10 * time.Second

// Close closes the client and waits for the process to exit (killing it after closeTimeout).
func (s *Session) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	_ = s.stdin.Close() // EOF: session.mjs closes its client and exits
	s.mu.Unlock()
	kill := time.AfterFunc(closeTimeout, func() { _ = s.cmd.Process.Kill() })
	defer kill.Stop()
	for range s.lines { // drain until the process closes stdout
	}
	if err := s.cmd.Wait(); err != nil {
		return fmt.Errorf("ts client: %w: %s", err, s.stderrText())
	}
	return nil
}

func (s *Session) kill() {
	_ = s.cmd.Process.Kill()
	for range s.lines {
	}
	_ = s.cmd.Wait()
}

func (s *Session) stderrText() string {
	s.stderr.mu.Lock()
	defer s.stderr.mu.Unlock()
	return s.stderr.w.String()
}

// lockedWriter is a bytes.Buffer written by exec's copying goroutine and read by Session.
type lockedWriter struct {
	mu sync.Mutex
	w  *bytes.Buffer
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}
