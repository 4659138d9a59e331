package dcr_test

import (
	"bytes"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/tether-dev/tether/pkg/dcr"
	"github.com/tether-dev/tether/pkg/dcr/dcrtest"
)

// fuzzRules holds rules that touch every variable family, so FuzzKey drives every code path
// of evaluation over hostile messages.
const fuzzRules = `<user-centric-rules>
<sip-rules>
  <session-case><equal>ORIGINATING</equal>
    <header name="P-Asserted-Identity" return="request.P-Asserted-Identity.uri.resolve.user"><exist/></header>
  </session-case>
  <header name="X-Key" return="request.X-Key.match.resolve.user"><match>(\+?[0-9][-0-9.]*)</match></header>
  <and><header name="To"><exist/></header><header name="From" return="request.From.tag"><exist/></header></and>
  <or><request-uri parameter="user" return="parameter.user.uri.resolve.host"><exist/></request-uri>
      <request-uri return="request.uri.resolve"><match>.</match></request-uri></or>
  <header name="Contact" return="request.Contact.uri.display-name"><exist/></header>
  <if><header name="Route" return="request.Route.uri.port"><exist/></header></if>
</sip-rules>
<http-rules>
  <cookie name="sid" return="cookie.sid.uri.resolve.user"><exist/></cookie>
  <request-uri parameter="user" return="parameter.user.uri.user"><exist/></request-uri>
  <header name="X-User" return="request.X-User.uri.scheme"><match>^(.*)$</match></header>
  <request-uri return="match.resolve.user"><match>/u/([^/?]+)</match></request-uri>
  <header name="X-User" return="request.X-User"><exist/></header>
</http-rules>
</user-centric-rules>`

// FuzzParse feeds arbitrary bytes to Parse as a rules file: a refusal is a *dcr.Error naming
// the file and a line; the same bytes parse the same way twice; accepted rules key a SIP and
// an HTTP message without panic, never with an empty key, and the same way for both parses.
func FuzzParse(f *testing.F) {
	for _, s := range []string{
		dcrtest.ExampleRules, fuzzRules, rulesCallID, rulesFrom,
		"", "<", "<user-centric-rules>", "<user-centric-rules><sip-rules><or></or></sip-rules></user-centric-rules>",
		"<?xml version=\"1.0\" encoding=\"ISO-8859-1\"?><user-centric-rules/>",
		`<user-centric-rules><sip-rules><header name="a" return="request.a.match"><match>(</match></header></sip-rules></user-centric-rules>`,
		`<user-centric-rules><http-rules><request-uri return="request.uri.resolve.host"><match>x|</match></request-uri></http-rules></user-centric-rules>`,
		`<user-centric-rules><sip-rules><session-case><equal>TERMINATING</equal></session-case></sip-rules></user-centric-rules>`,
		"<!DOCTYPE x [<!ENTITY a \"b\">]><user-centric-rules>&a;</user-centric-rules>",
	} {
		f.Add([]byte(s))
	}
	for _, c := range parseErrorCases() {
		f.Add([]byte(c.doc))
	}
	sipMsg := dcrtest.SIP(dcrtest.Request{Headers: [][2]string{
		{"P-Served-User", "<sip:a@b>;sescase=orig"}, {"P-Asserted-Identity", "<tel:+1-2>"}, {"X-Key", "+1.2"}}})
	f.Fuzz(func(t *testing.T, data []byte) {
		r, err := dcr.Parse(bytes.NewReader(data), "fuzz.xml")
		r2, err2 := dcr.Parse(bytes.NewReader(data), "fuzz.xml")
		if errString(err) != errString(err2) || (r == nil) != (r2 == nil) {
			t.Fatalf("parsing the same rules twice: %v, then %v", err, err2)
		}
		if err != nil {
			var de *dcr.Error
			if !errors.As(err, &de) {
				t.Fatalf("error %v is %T, not *dcr.Error", err, err)
			}
			if de.Line < 1 || !strings.HasPrefix(err.Error(), "fuzz.xml:") {
				t.Fatalf("malformed error %q", err)
			}
			return
		}
		// Any accepted rules evaluate without panic, and never yield an empty key.
		m, err := dcr.ParseSIP(sipMsg)
		if err != nil {
			t.Fatal(err)
		}
		k, ok := r.Key(m)
		if ok && k == "" {
			t.Fatal("empty SIP key with ok")
		}
		if k2, ok2 := r2.Key(m); k2 != k || ok2 != ok {
			t.Fatalf("two parses of the same rules key a message %q %v and %q %v", k, ok, k2, ok2)
		}
		hm := dcr.NewHTTPMessage("GET", "/u/alice?user=sip:a@b", map[string][]string{"cookie": {"sid=+1-3"}, "x-user": {"<sip:x@y>"}}, "127.0.0.1:1")
		k, ok = r.Key(hm)
		if ok && k == "" {
			t.Fatal("empty HTTP key with ok")
		}
		if k2, ok2 := r2.Key(hm); k2 != k || ok2 != ok {
			t.Fatalf("two parses of the same rules key an HTTP request %q %v and %q %v", k, ok, k2, ok2)
		}
	})
}

// FuzzKey keys arbitrary SIP bytes and HTTP request parts with rules that touch every variable
// family and with the example rules: never an empty key with ok; the parsed SIP message does
// not retain the bytes it came from; a second parse of the same bytes, after the first
// message was released and its memory reused, answers the same; HTTP keys are deterministic.
func FuzzKey(f *testing.F) {
	rules := mustParse(f, fuzzRules)
	example := mustParse(f, dcrtest.ExampleRules)
	for _, r := range []dcrtest.Request{
		{},
		{Headers: [][2]string{{"P-Served-User", "<sip:a@b>;sescase=orig"}, {"P-Asserted-Identity", `"x" <sip:+1.2@h;user=phone>, <tel:+3>`}}},
		{RequestURI: "tel:+1-212;phone-context=x", Headers: [][2]string{{"X-Key", "n=+44 20"}, {"Route", "<sip:h:5070;lr;orig>"}}},
		{RequestURI: "sips:[::1]:5061;user=x?h=v", From: `"q\"uo" <sip:a@b>`, Headers: [][2]string{{"Contact", `"Disp" <sip:c@d>, <sip:e@f>`}}},
	} {
		f.Add(dcrtest.SIP(r), "/u/x?user=sip%3Aa%40b", "sid=1", "sip:u@h")
	}
	f.Add([]byte("INVITE sip:a@b SIP/2.0\r\nf: <sip:a@b>;tag=1\r\ni: c\r\n\r\n"), "/?%zz", "=;;", "<")
	f.Add([]byte("SIP/2.0 200 OK\r\n\r\n"), "", "", "")
	other := dcrtest.SIP(dcrtest.Request{RequestURI: "sip:other@example.org", CallID: "other-call", FromTag: "other-tag",
		Headers: [][2]string{{"P-Asserted-Identity", "<sip:+9@x>"}, {"X-Key", "+9.9"}, {"Contact", `"O" <sip:o@p>`}}})
	// sipKeys is everything a decision reads from a parsed message, as one comparable string.
	sipKeys := func(t *testing.T, m *dcr.SIPMessage) string {
		var b strings.Builder
		for _, r := range []*dcr.Rules{rules, example} {
			k, ok := r.Key(m)
			if ok && k == "" {
				t.Fatal("empty SIP key with ok")
			}
			fmt.Fprintf(&b, "%q %v|", k, ok)
		}
		fmt.Fprintf(&b, "%q %q %q %q", dcr.DefaultSIPKey(m), m.SessionCase(), m.CallID(), m.FromTag())
		return b.String()
	}
	f.Fuzz(func(t *testing.T, raw []byte, uri, cookie, xuser string) {
		// raw is not retained: overwriting it leaves the answers as they were. The same bytes
		// give the same answers on a second parse, after the first message was released and
		// its memory reused for another message.
		buf := bytes.Clone(raw)
		if m, err := dcr.ParseSIP(buf); err == nil {
			first := sipKeys(t, m)
			for i := range buf {
				buf[i] = 'x'
			}
			if after := sipKeys(t, m); after != first {
				t.Fatalf("overwriting the parsed bytes changed the answers from %s to %s", first, after)
			}
			m.Release()
			if o, err := dcr.ParseSIP(other); err == nil {
				_ = sipKeys(t, o)
				o.Release()
			}
			m2, err := dcr.ParseSIP(raw)
			if err != nil {
				t.Fatalf("parsed once, then refused: %v", err)
			}
			if again := sipKeys(t, m2); again != first {
				t.Fatalf("the same message answers %s, then %s", first, again)
			}
			m2.Release()
		}
		httpKeys := func() string {
			hm := dcr.NewHTTPMessage("POST", uri, map[string][]string{"cookie": {cookie}, "X-User": {xuser}}, xuser)
			var b strings.Builder
			for _, r := range []*dcr.Rules{rules, example} {
				k, ok := r.Key(hm)
				if ok && k == "" {
					t.Fatal("empty HTTP key with ok")
				}
				fmt.Fprintf(&b, "%q %v|", k, ok)
			}
			b.WriteString(dcr.DefaultHTTPKey(hm))
			return b.String()
		}
		if a, b := httpKeys(), httpKeys(); a != b {
			t.Fatalf("the same HTTP request answers %s, then %s", a, b)
		}
	})
}
