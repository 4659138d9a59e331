package dcr_test

import (
	"bytes"
	"errors"
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
		if k, ok := r.Key(m); ok && k == "" {
			t.Fatal("empty SIP key with ok")
		}
		hm := dcr.NewHTTPMessage("GET", "/u/alice?user=sip:a@b", map[string][]string{"cookie": {"sid=+1-3"}, "x-user": {"<sip:x@y>"}}, "127.0.0.1:1")
		if k, ok := r.Key(hm); ok && k == "" {
			t.Fatal("empty HTTP key with ok")
		}
	})
}

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
	f.Fuzz(func(t *testing.T, raw []byte, uri, cookie, xuser string) {
		if m, err := dcr.ParseSIP(raw); err == nil {
			for _, r := range []*dcr.Rules{rules, example} {
				if k, ok := r.Key(m); ok && k == "" {
					t.Fatal("empty SIP key with ok")
				}
			}
			_ = dcr.DefaultSIPKey(m)
			_ = m.SessionCase()
		}
		hm := dcr.NewHTTPMessage("POST", uri, map[string][]string{"cookie": {cookie}, "X-User": {xuser}}, xuser)
		for _, r := range []*dcr.Rules{rules, example} {
			if k, ok := r.Key(hm); ok && k == "" {
				t.Fatal("empty HTTP key with ok")
			}
		}
		_ = dcr.DefaultHTTPKey(hm)
	})
}
