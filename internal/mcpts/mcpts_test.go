package mcpts_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/tether-dev/tether/examples/mcp/replicas/mcpreplica"
	"github.com/tether-dev/tether/internal/mcpts"
)

// skipUnlessInstalled skips when the TS SDK is missing, except in CI where it must be there.
func skipUnlessInstalled(t *testing.T) {
	t.Helper()
	if err := mcpts.Available(); err != nil {
		if os.Getenv("CI") != "" {
			t.Fatalf("CI must install the TS SDK: %v", err)
		}
		t.Skip(err)
	}
}

// TestFixturesTalkDirectly checks the fixtures themselves, with no proxy in between: the TS
// client against Go SDK replicas (Streamable HTTP and HTTP+SSE) and the TS-style SSE server.
func TestFixturesTalkDirectly(t *testing.T) {
	skipUnlessInstalled(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	goSrv, err := mcpreplica.Start(ctx, "go-a", mcpreplica.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer goSrv.Close()
	tsSrv, err := mcpts.StartSSEServer(ctx, "ts-a")
	if err != nil {
		t.Fatal(err)
	}
	defer tsSrv.Close()

	tests := []struct {
		name, url, transport, instance, sessionPrefix string
	}{
		{"go streamable", "http://" + goSrv.Addr + "/mcp", "streamable", "go-a", "go-a-"},
		{"go sse", "http://" + goSrv.Addr + "/sse", "sse", "go-a", ""},
		{"ts sse", fmt.Sprintf("http://127.0.0.1:%d/sse", tsSrv.Port), "sse", "ts-a", ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			events, err := mcpts.RunClient(ctx, mcpts.ClientConfig{URL: tc.url, Transport: tc.transport, Calls: 2, Roots: true, Terminate: true})
			if err != nil {
				t.Fatalf("%v (events %+v)", err, events)
			}
			calls := 0
			for _, ev := range events {
				if ev.Event != "call" {
					continue
				}
				calls++
				if ev.Result.Instance != tc.instance {
					t.Errorf("call served by %q, want %q", ev.Result.Instance, tc.instance)
				}
				if !strings.HasPrefix(ev.Result.Session, tc.sessionPrefix) {
					t.Errorf("session %q lacks prefix %q", ev.Result.Session, tc.sessionPrefix)
				}
				if ev.Tool == "roots" && ev.Result.Roots != 2 {
					t.Errorf("roots = %d, want 2 (server→client request answered)", ev.Result.Roots)
				}
			}
			if calls != 3 {
				t.Errorf("got %d calls, want 3: %+v", calls, events)
			}
		})
	}
	if got := goSrv.RequestsFor("DELETE", "/mcp"); got != 1 {
		t.Errorf("DELETE /mcp seen %d times, want 1", got)
	}
}

// TestSessionMirrorsHandles checks the interactive client against a sessionless Go replica with
// the handle tools, directly: pinned to 2026-07-28 (versionNegotiation {pin}), the 2.x client
// probes with server/discover, runs sessionless, sends Mcp-Method and Mcp-Name, and mirrors the
// "use" tool's x-mcp-header argument into Mcp-Param-Handle; with the SDK's default negotiation
// mode ('legacy') it initializes at 2025-11-25 and sends no such header.
func TestSessionMirrorsHandles(t *testing.T) {
	skipUnlessInstalled(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	srv, err := mcpreplica.Start(ctx, "h", mcpreplica.Options{Stateless: true, Handles: true})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	tests := []struct {
		name, pin, wantEra, wantVersion string
		mirrored                        bool
	}{
		{"pinned to 2026-07-28", "2026-07-28", "modern", "2026-07-28", true},
		{"default negotiation", "", "legacy", "2025-11-25", false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s, err := mcpts.Connect(ctx, mcpts.SessionConfig{URL: "http://" + srv.Addr + "/mcp", SDK: mcpts.SDKv2, Pin: tc.pin})
			if err != nil {
				t.Fatal(err)
			}
			defer func() {
				if err := s.Close(); err != nil {
					t.Error(err)
				}
			}()
			if s.Era != tc.wantEra || s.ProtocolVersion != tc.wantVersion {
				t.Fatalf("era %q at %q, want %q at %q", s.Era, s.ProtocolVersion, tc.wantEra, tc.wantVersion)
			}
			if _, err := s.ListTools(ctx); err != nil {
				t.Fatal(err)
			}
			res, err := s.CallTool(ctx, "open", nil)
			if err != nil {
				t.Fatal(err)
			}
			var h mcpreplica.Handle
			if err := json.Unmarshal(res.StructuredContent, &h); err != nil || h.Handle == "" {
				t.Fatalf("open: %s, %v", res.StructuredContent, err)
			}
			if res, err = s.CallTool(ctx, "use", map[string]any{"handle": h.Handle}); err != nil || res.IsError {
				t.Fatalf("use: %+v, %v", res, err)
			}
			log := srv.Log()
			last := log[len(log)-1]
			want := mcpreplica.Record{MCPMethod: "tools/call", MCPName: "use", Handle: h.Handle}
			if !tc.mirrored {
				want = mcpreplica.Record{}
			}
			if got := (mcpreplica.Record{MCPMethod: last.MCPMethod, MCPName: last.MCPName, Handle: last.Handle}); got != want {
				t.Errorf("the use request's headers: %+v, want %+v", got, want)
			}
		})
	}
}

// TestHandleServer checks handle-server.mjs directly with the pinned 2.x client: it serves
// 2026-07-28, mints a handle named in Mcp-Handle, and serves "use" only for its own handles;
// its log shows the mirrored Mcp-Param-Handle.
func TestHandleServer(t *testing.T) {
	skipUnlessInstalled(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	srv, err := mcpts.StartHandleServer(ctx, "tsh")
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	url := fmt.Sprintf("http://127.0.0.1:%d/mcp", srv.Port)
	s, err := mcpts.Connect(ctx, mcpts.SessionConfig{URL: url, SDK: mcpts.SDKv2, Pin: "2026-07-28"})
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := s.Close(); err != nil {
			t.Error(err)
		}
	}()
	if s.Era != "modern" || s.ProtocolVersion != "2026-07-28" {
		t.Fatalf("era %q at %q, want modern at 2026-07-28", s.Era, s.ProtocolVersion)
	}
	if _, err := s.ListTools(ctx); err != nil {
		t.Fatal(err)
	}
	res, err := s.CallTool(ctx, "open", nil)
	if err != nil {
		t.Fatal(err)
	}
	var h mcpreplica.Handle
	if err := json.Unmarshal(res.StructuredContent, &h); err != nil || !strings.HasPrefix(h.Handle, "tsh:") || h.Instance != "tsh" {
		t.Fatalf("open: %s, %v", res.StructuredContent, err)
	}
	if res, err = s.CallTool(ctx, "use", map[string]any{"handle": h.Handle}); err != nil || res.IsError {
		t.Fatalf("use: %+v, %v", res, err)
	}
	if res, err = s.CallTool(ctx, "use", map[string]any{"handle": "tsh:forged"}); err != nil || !res.IsError {
		t.Errorf("use of a handle it never minted: %+v, %v; want a tool error", res, err)
	}
	log, err := srv.Log(ctx)
	if err != nil {
		t.Fatal(err)
	}
	want := []mcpts.Request{
		{Method: "POST", MCPMethod: "server/discover"},
		{Method: "POST", MCPMethod: "tools/list"},
		{Method: "POST", MCPMethod: "tools/call", MCPName: "open"},
		{Method: "POST", MCPMethod: "tools/call", MCPName: "use", Handle: h.Handle},
		{Method: "POST", MCPMethod: "tools/call", MCPName: "use", Handle: "tsh:forged"},
	}
	if diff := cmp.Diff(want, log); diff != "" {
		t.Errorf("requests (-want +got):\n%s", diff)
	}
	// The announcement, as a proxy sees it: the response to an "open" names the minted handle
	// in Mcp-Handle.
	body := `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"open","arguments":{},"_meta":{` +
		`"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientInfo":{"name":"t","version":"1"},` +
		`"io.modelcontextprotocol/clientCapabilities":{}}}}`
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, url, strings.NewReader(body))
	for k, v := range map[string]string{"Content-Type": "application/json", "Accept": "application/json, text/event-stream",
		"Mcp-Protocol-Version": "2026-07-28", "Mcp-Method": "tools/call", "Mcp-Name": "open"} {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = resp.Body.Close() }()
	var rpc struct {
		Result struct {
			StructuredContent mcpreplica.Handle `json:"structuredContent"`
		} `json:"result"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&rpc); err != nil {
		t.Fatal(err)
	}
	if got := resp.Header.Get("Mcp-Handle"); resp.StatusCode != http.StatusOK || got == "" || got != rpc.Result.StructuredContent.Handle {
		t.Errorf("open over plain HTTP: %d, Mcp-Handle %q, handle %q; want 200 naming the handle", resp.StatusCode, got, rpc.Result.StructuredContent.Handle)
	}
}
