package dcr_test

import (
	"fmt"
	"strings"
	"sync"
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
		{"CheckRequest", errString(dcr.CheckRequest(m)), errString(dcr.CheckRequest(full))},
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

func errString(err error) string {
	if err == nil {
		return "<nil>"
	}
	return err.Error()
}

func boolString(b bool) string {
	if b {
		return "true"
	}
	return "false"
}

// agreeCase is a message both parse paths are held to agree on, and whether the fast path
// takes it itself.
type agreeCase struct {
	name     string
	raw      []byte
	wantFast bool
}

// withHeader is the default test request with extra header lines (name, value pairs).
func withHeader(kv ...string) []byte {
	var hs [][2]string
	for i := 0; i+1 < len(kv); i += 2 {
		hs = append(hs, [2]string{kv[i], kv[i+1]})
	}
	return dcrtest.SIP(dcrtest.Request{Headers: hs})
}

// rawRequest is a request line and header lines joined with CRLF, then the blank line.
func rawRequest(lines ...string) []byte {
	return []byte(strings.Join(lines, "\r\n") + "\r\n\r\n")
}

func agreeCases() []agreeCase {
	orig := [2]string{"P-Served-User", "<sip:alice@example.com>;sescase=orig"}
	return []agreeCase{
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

		// The validators that stand in for sipgo's typed-header parsers, each way.
		{"Via list", withHeader("Via", "SIP/2.0/TCP p1.example.com;branch=z9hG4bKa, SIP/2.0/UDP p2.example.com:5070;branch=z9hG4bKb"), true},
		{"Via list with a bad element", withHeader("Via", "SIP/2.0/TCP p1;branch=a, nonsense"), false},
		{"Via IPv6", withHeader("Via", "SIP/2.0/UDP [2001:db8::9]:5060;branch=z9hG4bK1;rport"), true},
		{"Via IPv6 unclosed", withHeader("Via", "SIP/2.0/UDP [2001:db8::9;branch=z9hG4bK1"), false},
		{"Via without transport separator", withHeader("Via", "SIP/2.0/UDP"), false},
		{"Via bad port", withHeader("Via", "SIP/2.0/UDP host:port;branch=1"), true},
		{"From wildcard", rawRequest("INVITE sip:a@b SIP/2.0", "From: *", "Call-ID: x"), false},
		{"From sip wildcard host", rawRequest("INVITE sip:a@b SIP/2.0", "From: <sip:*>;tag=1", "Call-ID: x"), false},
		{"To bare URI with params", rawRequest("INVITE sip:a@b SIP/2.0", "To: sip:bob@example.com;tag=t9", "From: sip:al@example.com;tag=f1", "Call-ID: x"), true},
		{"From no URI after display name", rawRequest("INVITE sip:a@b SIP/2.0", `From: "Alice"`, "Call-ID: x"), false},
		{"From unclosed quote", rawRequest("INVITE sip:a@b SIP/2.0", `From: "Alice <sip:a@b>;tag=1`, "Call-ID: x"), false},
		{"From unclosed bracket", rawRequest("INVITE sip:a@b SIP/2.0", `From: <sip:a@b;tag=1`, "Call-ID: x"), false},
		{"From escaped quote", rawRequest("INVITE sip:a@b SIP/2.0", `From: "A \"B\" \\" <sip:a@b>;tag=1`, "Call-ID: x"), true},
		{"From quoted then semicolon", rawRequest("INVITE sip:a@b SIP/2.0", `From: "A";sip:a@b;tag=1`, "Call-ID: x"), true},
		{"From bad port", rawRequest("INVITE sip:a@b SIP/2.0", "From: <sip:a@b:x5>;tag=1", "Call-ID: x"), false},
		{"From port then params", rawRequest("INVITE sip:a@b SIP/2.0", "From: <sip:a@b:5062;transport=tcp>;tag=1", "Call-ID: x"), true},
		{"From IPv6", rawRequest("INVITE sip:a@b SIP/2.0", "From: <sip:a@[2001:db8::1]:5062>;tag=1", "Call-ID: x"), true},
		{"From IPv6 unclosed", rawRequest("INVITE sip:a@b SIP/2.0", "From: <sip:a@[2001:db8::1>;tag=1", "Call-ID: x"), false},
		{"From tel", rawRequest("INVITE sip:a@b SIP/2.0", "From: <tel:+1-212-555-0100>;tag=1", "Call-ID: x"), true},
		{"From no scheme", rawRequest("INVITE sip:a@b SIP/2.0", "From: <alice>;tag=1", "Call-ID: x"), false},
		{"From non-ASCII scheme", rawRequest("INVITE sip:a@b SIP/2.0", "From: <s\xc3\xadp:a@b>;tag=1", "Call-ID: x"), false},
		{"From short URI", rawRequest("INVITE sip:a@b SIP/2.0", "From: <s:>;tag=1", "Call-ID: x"), false},
		{"From upper-case scheme", rawRequest("INVITE sip:a@b SIP/2.0", "From: <SIP:a@B:5060>;tag=1", "Call-ID: x"), true},
		{"two From lines", rawRequest("INVITE sip:a@b SIP/2.0", "From: <sip:a@b>;tag=first", "From: <sip:c@d>;tag=second", "Call-ID: one", "Call-ID: two"), true},
		{"Contact wildcard", withHeader("Contact", "*"), true},
		{"Contact list", withHeader("Contact", `"Doe, J" <sip:j@d>;q=0.5, <sip:k@e>`), true},
		{"Contact bad", withHeader("Contact", "<sip:a@b"), false},
		{"Route, Record-Route, Refer-To, Referred-By", withHeader("Route", "<sip:p1;lr>", "Record-Route", "<sip:p2;lr>, <sip:p3;lr>", "Refer-To", "<sip:c@d>", "Referred-By", "<sip:e@f>"), true},
		{"Route unclosed", withHeader("Route", "<sip:p1;lr"), true},
		{"Referred-By wildcard", withHeader("Referred-By", "<sip:*>"), false},
		{"CSeq two spaces", rawRequest("INVITE sip:a@b SIP/2.0", "CSeq: 1  INVITE", "Call-ID: x"), true},
		{"CSeq too large", rawRequest("INVITE sip:a@b SIP/2.0", "CSeq: 2147483648 INVITE", "Call-ID: x"), false},
		{"CSeq no method", rawRequest("INVITE sip:a@b SIP/2.0", "CSeq: 1", "Call-ID: x"), false},
		{"CSeq mismatch", rawRequest("INVITE sip:a@b SIP/2.0", "To: <sip:a@b>", "From: <sip:a@b>;tag=1", "Call-ID: x", "CSeq: 1 BYE", "Via: SIP/2.0/UDP h"), true},
		{"CSeq lower-case method", rawRequest("INVITE sip:a@b SIP/2.0", "To: <sip:a@b>", "From: <sip:a@b>;tag=1", "Call-ID: x", "CSeq: 1 invite", "Via: SIP/2.0/UDP h"), true},
		{"missing Via and To", rawRequest("INVITE sip:a@b SIP/2.0", "From: <sip:a@b>;tag=1", "Call-ID: x", "CSeq: 1 INVITE"), true},
		{"R-URI with headers", rawRequest("INVITE sip:a@b?Route=x SIP/2.0", "To: <sip:a@b>", "From: <sip:a@b>;tag=1", "Call-ID: x", "CSeq: 1 INVITE", "Via: SIP/2.0/UDP h"), true},
		{"Max-Forwards not a number", withHeader("Max-Forwards", "ten"), false},
		{"Content-Length not a number", rawRequest("INVITE sip:a@b SIP/2.0", "Content-Length: 1x", "Call-ID: x"), false},
		{"empty Call-ID", rawRequest("INVITE sip:a@b SIP/2.0", "Call-ID:", "From: <sip:a@b>;tag=1"), false},
		{"empty Content-Type", rawRequest("INVITE sip:a@b SIP/2.0", "c:  ", "Call-ID: x"), false},
		{"empty text header", withHeader("Subject", ""), true},
		{"names in any case", rawRequest("INVITE sip:a@b SIP/2.0", "VIA: SIP/2.0/UDP h;branch=z9hG4bK1", "fROM: <sip:a@b>;tag=1", "TO: <sip:c@d>", "CALL-id: x", "cseq: 1 INVITE",
			"CONTACT: <sip:a@h>", "ROUTE: <sip:p;lr;orig>", "Record-ROUTE: <sip:q;lr>", "REFER-to: <sip:r@s>", "referred-BY: <sip:t@u>", "MAX-FORWARDS: 70",
			"CONTENT-type: text/plain", "content-LENGTH: 0", "X-Call-ID: not-the-call-id", "Callid: neither"), true},

		// Tags and session cases read from the text (headerParam).
		{"two tags", rawRequest("INVITE sip:a@b SIP/2.0", "From: <sip:a@b>;tag=1;x;tag=2", "Call-ID: x"), true},
		{"tag split at its last =", rawRequest("INVITE sip:a@b SIP/2.0", "From: sip:a@b;x=1;tag=a=b", "Call-ID: x"), true},
		{"tag without value, empty params", rawRequest("INVITE sip:a@b SIP/2.0", "From: <sip:a@b>;;=tag;tag", "To: <sip:c@d>;tag=", "Call-ID: x"), true},
		{"tag inside the URI", rawRequest("INVITE sip:a@b SIP/2.0", "From: <sip:a@b;tag=u>", "Call-ID: x"), true},
		{"quoted display name then bare URI", rawRequest("INVITE sip:a@b SIP/2.0", `From: "A;<" ;sip:a@b;tag=q`, "Call-ID: x"), true},
		{"sescase upper case", withHeader("P-Served-User", "<sip:a@b>;sescase=ORIG;regstate=reg"), true},
		{"sescase term on bare URI", withHeader("P-Served-User", "sip:a@b;sescase=term", "Route", "<sip:s;lr;orig>"), true},
		{"sescase in the URI", withHeader("P-Served-User", "<sip:a@b;sescase=orig>"), true},
		{"sescase of a bad address", withHeader("P-Served-User", "<sip:a@b;sescase=orig"), true},
		{"sescase of the first element", withHeader("P-Served-User", `"x, y" <sip:a@b>;sescase=orig, <sip:c@d>;sescase=term`), true},
		{"sescase repeated", withHeader("P-Served-User", "<sip:a@b>;sescase=orig;sescase=xx"), true},
	}
}

// TestSIPFastPathAgrees runs the messages of the key tests, the forms the fast path's
// validators accept and refuse, and the unusual forms it hands to the full parser, through
// both paths.
func TestSIPFastPathAgrees(t *testing.T) {
	rules := []*dcr.Rules{mustParse(t, dcrtest.ExampleRules), mustParse(t, fuzzRules)}
	for _, tt := range agreeCases() {
		t.Run(tt.name, func(t *testing.T) {
			if fast := checkSIPPathsAgree(t, tt.raw, rules...); fast != tt.wantFast {
				_, ferr := dcr.ParseSIPFull(tt.raw)
				t.Errorf("fast path taken = %v, want %v (full parse error: %v)", fast, tt.wantFast, ferr)
			}
		})
	}
}

// FuzzSIPFastPathAgrees: whatever the bytes, the fast path accepts only what the full parser
// accepts, and then answers every question the same.
func FuzzSIPFastPathAgrees(f *testing.F) {
	rules := []*dcr.Rules{mustParse(f, dcrtest.ExampleRules), mustParse(f, fuzzRules)}
	f.Add(benchInvite())
	for _, c := range agreeCases() {
		f.Add(c.raw)
	}
	f.Add(dcrtest.SIP(dcrtest.Request{Headers: [][2]string{{"Route", "<sip:h:5070;lr;orig>"}, {"P-Served-User", "<sip:a@b>;sescase=term"}}}))
	f.Add([]byte("INVITE sip:a@b SIP/2.0\r\nf: <sip:a@b>;tag=1\r\ni: c\r\nl: 2\r\n\r\nxy"))
	f.Add([]byte("INVITE sip:a@b SIP/2.0\r\nFrom: <sip:a@b>\r\n ;tag=1\r\n\r\n"))
	f.Fuzz(func(t *testing.T, raw []byte) {
		checkSIPPathsAgree(t, raw, rules...)
	})
}

// TestSIPMessageRelease: strings read from a released message keep their values while its
// memory parses other messages, from many goroutines at once (run with -race).
func TestSIPMessageRelease(t *testing.T) {
	rules := mustParse(t, dcrtest.ExampleRules)
	msg := func(i int) []byte {
		return dcrtest.SIP(dcrtest.Request{RequestURI: fmt.Sprintf("sip:user%d@example.com", i),
			CallID: fmt.Sprintf("call-%d", i), FromTag: fmt.Sprintf("tag-%d", i)})
	}
	type kept struct{ key, callID, tag, method string }
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var held []kept
			for i := g * 1000; i < g*1000+200; i++ {
				m, err := dcr.ParseSIPRequest(msg(i))
				if err != nil {
					t.Error(err)
					return
				}
				key, _ := rules.Key(m)
				held = append(held, kept{key, m.CallID(), m.FromTag(), m.Method()})
				m.Release()
			}
			for j, k := range held {
				i := g*1000 + j
				if want := (kept{fmt.Sprintf("user%d", i), fmt.Sprintf("call-%d", i), fmt.Sprintf("tag-%d", i), "INVITE"}); k != want {
					t.Errorf("after release: %+v, want %+v", k, want)
					return
				}
			}
		}()
	}
	wg.Wait()
	// Releasing a message of the full parser does nothing.
	full, err := dcr.ParseSIPFull(msg(1))
	if err != nil {
		t.Fatal(err)
	}
	full.Release()
	if full.CallID() != "call-1" {
		t.Errorf("full parse after Release: Call-ID %q", full.CallID())
	}
}
