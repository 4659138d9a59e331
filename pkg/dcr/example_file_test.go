package dcr_test

import (
	"path/filepath"
	"testing"

	"github.com/tether-dev/tether/pkg/dcr"
	"github.com/tether-dev/tether/pkg/dcr/dcrtest"
)

// TestShippedExample loads examples/converged/data-centric-rules.xml and checks that one
// user's SIP and HTTP requests get one key.
func TestShippedExample(t *testing.T) {
	rules, err := dcr.Load(filepath.Join("..", "..", "examples", "converged", "data-centric-rules.xml"))
	if err != nil {
		t.Fatalf("the shipped example does not load: %v", err)
	}
	tests := []struct {
		name string
		msg  func(t *testing.T) dcr.Message
		want string
	}{
		{"SIP terminating", func(t *testing.T) dcr.Message {
			return mustSIP(t, dcrtest.Request{RequestURI: "sip:alice@voice.example.com"})
		}, "alice"},
		{"SIP originating", func(t *testing.T) dcr.Message {
			return mustSIP(t, dcrtest.Request{RequestURI: "sip:bob@example.com", Headers: [][2]string{
				{"P-Served-User", "<sip:alice@voice.example.com>;sescase=orig"},
				{"P-Asserted-Identity", "<sip:alice@voice.example.com>"}}})
		}, "alice"},
		{"SIP originating by number", func(t *testing.T) dcr.Message {
			return mustSIP(t, dcrtest.Request{RequestURI: "sip:bob@example.com", Headers: [][2]string{
				{"Route", "<sip:scscf.example.com;lr;orig>"},
				{"P-Asserted-Identity", "<tel:+1-212-555-0100>"}}})
		}, "+12125550100"},
		{"HTTP user parameter", func(t *testing.T) dcr.Message {
			return dcr.NewHTTPMessage("GET", "/api/calls?user=sip%3Aalice%40voice.example.com", nil, "192.0.2.1:1")
		}, "alice"},
		{"HTTP number parameter", func(t *testing.T) dcr.Message {
			return dcr.NewHTTPMessage("GET", "/api/calls?user=%2B1%20212%20555%200100", nil, "192.0.2.1:1")
		}, "+12125550100"},
		{"HTTP X-User", func(t *testing.T) dcr.Message {
			return dcr.NewHTTPMessage("GET", "/api/calls", map[string][]string{"x-user": {"alice"}}, "192.0.2.1:1")
		}, "alice"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if key, ok := rules.Key(tt.msg(t)); !ok || key != tt.want {
				t.Errorf("Key = %q, %v; want %q", key, ok, tt.want)
			}
		})
	}
}
