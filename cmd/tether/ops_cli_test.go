package main

import (
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/tether-dev/tether/internal/testutil"
	"github.com/tether-dev/tether/pkg/wire"
)

// hashConfig is a converged hash service "voice" with three instances on HTTP and SIP ports.
func hashConfig(t *testing.T) string {
	var b strings.Builder
	b.WriteString(`apiVersion: tether/v1
registry: {allowedNetworks: [127.0.0.1/32]}
listeners: {api: 127.0.0.1:0, extProc: 127.0.0.1:0, xds: 127.0.0.1:0, sip: 127.0.0.1:0}
services:
- name: voice
  affinity: hash
  instances:
`)
	for i := range 3 {
		fmt.Fprintf(&b, "  - {id: v%d, address: 127.0.0.1, ports: {http: %d, sip: %d}}\n", i, upstreamPort(t), 15060+i)
	}
	return b.String()
}

// TestRingLookupNamesTheInstanceARealRequestReaches: `tether ring lookup --sip` names, for
// each of 20 calls' keys (fromtag:callid), the instance that the real SIP decision endpoint
// then answers for an INVITE of that call.
func TestRingLookupNamesTheInstanceARealRequestReaches(t *testing.T) {
	info := startServe(t, hashConfig(t))
	seen := map[string]bool{}
	for i := range 20 {
		tag, callID := fmt.Sprintf("tag%d", i), fmt.Sprintf("call-%d@example.com", i)
		code, out, errOut := runCmd(t, "ring", "lookup", "-s", "voice", "--sip", tag+":"+callID, "--addr", info.apiAddr)
		if code != 0 {
			t.Fatalf("ring lookup: exit %d: %s", code, errOut)
		}
		// "voice sip key "tag0:call-0@example.com" -> v1 (127.0.0.1, http …, sip …)"
		_, after, ok := strings.Cut(out, "-> ")
		want, _, _ := strings.Cut(after, " ")
		if !ok || want == "" {
			t.Fatalf("ring lookup output %q", out)
		}
		invite := "INVITE sip:bob@example.com SIP/2.0\r\nVia: SIP/2.0/UDP 127.0.0.1:5060;branch=z9hG4bK" + tag + "\r\n" +
			"From: <sip:alice@example.com>;tag=" + tag + "\r\nTo: <sip:bob@example.com>\r\nCall-ID: " + callID + "\r\nCSeq: 1 INVITE\r\n" +
			"Max-Forwards: 70\r\nContent-Length: 0\r\n\r\n"
		r := testutil.Do(t, http.MethodPost, "http://"+info.sipAddr+"/v1/sip/voice/decide", invite, "Content-Type", "application/sip")
		if r.Status != http.StatusOK {
			t.Fatalf("decide: %d %s", r.Status, r.Body)
		}
		if got := r.Header.Get(wire.SIPInstanceHeader); got != want {
			t.Errorf("call %d: ring lookup said %s, the INVITE reached %s", i, want, got)
		}
		seen[want] = true
	}
	if len(seen) < 2 {
		t.Errorf("20 keys all mapped to %v: the lookup proves little", seen)
	}
	// HTTP keys use the HTTP ring; a service without a ring is refused clearly.
	if code, out, errOut := runCmd(t, "ring", "lookup", "-s", "voice", "192.0.2.7:5555", "--addr", info.apiAddr, "-o", "json"); code != 0 ||
		!strings.Contains(out, `"protocol": "RING_PROTOCOL_HTTP"`) {
		t.Errorf("HTTP lookup: exit %d %s %s", code, out, errOut)
	}
	if code, _, errOut := runCmd(t, "ring", "lookup", "-s", "nosuch", "k", "--addr", info.apiAddr); code != 1 || !strings.Contains(errOut, `tether ring: unknown service "nosuch" (tether status lists the services)`) {
		t.Errorf("unknown service: exit %d: %s", code, errOut)
	}
}

// TestStatusCLI: `tether status` prints the services, every instance with its slots, and the
// xDS line; -o json is the /v1/status snapshot.
func TestStatusCLI(t *testing.T) {
	info := startServe(t, testConfig(upstreamPort(t), upstreamPort(t)))
	if r := testutil.Do(t, http.MethodPost, "http://"+info.apiAddr+"/v1/services/web/sessions", "{}", wire.ClientHeader, "test", "Content-Type", "application/json"); r.Status != http.StatusCreated {
		t.Fatalf("create: %d %s", r.Status, r.Body)
	}
	code, out, errOut := runCmd(t, "status", "--addr", info.apiAddr)
	if code != 0 {
		t.Fatalf("status: exit %d: %s", code, errOut)
	}
	for _, want := range []string{"SERVICE  AFFINITY  DESIRED  ACTUAL  INSTANCES", "web      cookie    1", "i0", "i1", "1/20", "0/20", "xDS: generation", "ext_proc: 0 open streams"} {
		if !strings.Contains(out, want) {
			t.Errorf("status lacks %q:\n%s", want, out)
		}
	}
	if code, out, _ := runCmd(t, "status", "--addr", info.apiAddr, "-o", "json"); code != 0 || !strings.Contains(out, `"desiredInstances": 1`) {
		t.Errorf("status -o json: exit %d\n%s", code, out)
	}
	if code, _, _ := runCmd(t, "status", "extra", "--addr", info.apiAddr); code != 2 {
		t.Errorf("status with an argument: exit %d, want 2", code)
	}
}

// TestSessionsListIdleFilter: --idle-longer-than keeps the sessions last seen before it.
func TestSessionsListIdleFilter(t *testing.T) {
	srv := cliServer(t)
	// The CLI measures idleness by its own clock: the fixture's clock is set near it.
	srv.Clock.Set(time.Now().Add(-2 * time.Hour))
	if code, _, errOut := cli(t, srv, "sessions", "create", "-s", "hdr", "--id", "old-one", "--ttl", "6h", "--idle-timeout", "6h"); code != 0 {
		t.Fatal(errOut)
	}
	srv.Clock.Set(time.Now()) // the next session is seen now, the first two hours ago
	if code, _, errOut := cli(t, srv, "sessions", "create", "-s", "hdr", "--id", "new-one"); code != 0 {
		t.Fatal(errOut)
	}
	code, out, errOut := cli(t, srv, "sessions", "list", "-s", "hdr", "--idle-longer-than", "1h")
	if code != 0 || !strings.Contains(out, "old-one") || strings.Contains(out, "new-one") {
		t.Errorf("idle > 1h: exit %d %s\n%s", code, errOut, out)
	}
	code, out, _ = cli(t, srv, "sessions", "list", "-s", "hdr", "--instance", "i0")
	if code != 0 {
		t.Fatal(out)
	}
	for _, line := range strings.Split(strings.TrimSpace(out), "\n")[1:] {
		if f := strings.Fields(line); len(f) < 2 || f[1] != "i0" {
			t.Errorf("--instance i0 listed %q", line)
		}
	}
}
