package sipdecide_test

import (
	"fmt"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/tether-dev/tether/internal/sipp"
	"github.com/tether-dev/tether/internal/testutil"
	"github.com/tether-dev/tether/pkg/affinity/affinitytest"
	"github.com/tether-dev/tether/pkg/calls"
	"github.com/tether-dev/tether/pkg/registry"
	"github.com/tether-dev/tether/pkg/sipdecide"
)

// startKamailioWith runs the example configuration like startKamailio, with extra defines.
func startKamailioWith(t *testing.T, baseURL, service string, defines map[string]string) *sipp.Kamailio {
	t.Helper()
	d := map[string]string{
		"TETHER_URL":  strconv.Quote("tether=>" + baseURL + ";timeout=1"),
		"TETHER_PATH": strconv.Quote("/" + service + "/decide"),
		"WORKERS":     "1", // see startKamailio
	}
	for k, v := range defines {
		d[k] = v
	}
	return sipp.StartKamailio(t, sipp.KamailioOptions{Config: absPath(t, exampleKamailioCfg), Defines: d})
}

// upCalls counts, per UAS, the calls that are up right now: INVITE and ACK received, no BYE.
func upCalls(t *testing.T, uas map[string]*sipp.UAS) map[string]int {
	t.Helper()
	up := map[string]int{}
	for _, c := range callsSeen(t, uas) {
		acked, bye := false, false
		for _, m := range c.methods {
			acked = acked || m == "ACK"
			bye = bye || m == "BYE"
		}
		if acked && !bye {
			up[c.instance]++
		}
	}
	return up
}

func answeredPer(tr *calls.Tracker, service string) map[string]int {
	out := map[string]int{}
	for _, l := range tr.Loads(service) {
		out[l.Instance] = l.Answered
	}
	return out
}

// TestKamailioCallLoad: Kamailio (the example configuration with WITH_CALL_LOAD) reports every
// call tether decided as answered and ended. While SIPp holds 12 calls up, tether's answered
// calls per instance equal the calls each UAS has up (INVITE and ACK, no BYE); after SIPp's BYEs
// tether counts none. With a cap of 2 calls per instance, each instance carries at most 2:
// exactly min(2, its share of the 12 keys) are admitted, and every other call is refused with
// a SIP 503 and Retry-After.
func TestKamailioCallLoad(t *testing.T) {
	sipp.Require(t)
	const service, n = "voice", 12
	for _, limit := range []int{0, 2} {
		t.Run(fmt.Sprintf("cap %d", limit), func(t *testing.T) {
			t.Parallel() // each case has its own Kamailio, UAS and tether; the hold dominates
			insts, uas := sipInstances(t, service, sipp.ScenarioBasic, "voice-1", "voice-2", "voice-3")
			svc := affinitytest.Service(service, registry.AffinityHash)
			svc.DCRFile = absPath(t, exampleDCR)
			f := affinitytest.New(t, []registry.Service{svc}, insts)
			tr := calls.New()
			tr.SetCap(service, limit)
			decisions := httptest.NewServer(sipdecide.NewHandler(f.Engine, sipdecide.WithCalls(tr)))
			t.Cleanup(decisions.Close)
			kam := startKamailioWith(t, decisions.URL+"/v1/sip", service, map[string]string{
				"WITH_CALL_LOAD": "1", "CALLS_PATH": strconv.Quote("/" + service + "/calls")})

			// What tether must admit: each call's key is its callee, user<n>.
			o := newOracle(t, insts)
			want, admitted := map[string]int{}, 0
			for i := 1; i <= n; i++ {
				in := o.pick(t, fmt.Sprint("user", i), allUsable)
				if limit == 0 || want[in.ID] < limit {
					want[in.ID]++
					admitted++
				}
			}

			// Each call is held for hold after its ACK, so all n are up at once only if setting
			// them all up takes less than hold: on a loaded machine that took more than 5 s. The
			// wait is bounded by the hold (after it the first BYEs make the condition false).
			const hold = 15 * time.Second
			done := make(chan sipp.UACResult, 1)
			go func() {
				done <- sipp.RunUAC(t, sipp.UACOptions{Target: kam.Addr, Service: "user", Calls: n, Rate: 100,
					Scenario: sipp.ScenarioHold, Hold: hold, Timeout: 40 * time.Second})
			}()
			var up map[string]int
			testutil.EventuallyWithin(t, hold, "tether's answered calls match the calls SIPp holds up", func() bool {
				up = upCalls(t, uas)
				total := 0
				for _, c := range answeredPer(tr, service) {
					total += c
				}
				return total == admitted && fmt.Sprint(up) == fmt.Sprint(want)
			})
			if got := answeredPer(tr, service); fmt.Sprint(got) != fmt.Sprint(up) {
				t.Errorf("while held: tether counts %v answered calls per instance, the UAS have %v up", got, up)
			}
			res := <-done
			refusedCalls := map[string]bool{} // SIPp retransmits the INVITE of a refused call
			for _, m := range res.Received {
				if strings.HasPrefix(m.StartLine, "SIP/2.0 503 ") {
					refusedCalls[m.CallID] = true
					if !strings.Contains(m.Raw, "Retry-After:") {
						t.Errorf("a refused call's 503 has no Retry-After:\n%s", m.Raw)
					}
				}
			}
			if refused := len(refusedCalls); refused != n-admitted {
				t.Errorf("%d calls refused with 503, want %d (cap %d, admitted %v)\nkamailio:\n%s", refused, n-admitted, limit, want, tail(kam.Log()))
			}
			if limit == 0 && res.ExitCode != 0 {
				t.Errorf("UAC exit code %d\nerrors:\n%s", res.ExitCode, tail(res.Errors))
			}
			testutil.Eventually(t, "every call ended after the BYEs", func() bool { return len(tr.Loads(service)) == 0 })
		})
	}
}
