package sipdecide_test

import (
	"context"
	"net/http/httptest"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tether-dev/tether/internal/sipp"
	"github.com/tether-dev/tether/pkg/affinity"
	"github.com/tether-dev/tether/pkg/affinity/affinitytest"
	"github.com/tether-dev/tether/pkg/registry"
	"github.com/tether-dev/tether/pkg/sipdecide"
)

// sipInstances starts one SIPp UAS playing scenario per id and returns them as instances of
// service with SIP ports only.
func sipInstances(t *testing.T, service, scenario string, ids ...string) ([]registry.Instance, map[string]*sipp.UAS) {
	t.Helper()
	var insts []registry.Instance
	uas := map[string]*sipp.UAS{}
	for _, id := range ids {
		u := sipp.StartUASScenario(t, id, scenario)
		uas[id] = u
		insts = append(insts, registry.Instance{Service: service, ID: id, Address: "127.0.0.1", SIPPort: u.Port,
			Weight: 1, State: registry.StateActive})
	}
	return insts, uas
}

// callsSeen returns, per Call-ID, the UAS that received the call's messages and their methods
// in order; a call whose messages reached two UAS fails the test.
func callsSeen(t *testing.T, uas map[string]*sipp.UAS) map[string]seenCall {
	t.Helper()
	seen := map[string]seenCall{}
	for id, u := range uas {
		msgs, err := u.Received()
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range msgs {
			if m.Method == "" {
				continue // a response (an ACK'd 200 retransmission answer, …)
			}
			c, ok := seen[m.CallID]
			if ok && c.instance != id {
				t.Errorf("call %s: %s reached %s, earlier messages reached %s", m.CallID, m.Method, id, c.instance)
			}
			c.instance = id
			c.methods = append(c.methods, m.Method)
			seen[m.CallID] = c
		}
	}
	return seen
}

type seenCall struct {
	instance string
	methods  []string
}

// TestKamailioDialogs runs whole dialogs through Kamailio (the example configuration) to
// instances tether chose: every call's re-INVITE, ACKs, UPDATE and BYE follow the route set to
// the instance that took its INVITE, and a cancelled call's CANCEL and ACK reach the instance
// that got its INVITE. tether is asked once per call.
func TestKamailioDialogs(t *testing.T) {
	sipp.Require(t)
	tests := []struct {
		name, scenario string
		want           []string
	}{
		{"re-INVITE, UPDATE, BYE", sipp.ScenarioDialog, []string{"INVITE", "ACK", "INVITE", "ACK", "UPDATE", "BYE"}},
		{"CANCEL", sipp.ScenarioCancel, []string{"INVITE", "CANCEL", "ACK"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			const service, n = "voice", 12
			insts, uas := sipInstances(t, service, tc.scenario, "voice-1", "voice-2", "voice-3")
			svc := affinitytest.Service(service, registry.AffinityHash)
			svc.DCRFile = absPath(t, exampleDCR)
			f := affinitytest.New(t, []registry.Service{svc}, insts)
			var asked countingDecider
			asked.d = f.Engine
			decisions := httptest.NewServer(sipdecide.NewHandler(&asked))
			t.Cleanup(decisions.Close)
			kam := startKamailio(t, decisions.URL+"/v1/sip", service)

			res := sipp.RunUAC(t, sipp.UACOptions{Target: kam.Addr, Service: "user", Calls: n, Rate: 20,
				Scenario: tc.scenario, Hold: 50 * time.Millisecond, Timeout: 30 * time.Second})
			if res.ExitCode != 0 {
				t.Fatalf("UAC exit code %d\nerrors:\n%s\noutput:\n%s\nkamailio:\n%s", res.ExitCode, tail(res.Errors), tail(res.Output), tail(kam.Log()))
			}
			seen := callsSeen(t, uas)
			if len(seen) != n {
				t.Fatalf("UAS instances saw %d calls, want %d", len(seen), n)
			}
			per := map[string]int{}
			for cid, c := range seen {
				if !slices.Equal(c.methods, tc.want) {
					t.Errorf("call %s at %s: %v, want %v", cid, c.instance, c.methods, tc.want)
				}
				per[c.instance]++
			}
			if len(per) < 2 {
				t.Errorf("calls did not spread: %v", per)
			}
			if got := asked.n.Load(); got != n {
				t.Errorf("tether was asked %d times for %d calls, want once per call", got, n)
			}
		})
	}
}

// countingDecider counts the decisions asked of d.
type countingDecider struct {
	d sipdecide.Decider
	n atomic.Int64
}

func (c *countingDecider) Decide(ctx context.Context, req affinity.Request) (affinity.Decision, error) {
	c.n.Add(1)
	return c.d.Decide(ctx, req)
}
