package sipdecide_test

import (
	"encoding/base64"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/tether-dev/tether/internal/sipp"
	"github.com/tether-dev/tether/internal/testutil"
	"github.com/tether-dev/tether/pkg/affinity/affinitytest"
	"github.com/tether-dev/tether/pkg/registry"
	"github.com/tether-dev/tether/pkg/sipdecide"
)

// TestKamailioInstanceKilledMidDialog: three calls are up on instance A (B is unhealthy when
// they are placed); then A's UAS is killed and A marked unhealthy, B healthy, and the caller
// sends its BYEs along the route set.
//   - Default (the example configuration as shipped): Kamailio relays each BYE to the dead A,
//     which never answers; after FR_TIMER the caller gets 408 — in-dialog requests follow their
//     route set, as with Kamailio's dispatcher.
//   - WITH_DIALOG_FAILOVER: Kamailio asks tether with the token stamped in its Record-Route
//     and relays each BYE to the key's next live instance, B (whose UAS stands in for an
//     instance holding a replicated copy of the dialog), which answers 200.
func TestKamailioInstanceKilledMidDialog(t *testing.T) {
	sipp.Require(t)
	for _, failover := range []bool{false, true} {
		name := "default"
		if failover {
			name = "WITH_DIALOG_FAILOVER"
		}
		t.Run(name, func(t *testing.T) {
			const service, n = "voice", 3
			a := sipp.StartUASScenario(t, "voice-a", sipp.ScenarioBasic)
			b := sipp.StartUASScenario(t, "voice-b", sipp.ScenarioByeOnly)
			insts := []registry.Instance{
				{Service: service, ID: "voice-a", Address: "127.0.0.1", SIPPort: a.Port, Weight: 1, State: registry.StateActive},
				{Service: service, ID: "voice-b", Address: "127.0.0.1", SIPPort: b.Port, Weight: 1, State: registry.StateActive},
			}
			svc := affinitytest.Service(service, registry.AffinityHash)
			svc.DCRFile = absPath(t, exampleDCR)
			f := affinitytest.New(t, []registry.Service{svc}, insts)
			setHealth := func(id string, h registry.Health) {
				t.Helper()
				if _, err := f.Registry.SetHealth(registry.Key{Service: service, ID: id}, h); err != nil {
					t.Fatal(err)
				}
			}
			decisions := httptest.NewServer(sipdecide.NewHandler(f.Engine))
			t.Cleanup(decisions.Close)
			// routesTo waits until a failover for key answers the instance id.
			routesTo := func(key, id string, port int) {
				t.Helper()
				tok := base64.RawURLEncoding.EncodeToString([]byte(key))
				testutil.Eventually(t, "tether routes "+key+" to "+id, func() bool {
					resp, err := http.Post(decisions.URL+"/v1/sip/"+service+"/failover", "text/plain", strings.NewReader(tok))
					if err != nil {
						return false
					}
					body, _ := io.ReadAll(resp.Body)
					_ = resp.Body.Close()
					return resp.StatusCode == http.StatusOK && strings.HasPrefix(string(body), "sip:127.0.0.1:"+strconv.Itoa(port))
				})
			}
			setHealth("voice-b", registry.HealthUnhealthy)
			routesTo("user1", "voice-a", a.Port)

			defines := map[string]string{"FR_TIMER": "1000"}
			if failover {
				defines["WITH_DIALOG_FAILOVER"] = "1"
				defines["FAILOVER_PATH"] = strconv.Quote("/" + service + "/failover")
			}
			kam := startKamailioWith(t, decisions.URL+"/v1/sip", service, defines)
			done := make(chan sipp.UACResult, 1)
			go func() {
				done <- sipp.RunUAC(t, sipp.UACOptions{Target: kam.Addr, Service: "user", Calls: n, Rate: 50,
					Scenario: sipp.ScenarioHold, Hold: 5 * time.Second, Timeout: 30 * time.Second})
			}()
			testutil.Eventually(t, "every call up on A", func() bool {
				return upCalls(t, map[string]*sipp.UAS{"voice-a": a})["voice-a"] == n
			})
			msgs, err := a.Received()
			if err != nil {
				t.Fatal(err)
			}
			for _, m := range msgs {
				stamped := strings.Contains(m.Raw, ";"+sipdecide.TokenParam+"=")
				if m.Method == "INVITE" && stamped != failover {
					t.Errorf("INVITE at A: Record-Route carries a token %v, want %v:\n%s", stamped, failover, m.Raw)
				}
			}
			a.Stop() // the instance dies mid-dialog
			setHealth("voice-a", registry.HealthUnhealthy)
			setHealth("voice-b", registry.HealthHealthy)
			routesTo("user1", "voice-b", b.Port)

			res := <-done
			byes := map[string]bool{}
			got, err := b.Received()
			if err != nil {
				t.Fatal(err)
			}
			for _, m := range got {
				if m.Method == "BYE" {
					byes[m.CallID] = true
				}
			}
			timeouts := map[string]bool{}
			for _, m := range res.Received {
				if strings.HasPrefix(m.StartLine, "SIP/2.0 408 ") {
					timeouts[m.CallID] = true
				}
			}
			if failover {
				if res.ExitCode != 0 || len(byes) != n {
					t.Fatalf("with failover: UAC exit %d, B answered BYEs of %d calls, want 0 and %d\nerrors:\n%s\nkamailio:\n%s",
						res.ExitCode, len(byes), n, tail(res.Errors), tail(kam.Log()))
				}
				return
			}
			if res.ExitCode == 0 || len(timeouts) != n || len(byes) != 0 {
				t.Fatalf("default: UAC exit %d, %d calls got 408, B saw %d BYEs; want failure, %d, 0\nkamailio:\n%s",
					res.ExitCode, len(timeouts), len(byes), n, tail(kam.Log()))
			}
		})
	}
}
