package dcr_test

import (
	"testing"

	"github.com/tether-dev/tether/pkg/dcr"
	"github.com/tether-dev/tether/pkg/dcr/dcrtest"
)

// agreeNames are the header names and URI parameters compared between the two parse paths.
var (
	agreeHeaders = []string{"From", "f", "To", "t", "Call-ID", "i", "CSeq", "Via", "v", "Contact", "m", "Route",
		"Record-Route", "P-Asserted-Identity", "P-Served-User", "Supported", "k", "X-Key", "Max-Forwards",
		"Content-Length", "l", "Content-Type", "c", "Allow", "User-Agent", "X-Missing"}
	agreeParams = []string{"user", "transport", "orig", "phone-context", "h", "x"}
)

// checkSIPPathsAgree fails t when the fast path accepts raw and the full parser rejects it, or
// when both accept and any answer differs.
func checkSIPPathsAgree(t *testing.T, raw []byte, rules ...*dcr.Rules) (fast bool) {
	t.Helper()
	full, ferr := dcr.ParseSIPFull(raw)
	m, ok := dcr.ScanSIP(raw)
	if !ok {
		return false
	}
	if ferr != nil {
		t.Fatalf("fast path accepted what the full parser rejects (%v):\n%q", ferr, raw)
	}
	type pair struct{ name, fast, full string }
	checks := []pair{
		{"Method", m.Method(), full.Method()}, {"RequestURI", m.RequestURI(), full.RequestURI()},
		{"CallID", m.CallID(), full.CallID()}, {"FromTag", m.FromTag(), full.FromTag()},
		{"ToTag", m.ToTag(), full.ToTag()}, {"SessionCase", string(m.SessionCase()), string(full.SessionCase())},
		{"DefaultSIPKey", dcr.DefaultSIPKey(m), dcr.DefaultSIPKey(full)},
	}
	for i, r := range rules {
		k1, ok1 := r.Key(m)
		k2, ok2 := r.Key(full)
		checks = append(checks, pair{"Key" + string(rune('0'+i)), k1 + "|" + boolString(ok1), k2 + "|" + boolString(ok2)})
	}
	for _, h := range agreeHeaders {
		v1, ok1 := m.Header(h)
		v2, ok2 := full.Header(h)
		checks = append(checks, pair{"Header(" + h + ")", v1 + "|" + boolString(ok1), v2 + "|" + boolString(ok2)})
	}
	for _, p := range agreeParams {
		v1, ok1 := m.Param(p)
		v2, ok2 := full.Param(p)
		checks = append(checks, pair{"Param(" + p + ")", v1 + "|" + boolString(ok1), v2 + "|" + boolString(ok2)})
	}
	for _, c := range checks {
		if c.fast != c.full {
			t.Errorf("%s: fast path %q, full parser %q\n%q", c.name, c.fast, c.full, raw)
		}
	}
	return true
}

func boolString(b bool) string {
	if b {
		return "true"
	}
	return "false"
}

// TestSIPFastPathAgrees runs the messages of the key tests, and the unusual forms the fast
// path hands to the full parser, through both paths.
func TestSIPFastPathAgrees(t *testing.T) {
	rules := []*dcr.Rules{mustParse(t, dcrtest.ExampleRules), mustParse(t, fuzzRules)}
	orig := [2]string{"P-Served-User", "<sip:alice@example.com>;sescase=orig"}
	tests := []struct {
		name     string
		raw      []byte
		wantFast bool
	}{
		{"originating PAI", dcrtest.SIP(dcrtest.Request{Headers: [][2]string{orig, {"P-Asserted-Identity", "<sip:alice@example.com>"}}}), true},
		{"originating From", dcrtest.SIP(dcrtest.Request{From: "<sip:dave@example.com>", Headers: [][2]string{orig}}), true},
		{"terminating tel R-URI", dcrtest.SIP(dcrtest.Request{RequestURI: "tel:+1-650-555-0111"}), true},
		{"default key", dcrtest.SIP(dcrtest.Request{RequestURI: "sip:conference.example.com", FromTag: "9fxced76sl", CallID: "3848276298220188511@atlanta.example.com"}), true},
		{"no from tag", dcrtest.SIP(dcrtest.Request{RequestURI: "sip:example.com", FromTag: "-", CallID: "c7"}), true},
		{"route orig, multi-valued PAI", dcrtest.SIP(dcrtest.Request{Headers: [][2]string{{"Route", "<sip:scscf:5070;lr;orig>, <sip:b>"}, {"P-Asserted-Identity", `"x" <sip:+1.2@h;user=phone>, <tel:+3>`}, {"X-Key", "n=+44 20"}}}), true},
		{"URI params and headers", dcrtest.SIP(dcrtest.Request{RequestURI: "sips:[::1]:5061;user=x?h=v", From: `"q\"uo" <sip:a@b>`, Headers: [][2]string{{"Contact", `"Disp" <sip:c@d>, <sip:e@f>`}}}), true},
		{"compact forms", []byte("INVITE sip:bob@example.com;transport=udp SIP/2.0\r\nv: SIP/2.0/UDP 192.0.2.1;branch=z9hG4bK1\r\nf: \"A\" <sip:alice@example.com>;tag=abc\r\nt: <sip:bob@example.com>;tag=xyz\r\ni: compact-cid@host\r\nCSeq: 1 INVITE\r\nk: timer\r\nl: 0\r\n\r\n"), true},
		{"space before colon, trailing space", []byte("INVITE sip:a@b SIP/2.0\r\nCall-ID  :  x1 \t\r\nX-Key:\t+1-2 \r\nFrom: <sip:a@b>;tag=7\r\n\r\n"), true},
		{"body within Content-Length", []byte("INVITE sip:a@b SIP/2.0\r\nCall-ID: x\r\nContent-Length: 3\r\n\r\nabcdef"), true},
		{"folded header", []byte("INVITE sip:a@b SIP/2.0\r\nFrom: <sip:a@b>\r\n ;tag=1\r\nCall-ID: x\r\n\r\n"), false},
		{"lower-case method", []byte("invite sip:a@b SIP/2.0\r\nCall-ID: x\r\n\r\n"), false},
		{"bare LF", []byte("INVITE sip:a@b SIP/2.0\nCall-ID: x\n\n"), false},
		{"response", []byte("SIP/2.0 200 OK\r\nCall-ID: x\r\n\r\n"), false},
		{"truncated body", []byte("INVITE sip:a@b SIP/2.0\r\nContent-Length: 10\r\n\r\nabc"), false},
		{"bad Via", []byte("INVITE sip:a@b SIP/2.0\r\nVia: nonsense\r\nCall-ID: x\r\n\r\n"), false},
		{"no colon", []byte("INVITE sip:a@b SIP/2.0\r\nnocolon\r\n\r\n"), false},
		{"non-ASCII edge", []byte("INVITE sip:a@b SIP/2.0\r\nX-Key: \xc2\xa0x\r\n\r\n"), false},
		{"wildcard", []byte("INVITE * SIP/2.0\r\nCall-ID: x\r\n\r\n"), false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if fast := checkSIPPathsAgree(t, tt.raw, rules...); fast != tt.wantFast {
				t.Errorf("fast path taken = %v, want %v", fast, tt.wantFast)
			}
		})
	}
}

// FuzzSIPFastPathAgrees: whatever the bytes, the fast path accepts only what the full parser
// accepts, and then answers every question the same.
func FuzzSIPFastPathAgrees(f *testing.F) {
	rules := []*dcr.Rules{mustParse(f, dcrtest.ExampleRules), mustParse(f, fuzzRules)}
	f.Add(benchInvite())
	f.Add(dcrtest.SIP(dcrtest.Request{Headers: [][2]string{{"Route", "<sip:h:5070;lr;orig>"}, {"P-Served-User", "<sip:a@b>;sescase=term"}}}))
	f.Add([]byte("INVITE sip:a@b SIP/2.0\r\nf: <sip:a@b>;tag=1\r\ni: c\r\nl: 2\r\n\r\nxy"))
	f.Add([]byte("INVITE sip:a@b SIP/2.0\r\nFrom: <sip:a@b>\r\n ;tag=1\r\n\r\n"))
	f.Fuzz(func(t *testing.T, raw []byte) {
		checkSIPPathsAgree(t, raw, rules...)
	})
}
