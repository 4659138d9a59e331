package sipdecide_test

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"

	"github.com/tether-dev/tether/internal/envoyharness"
	"github.com/tether-dev/tether/internal/sipp"
	"github.com/tether-dev/tether/internal/upstream"
	"github.com/tether-dev/tether/pkg/affinity/affinitytest"
	"github.com/tether-dev/tether/pkg/dcr"
	"github.com/tether-dev/tether/pkg/dcr/dcrtest"
	"github.com/tether-dev/tether/pkg/extproc"
	"github.com/tether-dev/tether/pkg/registry"
	"github.com/tether-dev/tether/pkg/sipdecide"
)

// The shipped example: the Kamailio configuration and the DCR file the tests run.
var (
	exampleKamailioCfg = filepath.Join("..", "..", "examples", "converged", "kamailio.cfg")
	exampleDCR         = filepath.Join("..", "..", "examples", "converged", "data-centric-rules.xml")
)

func absPath(t testing.TB, p string) string {
	t.Helper()
	a, err := filepath.Abs(p)
	if err != nil {
		t.Fatal(err)
	}
	return a
}

// startKamailio runs the example configuration against a tether decision endpoint at baseURL
// (…/v1/sip) for service.
func startKamailio(t *testing.T, baseURL, service string) *sipp.Kamailio {
	t.Helper()
	return sipp.StartKamailio(t, sipp.KamailioOptions{
		Config: absPath(t, exampleKamailioCfg),
		Defines: map[string]string{
			"TETHER_URL":  strconv.Quote("tether=>" + baseURL + ";timeout=1"),
			"TETHER_PATH": strconv.Quote("/" + service + "/decide"),
			// One UDP worker keeps replies in order: with two, a 180 handled by one worker
			// can reach the UAC after the 200 another worker forwarded, and SIPp aborts the call.
			"WORKERS": "1",
		},
	})
}

// TestKamailioConverged runs the converged example end to end with real processes: SIPp calls
// through Kamailio (examples/converged/kamailio.cfg), which asks tether's decision endpoint
// (real engine, the example DCR file) for each initial INVITE; three SIPp UAS instances
// answer. Every call's INVITE, ACK and BYE must reach one UAS, the calls must spread, each
// call's UAS must be the engine's Maglev choice for its key, and an HTTP request of the same
// user through the ext_proc path (Envoy harness → tether ext_proc → upstream) must reach the
// same instance.
func TestKamailioConverged(t *testing.T) {
	sipp.Require(t)
	const service, calls = "voice", 30

	// Three instances, each with a real HTTP upstream and a real SIPp UAS.
	var insts []registry.Instance
	uasByID := map[string]*sipp.UAS{}
	for i := 1; i <= 3; i++ {
		id := fmt.Sprintf("voice-%d", i)
		up, err := upstream.Start(id)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = up.Close() })
		uas := sipp.StartUAS(t, id)
		uasByID[id] = uas
		insts = append(insts, registry.Instance{
			Service: service, ID: id, Address: "127.0.0.1", HTTPPort: up.Port(), SIPPort: uas.Port,
			Weight: 1, State: registry.StateActive,
		})
	}
	svc := affinitytest.Service(service, registry.AffinityHash)
	svc.DCRFile = absPath(t, exampleDCR)
	f := affinitytest.New(t, []registry.Service{svc}, insts)
	rules, err := dcr.Load(svc.DCRFile)
	if err != nil {
		t.Fatal(err)
	}

	// tether's SIP decision endpoint, and Kamailio asking it.
	decisions := httptest.NewServer(sipdecide.NewHandler(f.Engine))
	t.Cleanup(decisions.Close)
	kam := startKamailio(t, decisions.URL+"/v1/sip", service)

	res := sipp.RunUAC(t, sipp.UACOptions{Target: kam.Addr, Service: "user", Calls: calls, Rate: 20, Timeout: 30 * time.Second})
	if res.ExitCode != 0 {
		t.Fatalf("UAC exit code %d\nerrors:\n%s\noutput:\n%s\nkamailio:\n%s", res.ExitCode, tail(res.Errors), tail(res.Output), tail(kam.Log()))
	}

	// Which UAS received which message of which call.
	type callSeen struct {
		instance string
		methods  []string
		invite   string
	}
	seen := map[string]*callSeen{}
	for id, uas := range uasByID {
		msgs, err := uas.Received()
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range msgs {
			c := seen[m.CallID]
			if c == nil {
				c = &callSeen{instance: id}
				seen[m.CallID] = c
			}
			if c.instance != id {
				t.Errorf("call %s: %s reached %s, earlier messages reached %s", m.CallID, m.Method, id, c.instance)
			}
			c.methods = append(c.methods, m.Method)
			if m.Method == "INVITE" {
				c.invite = m.Raw
			}
		}
	}
	if len(seen) != calls {
		t.Fatalf("UAS instances saw %d calls, want %d", len(seen), calls)
	}
	o := newOracle(t, insts)
	perInstance := map[string]int{}
	userInstance := map[string]string{}
	for cid, c := range seen {
		if diff := slices.Compare([]string{"INVITE", "ACK", "BYE"}, c.methods); diff != 0 {
			t.Errorf("call %s at %s: got %v, want INVITE, ACK, BYE", cid, c.instance, c.methods)
		}
		perInstance[c.instance]++
		m, err := dcr.ParseSIP([]byte(c.invite))
		if err != nil {
			t.Fatalf("call %s: the INVITE the UAS got does not parse: %v", cid, err)
		}
		key, ok := rules.Key(m)
		if !ok || !strings.HasPrefix(key, "user") {
			t.Fatalf("call %s: DCR key %q, %v; want the Request-URI user", cid, key, ok)
		}
		if want := o.pick(t, key, allUsable); want.ID != c.instance {
			t.Errorf("call %s (key %s) reached %s, Maglev gives %s", cid, key, c.instance, want.ID)
		}
		userInstance[key] = c.instance
	}
	if len(perInstance) < 2 {
		t.Errorf("calls did not spread: %v", perInstance)
	}
	t.Logf("calls per instance: %v", perInstance)

	// The HTTP half: each user's web request through the ext_proc path reaches the instance
	// that took the user's call.
	harness := startEnvoyHarness(t, f, insts, service)
	client := &http.Client{Timeout: 5 * time.Second}
	for user, inst := range userInstance {
		u := harness.URL() + "/api/calls?user=" + url.QueryEscape("sip:"+user+"@example.com")
		resp, err := client.Get(u)
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		_ = resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("HTTP for %s: status %d", user, resp.StatusCode)
		}
		if got := resp.Header.Get(upstream.InstanceHeader); got != inst {
			t.Errorf("user %s: HTTP served by %s, SIP call by %s", user, got, inst)
		}
	}
}

// startEnvoyHarness serves tether's ext_proc on loopback and puts the Envoy stand-in in front
// of the instances' HTTP upstreams.
func startEnvoyHarness(t *testing.T, f *affinitytest.Fixture, insts []registry.Instance, service string) *envoyharness.Harness {
	t.Helper()
	gs := grpc.NewServer()
	extproc.Register(gs, extproc.NewServer(f.Engine))
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = gs.Serve(ln) }()
	t.Cleanup(gs.Stop)
	eps := make([]envoyharness.Endpoint, len(insts))
	for i, in := range insts {
		eps[i] = envoyharness.Endpoint{Address: in.HTTPAddr(), Healthy: true}
	}
	h, err := envoyharness.New(ln.Addr().String(),
		envoyharness.EndpointsFunc(func(string) []envoyharness.Endpoint { return eps }),
		[]envoyharness.VirtualHost{{Name: service, Domains: []string{"*"},
			Routes: []envoyharness.Route{{Name: service, PathPrefix: "/", Cluster: service, Service: service}}}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = h.Close() })
	return h
}

// TestKamailioFailurePath: when tether cannot be reached or refuses, the caller gets a SIP
// error with Retry-After instead of a hang or a relay to nowhere.
func TestKamailioFailurePath(t *testing.T) {
	sipp.Require(t)
	insts := affinitytest.Instances("voice", 2)
	f := hashFixture(t, insts)
	decisions := httptest.NewServer(sipdecide.NewHandler(f.Engine))
	t.Cleanup(decisions.Close)

	// A port nothing listens on: tether is down.
	dead, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	deadURL := "http://" + dead.Addr().String() + "/v1/sip"
	if err := dead.Close(); err != nil {
		t.Fatal(err)
	}

	t.Run("tether unreachable", func(t *testing.T) {
		kam := startKamailio(t, deadURL, "voice")
		status, reply := sendInvite(t, kam.Addr)
		if status != "503 Decision Service Unavailable" || !strings.Contains(reply, "\r\nRetry-After: 1\r\n") {
			t.Errorf("reply %q, want 503 Decision Service Unavailable with Retry-After:\n%s", status, reply)
		}
	})
	t.Run("unknown service", func(t *testing.T) {
		kam := startKamailio(t, decisions.URL+"/v1/sip", "nosuch")
		if status, reply := sendInvite(t, kam.Addr); status != "404 Not Found" {
			t.Errorf("reply %q, want 404:\n%s", status, reply)
		}
	})
	t.Run("no healthy instance", func(t *testing.T) {
		for _, in := range insts {
			if _, err := f.Registry.SetHealth(in.Key(), registry.HealthUnhealthy); err != nil {
				t.Fatal(err)
			}
			f.Sync(t)
		}
		kam := startKamailio(t, decisions.URL+"/v1/sip", "voice")
		deadline := time.Now().Add(10 * time.Second)
		for {
			status, reply := sendInvite(t, kam.Addr)
			if status == "503 Service Unavailable" && strings.Contains(reply, "\r\nRetry-After: 1\r\n") {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("reply %q, want 503 Service Unavailable with Retry-After:\n%s", status, reply)
			}
			time.Sleep(50 * time.Millisecond)
		}
	})
}

// sendInvite sends one INVITE to the proxy over UDP and returns the status line of the first
// final (≥ 200) response and the whole response.
func sendInvite(t *testing.T, proxy string) (string, string) {
	t.Helper()
	conn, err := net.ListenPacket("udp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = conn.Close() }()
	local := conn.LocalAddr().String()
	raw := dcrtest.SIP(dcrtest.Request{
		RequestURI: "sip:bob@" + proxy,
		CallID:     fmt.Sprintf("fail-%d@test", time.Now().UnixNano()),
		Headers:    [][2]string{{"Contact", "<sip:alice@" + local + ">"}},
	})
	// Point the Via at our socket so the proxy answers here.
	raw = []byte(strings.Replace(string(raw), "192.0.2.10:5060", local, 1))
	dst, err := net.ResolveUDPAddr("udp4", proxy)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := conn.WriteTo(raw, dst); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 65535)
	deadline := time.Now().Add(5 * time.Second)
	for {
		_ = conn.SetReadDeadline(deadline)
		n, _, err := conn.ReadFrom(buf)
		if err != nil {
			t.Fatalf("no final reply from %s: %v", proxy, err)
		}
		reply := string(buf[:n])
		line, _, _ := strings.Cut(reply, "\r\n")
		status := strings.TrimPrefix(line, "SIP/2.0 ")
		if code, _ := strconv.Atoi(status[:min(3, len(status))]); code >= 200 {
			return status, reply
		}
	}
}

func tail(s string) string {
	const n = 3000
	if len(s) > n {
		return "…" + s[len(s)-n:]
	}
	return s
}
