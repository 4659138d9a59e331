package dcr_test

import (
	"strings"
	"testing"

	"github.com/tether-dev/tether/pkg/dcr"
	"github.com/tether-dev/tether/pkg/dcr/dcrtest"
)

func mustParse(t testing.TB, doc string) *dcr.Rules {
	t.Helper()
	r, err := dcr.Parse(strings.NewReader(doc), "test.xml")
	if err != nil {
		t.Fatalf("Parse: %v", err)
	}
	return r
}

func mustSIP(t testing.TB, r dcrtest.Request) *dcr.SIPMessage {
	t.Helper()
	m, err := dcr.ParseSIP(dcrtest.SIP(r))
	if err != nil {
		t.Fatalf("ParseSIP: %v", err)
	}
	return m
}

// rulesDoc wraps SIP and HTTP rule fragments in a rules document.
func rulesDoc(sipRules, httpRules string) string {
	return "<user-centric-rules>\n<sip-rules>\n" + sipRules + "\n</sip-rules>\n<http-rules>\n" +
		httpRules + "\n</http-rules>\n</user-centric-rules>\n"
}

// TestExampleRules runs the documented example (completed, see dcrtest.ExampleRules) over SIP
// and HTTP requests and checks the key of each.
func TestExampleRules(t *testing.T) {
	rules := mustParse(t, dcrtest.ExampleRules)
	if !rules.HasSIP() || !rules.HasHTTP() {
		t.Fatalf("HasSIP=%v HasHTTP=%v, want both", rules.HasSIP(), rules.HasHTTP())
	}
	orig := [2]string{"P-Served-User", "<sip:alice@example.com>;sescase=orig;regstate=reg"}
	sipTests := []struct {
		name    string
		req     dcrtest.Request
		wantKey string
		wantOK  bool
	}{
		{
			name:    "originating with P-Asserted-Identity tel URI",
			req:     dcrtest.Request{Headers: [][2]string{orig, {"P-Asserted-Identity", "<tel:+1-212-555-0100>"}}},
			wantKey: "+12125550100", wantOK: true,
		},
		{
			name: "originating with P-Asserted-Identity listing SIP then tel",
			req: dcrtest.Request{Headers: [][2]string{orig,
				{"P-Asserted-Identity", `"Alice" <sip:+1.212.555.0100@ims.example.com;user=phone>, <tel:+1-212-555-0100>`}}},
			wantKey: "+12125550100", wantOK: true,
		},
		{
			name:    "originating without P-Asserted-Identity falls back to From user",
			req:     dcrtest.Request{Headers: [][2]string{orig}, From: `"Alice" <sip:alice@example.com>`},
			wantKey: "alice", wantOK: true,
		},
		{
			name: "originating marked on the topmost Route (ISC orig parameter)",
			req: dcrtest.Request{Headers: [][2]string{
				{"Route", "<sip:as.example.com;lr;orig>"},
				{"P-Asserted-Identity", "<sip:carol@example.com>"}}},
			wantKey: "carol", wantOK: true,
		},
		{
			name:    "terminating keys on the Request-URI user",
			req:     dcrtest.Request{RequestURI: "sip:bob@example.com", Headers: [][2]string{{"P-Asserted-Identity", "<sip:carol@example.com>"}}},
			wantKey: "bob", wantOK: true,
		},
		{
			name: "terminating by P-Served-User sescase=term",
			req: dcrtest.Request{RequestURI: "sip:+44-20-7946-0000@example.com;user=phone",
				Headers: [][2]string{{"P-Served-User", "<sip:bob@example.com>;sescase=term"}}},
			wantKey: "+442079460000", wantOK: true,
		},
		{
			name:   "terminating Request-URI without user gives no key",
			req:    dcrtest.Request{RequestURI: "sip:example.com"},
			wantOK: false,
		},
	}
	for _, tt := range sipTests {
		t.Run("sip/"+tt.name, func(t *testing.T) {
			key, ok := rules.Key(mustSIP(t, tt.req))
			if key != tt.wantKey || ok != tt.wantOK {
				t.Errorf("Key = %q, %v; want %q, %v", key, ok, tt.wantKey, tt.wantOK)
			}
		})
	}
	httpTests := []struct {
		name    string
		uri     string
		headers map[string][]string
		wantKey string
		wantOK  bool
	}{
		{name: "user parameter as SIP URI", uri: "/app/call?user=sip%3Aalice%40example.com", wantKey: "alice", wantOK: true},
		{name: "user parameter as number", uri: "/app/call?x=1&user=%2B1-212-555-0100", wantKey: "+12125550100", wantOK: true},
		{name: "user parameter not a URI falls to X-User", uri: "/app?user=alice",
			headers: map[string][]string{"x-user": {"bob"}}, wantKey: "bob", wantOK: true},
		{name: "X-User header, canonical name", uri: "/app", headers: map[string][]string{"X-User": {"alice"}}, wantKey: "alice", wantOK: true},
		{name: "no rule matches", uri: "/app", headers: map[string][]string{"accept": {"*/*"}}, wantOK: false},
	}
	for _, tt := range httpTests {
		t.Run("http/"+tt.name, func(t *testing.T) {
			key, ok := rules.Key(dcr.NewHTTPMessage("GET", tt.uri, tt.headers, "192.0.2.1:40000"))
			if key != tt.wantKey || ok != tt.wantOK {
				t.Errorf("Key = %q, %v; want %q, %v", key, ok, tt.wantKey, tt.wantOK)
			}
		})
	}
}

// TestConvergedKey shows the point of DCR: an HTTP request and a SIP call of one user yield
// the same key.
func TestConvergedKey(t *testing.T) {
	rules := mustParse(t, dcrtest.ExampleRules)
	sipKey, ok := rules.Key(mustSIP(t, dcrtest.Request{Headers: [][2]string{
		{"P-Served-User", "<sip:alice@example.com>;sescase=orig"},
		{"P-Asserted-Identity", "<tel:+1-212-555-0100>"}}}))
	if !ok {
		t.Fatal("SIP request has no key")
	}
	httpKey, ok := rules.Key(dcr.NewHTTPMessage("POST", "/conf?user=tel%3A%2B1.212.555.0100", nil, "198.51.100.7:5555"))
	if !ok {
		t.Fatal("HTTP request has no key")
	}
	if sipKey != httpKey {
		t.Errorf("SIP key %q != HTTP key %q", sipKey, httpKey)
	}
}

// TestEvaluation covers the evaluation rules: order, or/and/if, markers, match captures and
// every variable family.
func TestEvaluation(t *testing.T) {
	sipMsg := dcrtest.Request{
		RequestURI: "sip:+1-212-555-0199@example.com:5070;user=phone;svc=conf?subject=hi",
		From:       `"Alice Smith" <sips:alice@a.example.com:5061>`,
		FromTag:    "ftag",
		CallID:     "cid-42@host",
		Headers: [][2]string{
			{"X-Account", "acct-7; plan=gold"},
			{"P-Asserted-Identity", `<sip:alice@a.example.com>, <tel:+1-212-555-0100>`},
			{"k", "100rel"},
		},
	}
	tests := []struct {
		name    string
		rule    string
		wantKey string
		wantOK  bool
	}{
		{"first non-null rule wins",
			`<header name="X-None" return="request.X-None"><exist/></header>
			 <header name="X-Account" return="request.X-Account"><exist/></header>
			 <header name="From" return="request.From.uri.user"><exist/></header>`,
			"acct-7; plan=gold", true},
		{"or yields its first non-null operand",
			`<or><header name="X-None"><exist/></header><header name="From" return="request.From.uri.host"><exist/></header><header name="To" return="request.To.uri.user"><exist/></header></or>`,
			"a.example.com", true},
		{"and yields its last operand",
			`<and><header name="X-Account"><exist/></header><header name="To" return="request.To.uri.user"><exist/></header></and>`,
			"bob", true},
		{"and is null when an operand is null",
			`<and><header name="X-None"><exist/></header><header name="To" return="request.To.uri.user"><exist/></header></and>
			 <header name="Call-ID" return="request.Call-ID"><exist/></header>`,
			"cid-42@host", true},
		{"notexist guard inside and",
			`<and><header name="X-None"><notexist/></header><header name="From" return="request.From.tag"><exist/></header></and>`,
			"ftag", true},
		{"top-level marker is not a key; next rule runs",
			`<header name="X-None"><notexist/></header><request-uri return="request.uri.port"><match>.</match></request-uri>`,
			"5070", true},
		{"empty return value is not a key",
			`<header name="To" return="request.To.uri.display-name"><exist/></header>`,
			"", false},
		{"exist without return yields the header value",
			`<header name="Call-ID"><exist/></header>`, "cid-42@host", true},
		{"compact form header name",
			`<header name="Supported" return="request.Supported"><exist/></header>`, "100rel", true},
		{"header names are case-insensitive",
			`<header name="call-id" return="request.CALL-ID"><exist/></header>`, "cid-42@host", true},
		{"match capture group",
			`<header name="X-Account" return="match"><match>acct-([0-9]+)</match></header>`, "7", true},
		{"match without group yields the matched text",
			`<header name="X-Account"><match>plan=[a-z]+</match></header>`, "plan=gold", true},
		{"match that fails is null",
			`<header name="X-Account"><match>^plan</match></header>`, "", false},
		{"request.<header>.match",
			`<header name="P-Asserted-Identity" return="request.P-Asserted-Identity.match.resolve.user"><match>tel:[^>]+</match></header>`,
			"+12125550100", true},
		{"request-uri parameter",
			`<request-uri parameter="svc" return="parameter.svc"><exist/></request-uri>`, "conf", true},
		{"request-uri header parameter",
			`<request-uri parameter="subject" return="parameter.subject"><exist/></request-uri>`, "hi", true},
		{"request-uri notexist",
			`<request-uri parameter="none" return="request.uri.host"><notexist/></request-uri>`, "example.com", true},
		{"request.uri variants",
			`<and><request-uri parameter="svc"><exist/></request-uri><request-uri parameter="svc" return="request.uri.resolve.user"><exist/></request-uri></and>`,
			"+12125550199", true},
		{"request.uri whole", `<request-uri return="request.uri"><match>^sip:</match></request-uri>`,
			"sip:+1-212-555-0199@example.com:5070;user=phone;svc=conf?subject=hi", true},
		{"request.method", `<header name="Via" return="request.method"><exist/></header>`, "INVITE", true},
		{"From URI parts", `<header name="From" return="request.From.uri"><exist/></header>`, "sips:alice@a.example.com:5061", true},
		{"From scheme", `<header name="From" return="request.From.uri.scheme"><exist/></header>`, "sips", true},
		{"From port", `<header name="From" return="request.From.uri.port"><exist/></header>`, "5061", true},
		{"From display name", `<header name="From" return="request.From.uri.display-name"><exist/></header>`, "Alice Smith", true},
		{"resolve of a non-phone URI is the URI", `<header name="From" return="request.From.uri.resolve.host"><exist/></header>`, "a.example.com", true},
		{"session-case without nested rules is a marker only",
			`<session-case><equal>TERMINATING</equal></session-case><header name="Call-ID"><exist/></header>`, "cid-42@host", true},
		{"session-case that does not hold",
			`<session-case><equal>ORIGINATING</equal><header name="Call-ID"><exist/></header></session-case>`, "", false},
		{"cookie never exists in SIP",
			`<cookie name="JSESSIONID"><exist/></cookie>`, "", false},
		{"if alternatives",
			`<if><header name="X-None"><exist/></header><header name="X-Account" return="match"><match>plan=(\w+)</match></header></if>`,
			"gold", true},
	}
	m := mustSIP(t, sipMsg)
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rules := mustParse(t, rulesDoc(tt.rule, ""))
			key, ok := rules.Key(m)
			if key != tt.wantKey || ok != tt.wantOK {
				t.Errorf("Key = %q, %v; want %q, %v", key, ok, tt.wantKey, tt.wantOK)
			}
		})
	}
}

func TestHTTPVariables(t *testing.T) {
	headers := map[string][]string{
		"cookie":     {"theme=dark; JSESSIONID=abc123", "bad cookie pair; sid=tel:+33-1-23"},
		"x-identity": {`"Bob" <sip:bob@b.example.com>;tag=t9`},
	}
	m := dcr.NewHTTPMessage("POST", "/v1/calls?callee=sip%3Acarol%40c.example.com&empty=&n=1&n=2", headers, "[2001:db8::1]:8443")
	tests := []struct {
		name    string
		rule    string
		wantKey string
		wantOK  bool
	}{
		{"cookie value", `<cookie name="JSESSIONID" return="cookie.JSESSIONID"><exist/></cookie>`, "abc123", true},
		{"cookie from a later Cookie header with a bad pair", `<cookie name="sid" return="cookie.sid.uri.resolve.user"><exist/></cookie>`, "+33123", true},
		{"cookie match", `<cookie name="theme"><match>^d(ar)k$</match></cookie>`, "ar", true},
		{"cookie notexist", `<cookie name="nope" return="parameter.n"><notexist/></cookie>`, "1", true},
		{"parameter uri user", `<request-uri parameter="callee" return="parameter.callee.uri.user"><exist/></request-uri>`, "carol", true},
		{"parameter uri host", `<request-uri parameter="callee" return="parameter.callee.uri.host"><exist/></request-uri>`, "c.example.com", true},
		{"empty parameter exists but is no key", `<request-uri parameter="empty" return="parameter.empty"><exist/></request-uri>`, "", false},
		{"header uri parts and tag", `<header name="X-Identity" return="request.X-Identity.tag"><exist/></header>`, "t9", true},
		{"header display name", `<header name="X-Identity" return="request.X-Identity.uri.display-name"><exist/></header>`, "Bob", true},
		{"request-uri match on whole target", `<request-uri return="match"><match>^/v1/(\w+)</match></request-uri>`, "calls", true},
		{"request.uri.user is null for HTTP", `<request-uri return="request.uri.user"><match>.</match></request-uri>`, "", false},
		{"method", `<request-uri return="request.method"><match>.</match></request-uri>`, "POST", true},
		{"session-case never holds for HTTP",
			`<session-case><equal>TERMINATING</equal><cookie name="theme"><exist/></cookie></session-case>`, "", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rules := mustParse(t, rulesDoc("", tt.rule))
			key, ok := rules.Key(m)
			if key != tt.wantKey || ok != tt.wantOK {
				t.Errorf("Key = %q, %v; want %q, %v", key, ok, tt.wantKey, tt.wantOK)
			}
		})
	}
}

func TestKeyNil(t *testing.T) {
	var r *dcr.Rules
	if key, ok := r.Key(dcr.NewHTTPMessage("GET", "/", nil, "")); ok || key != "" {
		t.Errorf("nil Rules: Key = %q, %v", key, ok)
	}
	rules := mustParse(t, dcrtest.ExampleRules)
	if key, ok := rules.Key(nil); ok || key != "" {
		t.Errorf("nil Message: Key = %q, %v", key, ok)
	}
	var sm *dcr.SIPMessage
	if got := dcr.DefaultSIPKey(sm); got != "" {
		t.Errorf("DefaultSIPKey(nil) = %q", got)
	}
}

func TestProtocolSeparation(t *testing.T) {
	// A file with only SIP rules gives no key for HTTP, and vice versa.
	rules := mustParse(t, `<user-centric-rules><sip-rules><header name="Call-ID"><exist/></header></sip-rules></user-centric-rules>`)
	if _, ok := rules.Key(dcr.NewHTTPMessage("GET", "/", map[string][]string{"call-id": {"x"}}, "")); ok {
		t.Error("SIP rules applied to HTTP")
	}
	if key, ok := rules.Key(mustSIP(t, dcrtest.Request{CallID: "c1"})); !ok || key != "c1" {
		t.Errorf("Key = %q, %v; want c1", key, ok)
	}
	if rules.HasHTTP() {
		t.Error("HasHTTP = true")
	}
}
