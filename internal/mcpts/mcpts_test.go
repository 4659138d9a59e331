package mcpts_test

import (
	"context"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

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
