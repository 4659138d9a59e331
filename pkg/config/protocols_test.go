package config_test

import (
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/tether-dev/tether/pkg/config"
)

// TestSIPPortNeedsASIPMode: a SIP port on a service whose affinity mode cannot serve SIP is
// refused (a SIP decision there would be refused anyway); none and hash accept it.
func TestSIPPortNeedsASIPMode(t *testing.T) {
	for _, tc := range []struct {
		affinity, balancing string
		ok                  bool
	}{
		{"none", "", true}, {"hash", "", true}, {"none", "least-request", true},
		{"none", "sticky-round-robin", false}, {"cookie", "", false}, {"header", "", false},
		{"mcp-streamable", "", false}, {"mcp-sse", "", false},
	} {
		t.Run(tc.affinity+"/"+tc.balancing, func(t *testing.T) {
			y := "apiVersion: tether/v1\nservices:\n- name: s\n  affinity: " + tc.affinity + "\n"
			if tc.balancing != "" {
				y += "  balancing: " + tc.balancing + "\n"
			}
			y += "  instances: [{id: a, address: 10.0.0.1, ports: {http: 80, sip: 5060}}]\n"
			_, err := config.Parse([]byte(y), "tether.yaml")
			if tc.ok && err != nil {
				t.Fatalf("Parse: %v", err)
			}
			if !tc.ok && (err == nil || !strings.Contains(err.Error(), "services[0].instances[0].ports.sip: affinity") ||
				!strings.Contains(err.Error(), "does not serve SIP")) {
				t.Fatalf("Parse = %v, want a ports.sip error", err)
			}
		})
	}
}

// TestProtocolWarnings: a service serving both protocols warns where instances lack a port.
func TestProtocolWarnings(t *testing.T) {
	c, err := config.Parse([]byte(`apiVersion: tether/v1
services:
- name: calls
  affinity: hash
  instances:
  - {id: a, address: 10.0.0.1, ports: {sip: 5060}}
  - {id: b, address: 10.0.0.2, ports: {sip: 5060}}
- name: mixed
  match: {pathPrefix: /m}
  instances:
  - {id: a, address: 10.0.0.1, ports: {http: 80, sip: 5060}}
  - {id: b, address: 10.0.0.2, ports: {http: 80}}
- name: both
  match: {pathPrefix: /b}
  affinity: hash
  instances:
  - {id: a, address: 10.0.0.1, ports: {http: 81, sip: 5061}}
`), "tether.yaml")
	if err != nil {
		t.Fatal(err)
	}
	want := []string{
		"line 5: services[0].instances: no instance has ports.http: HTTP requests matching service calls are refused (503)",
		"line 10: services[1].instances: 1 of 2 instances have ports.sip: SIP decisions go to those only",
	}
	if d := cmp.Diff(want, c.Warnings); d != "" {
		t.Errorf("warnings (-want +got):\n%s", d)
	}
}

func TestNewSessionsValidation(t *testing.T) {
	_, err := config.Parse([]byte(`apiVersion: tether/v1
newSessions: {provisionalIdleTimeout: 2h, perClientRate: -1, perClientBurst: 0, trustedNetworks: [10.0.0.0/8, bogus]}
`), "tether.yaml")
	for _, want := range []string{
		"newSessions.provisionalIdleTimeout: 2h is out of range",
		"newSessions.perClientRate: -1 is out of range 0..10000",
		"newSessions.perClientBurst: 0 is out of range 1..100000",
		`newSessions.trustedNetworks[1]: "bogus" is not a CIDR prefix`,
	} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("Parse error %v; want it to contain %q", err, want)
		}
	}
	c, err := config.Parse([]byte("apiVersion: tether/v1\nnewSessions: {trustedNetworks: [10.1.2.3/8]}\n"), "tether.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if got := c.NewSessions.Trusted(); len(got) != 1 || got[0].String() != "10.0.0.0/8" {
		t.Errorf("Trusted() = %v, want [10.0.0.0/8]", got)
	}
}

// TestHandoffWarnings: on Redis with shutdown.handoff, a service without maxLifetime warns that
// its exchanges are not handed off; a bounded service, or the memory store, does not.
func TestHandoffWarnings(t *testing.T) {
	const svcs = `services:
- name: bounded
  match: {pathPrefix: /b}
  maxLifetime: 1h
  instances: [{id: a, address: 10.0.0.1, ports: {http: 80}}]
- name: open
  match: {pathPrefix: /o}
  instances: [{id: a, address: 10.0.0.1, ports: {http: 80}}]
`
	for _, tc := range []struct {
		name, head string
		want       []string
	}{
		{"redis, handoff", "store: {backend: redis, redis: {addresses: [127.0.0.1:6379]}}\nshutdown: {handoff: true}\n", []string{
			"line 9: services[1].maxLifetime: 0 (unbounded) with store.backend redis and shutdown.handoff: this service's exchanges are never handed off at a drain (a handed-off exchange's request slot stays leased until its maxLifetime, which has no end here); they are kept up to shutdown.drainTimeout and then reset",
		}},
		{"redis, no handoff", "store: {backend: redis, redis: {addresses: [127.0.0.1:6379]}}\n", nil},
		{"memory, handoff", "shutdown: {handoff: true}\n", nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := config.Parse([]byte("apiVersion: tether/v1\n"+tc.head+svcs), "tether.yaml")
			if err != nil {
				t.Fatal(err)
			}
			if d := cmp.Diff(tc.want, c.Warnings); d != "" {
				t.Errorf("warnings (-want +got):\n%s", d)
			}
		})
	}
}
