package mcpe2e

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"strings"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/tether-dev/tether/examples/mcp/replicas/mcpreplica"
	"github.com/tether-dev/tether/internal/mcpts"
)

// Protocol versions the Go clients are pinned to ("" = the SDK default, which tries the
// sessionless 2026-07-28 server/discover first and falls back to initialize at 2025-11-25).
const (
	v20250326 = "2025-03-26"
	v20250618 = "2025-06-18"
	v20251125 = "2025-11-25"
	v20260728 = "2026-07-28"
	vDefault  = ""
)

// clientRoots is how many roots every Go client announces (the "roots" tool reports it).
const clientRoots = 3

// newGoClient returns a Go SDK client with clientRoots roots.
func newGoClient(name string) *mcp.Client {
	c := mcp.NewClient(&mcp.Implementation{Name: name, Version: "v1"}, nil)
	for i := range clientRoots {
		// Roots are deprecated from protocol 2026-07-28 but served by 2025-era sessions, whose
		// server→client requests are what these tests must pin.
		c.AddRoots(&mcp.Root{URI: fmt.Sprintf("file:///tmp/%s/%d", name, i), Name: fmt.Sprint(i)}) //nolint:staticcheck // deliberate, see above
	}
	return c
}

// connectStreamable connects a Go SDK client over Streamable HTTP at base+"/mcp".
func connectStreamable(ctx context.Context, name, base string, hc *http.Client, version string) (*mcp.ClientSession, error) {
	var opts *mcp.ClientSessionOptions
	if version != "" {
		opts = &mcp.ClientSessionOptions{ProtocolVersion: version}
	}
	return newGoClient(name).Connect(ctx, &mcp.StreamableClientTransport{Endpoint: base + "/mcp", HTTPClient: hc}, opts)
}

// connectSSE connects a Go SDK client over HTTP+SSE at endpoint.
func connectSSE(ctx context.Context, name, endpoint string, hc *http.Client) (*mcp.ClientSession, error) {
	return newGoClient(name).Connect(ctx, &mcp.SSEClientTransport{Endpoint: endpoint, HTTPClient: hc}, nil)
}

// call calls tool ("whoami" or "roots") and decodes its result.
func call(ctx context.Context, cs *mcp.ClientSession, tool string) (mcpreplica.WhoAmI, error) {
	res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: tool, Arguments: map[string]any{}})
	if err != nil {
		return mcpreplica.WhoAmI{}, err
	}
	if res.IsError {
		return mcpreplica.WhoAmI{}, fmt.Errorf("tool %s failed: %+v", tool, res.Content)
	}
	return decodeResult(res.StructuredContent)
}

// skipUnlessTS skips when the TypeScript SDK is not installed, except in CI.
func skipUnlessTS(t *testing.T) {
	t.Helper()
	if err := mcpts.Available(); err != nil {
		if os.Getenv("CI") != "" {
			t.Fatalf("CI must install the TS SDK (make deps): %v", err)
		}
		t.Skip(err)
	}
}

// tsCalls returns the tool results a TS client run printed.
func tsCalls(events []mcpts.Event) []mcpts.Event {
	var out []mcpts.Event
	for _, ev := range events {
		if ev.Event == "call" {
			out = append(out, ev)
		}
	}
	return out
}

// instanceOf returns the replica name a session id starts with ("name-…"), or "".
func instanceOf(sessionID string, names []string) string {
	for _, n := range names {
		if strings.HasPrefix(sessionID, n+"-") {
			return n
		}
	}
	return ""
}
