package status_test

import (
	"context"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/tether-dev/tether/pkg/affinity/affinitytest"
	"github.com/tether-dev/tether/pkg/registry"
	"github.com/tether-dev/tether/pkg/status"
)

// TestMCPMethodMetric: decisions of MCP requests are counted by their Mcp-Method — known
// methods by name, anything else a client writes as "other" — and by outcome.
func TestMCPMethodMetric(t *testing.T) {
	f := affinitytest.New(t, []registry.Service{affinitytest.Service("mcp", registry.AffinityMCPStreamable)}, affinitytest.Instances("mcp", 1))
	m := status.NewMetrics(status.New(f.Registry, f.Engine), nil, nil)
	d := m.TimedDecider(f.Engine, f.Registry)
	for _, method := range []string{"tools/list", "tools/call", "tools/call", "x-evil/" + strings.Repeat("a", 50)} {
		req := affinitytest.HTTP("mcp", "POST", "/mcp", "mcp-protocol-version", "2026-07-28", "mcp-method", method)
		dec, err := d.Decide(context.Background(), req)
		if err != nil {
			t.Fatal(err)
		}
		dec.End()
	}
	// A request naming an unknown session is refused (404), and counted so.
	if _, err := d.Decide(context.Background(), affinitytest.HTTP("mcp", "POST", "/mcp",
		"mcp-session-id", "nosuch", "mcp-method", "tools/call")); err == nil {
		t.Fatal("unknown session admitted")
	}
	want := `
# HELP tether_mcp_requests_total MCP requests decided, by service, MCP method (the Mcp-Method header; methods outside the MCP specification count as "other") and outcome.
# TYPE tether_mcp_requests_total counter
tether_mcp_requests_total{method="other",outcome="admitted",tether_service="mcp"} 1
tether_mcp_requests_total{method="tools/call",outcome="NotFound",tether_service="mcp"} 1
tether_mcp_requests_total{method="tools/call",outcome="admitted",tether_service="mcp"} 2
tether_mcp_requests_total{method="tools/list",outcome="admitted",tether_service="mcp"} 1
`
	if err := testutil.GatherAndCompare(m.Registry(), strings.NewReader(want), "tether_mcp_requests_total"); err != nil {
		t.Error(err)
	}
}
