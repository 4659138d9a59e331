package mcpe2e

import (
	"context"
	"net"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/tether-dev/tether/internal/e2e"
	"github.com/tether-dev/tether/internal/mcpconformance"
	"github.com/tether-dev/tether/internal/mcpconformance/everything"
	"github.com/tether-dev/tether/internal/testutil"
	"github.com/tether-dev/tether/pkg/registry"
	"github.com/tether-dev/tether/pkg/session"
)

// minScenarios is how many server scenarios @modelcontextprotocol/conformance 0.1.16 runs with
// --suite all; fewer means the suite changed or did not run them.
const minScenarios = 32

// TestConformanceSuiteThroughTether runs the official MCP conformance suite's server scenarios
// against an everything replica directly, then against three replicas behind tether (an
// mcp-streamable service) and the data plane. Every scenario passes directly (the replica is
// conformant), and every check that passes directly passes through tether: affinity keeps each
// scenario's session, its server→client requests and their replies on the replica that holds
// it. Each scenario opens its own session; with 20 session slots per replica they spread over
// at least two replicas, and each session tether bound names the replica whose id prefix it
// carries.
func TestConformanceSuiteThroughTether(t *testing.T) { e2e.ForEachKind(t, testConformanceSuite) }

func testConformanceSuite(t *testing.T, kind e2e.Kind) {
	if err := mcpconformance.Available(); err != nil {
		if os.Getenv("CI") != "" {
			t.Fatalf("CI must install the conformance suite (make deps): %v", err)
		}
		t.Skip(err)
	}
	ctx := testContext(t, 3*time.Minute)
	var reps []replica
	names := []string{"ev-a", "ev-b", "ev-c"}
	for _, n := range names {
		s, err := everything.Start(ctx, n)
		if err != nil {
			t.Fatalf("start %s: %v", n, err)
		}
		t.Cleanup(func() { _ = s.Close() })
		host, portStr, err := net.SplitHostPort(s.Addr)
		if err != nil {
			t.Fatal(err)
		}
		port, _ := strconv.Atoi(portStr)
		reps = append(reps, replica{Name: n, Host: host, Port: port})
	}

	direct := runSuite(ctx, t, "http://"+net.JoinHostPort(reps[0].Host, strconv.Itoa(reps[0].Port))+"/mcp")
	if len(direct) < minScenarios {
		t.Fatalf("direct run: %d scenarios, want at least %d", len(direct), minScenarios)
	}
	for _, s := range direct {
		if s.Failed() > 0 {
			t.Errorf("direct run: scenario %s failed: %+v", s.Name, failedChecks(s))
		}
	}

	svc := mcpService("mcp", registry.AffinityMCPStreamable, 20)
	e := newEnv(t, kind, []registry.Service{svc}, instancesOf("mcp", reps...))
	through := runSuite(ctx, t, e.URL+"/mcp")
	got := map[string]mcpconformance.Scenario{}
	for _, s := range through {
		got[s.Name] = s
	}
	passedDirect, passedThrough := 0, 0
	for _, d := range direct {
		th, ok := got[d.Name]
		if !ok {
			t.Errorf("scenario %s ran directly but not through tether", d.Name)
			continue
		}
		status := map[string]string{}
		for _, c := range th.Checks {
			status[c.ID] = c.Status
		}
		for _, c := range d.Checks {
			if c.Status != "SUCCESS" {
				continue
			}
			passedDirect++
			if status[c.ID] == "SUCCESS" {
				passedThrough++
				continue
			}
			t.Errorf("scenario %s check %s: passes directly, %q through tether (%+v)",
				d.Name, c.ID, status[c.ID], failedChecks(th))
		}
	}
	t.Logf("conformance: %d scenarios; %d checks pass directly, %d of them through tether (%s)",
		len(direct), passedDirect, passedThrough, kind)

	used := map[string]int{}
	for _, s := range e.sessions("mcp") {
		if !strings.HasPrefix(s.ID, s.Instance+"-") {
			t.Errorf("session %s bound to %s, but its replica prefix says otherwise", s.ID, s.Instance)
		}
		if s.Status == session.StatusActive {
			used[s.Instance]++
		}
	}
	if len(used) < 2 {
		t.Errorf("active sessions per replica %v: want the scenarios spread over at least 2 replicas", used)
	}
	testutil.Eventually(t, "every request slot released", func() bool {
		_, requests := e.totals("mcp")
		return requests == 0
	})
}

// runSuite runs the suite against url and returns its scenarios; it fails the test when the
// suite could not run.
func runSuite(ctx context.Context, t *testing.T, url string) []mcpconformance.Scenario {
	t.Helper()
	scenarios, out, err := mcpconformance.Run(ctx, url, t.TempDir())
	if err != nil {
		t.Fatalf("conformance suite against %s: %v\n%s", url, err, out)
	}
	return scenarios
}

func failedChecks(s mcpconformance.Scenario) []mcpconformance.Check {
	var out []mcpconformance.Check
	for _, c := range s.Checks {
		if c.Status == "FAILURE" {
			out = append(out, c)
		}
	}
	return out
}
