package dcr_test

import (
	"errors"
	"testing"

	"github.com/tether-dev/tether/pkg/dcr"
	"github.com/tether-dev/tether/pkg/dcr/dcrtest"
)

func TestParseSIP(t *testing.T) {
	raw := "INVITE sip:bob@example.com;transport=udp SIP/2.0\r\n" +
		"v: SIP/2.0/UDP 192.0.2.1;branch=z9hG4bK1\r\n" +
		"f: \"A\" <sip:alice@example.com>;tag=abc\r\n" +
		"t: <sip:bob@example.com>;tag=xyz\r\n" +
		"i: compact-cid@host\r\n" +
		"CSeq: 1 INVITE\r\n" +
		"k: timer\r\n" +
		"P-Asserted-Identity: <sip:alice@example.com>\r\n" +
		"l: 0\r\n\r\n"
	m, err := dcr.ParseSIP([]byte(raw))
	if err != nil {
		t.Fatalf("ParseSIP: %v", err)
	}
	checks := []struct{ name, got, want string }{
		{"Method", m.Method(), "INVITE"},
		{"RequestURI", m.RequestURI(), "sip:bob@example.com;transport=udp"},
		{"CallID", m.CallID(), "compact-cid@host"},
		{"FromTag", m.FromTag(), "abc"},
		{"ToTag", m.ToTag(), "xyz"},
		{"Protocol", string(m.Protocol()), "sip"},
		{"SessionCase", string(m.SessionCase()), "TERMINATING"},
	}
	for _, c := range checks {
		if c.got != c.want {
			t.Errorf("%s = %q, want %q", c.name, c.got, c.want)
		}
	}
	for _, name := range []string{"From", "from", "f", "Call-ID", "i", "Supported", "k", "p-asserted-identity"} {
		if _, ok := m.Header(name); !ok {
			t.Errorf("Header(%q) missing", name)
		}
	}
	if _, ok := m.Header("X-Missing"); ok {
		t.Error("Header(X-Missing) present")
	}
	if v, ok := m.Param("transport"); !ok || v != "udp" {
		t.Errorf("Param(transport) = %q, %v", v, ok)
	}
	if _, ok := m.Cookie("x"); ok {
		t.Error("SIP message has a cookie")
	}
}

func TestParseSIPErrors(t *testing.T) {
	tests := []struct {
		name    string
		raw     string
		wantErr error // nil: any error
	}{
		{"response", "SIP/2.0 200 OK\r\nCall-ID: x\r\nContent-Length: 0\r\n\r\n", dcr.ErrNotRequest},
		{"empty", "", nil},
		{"garbage", "hello world\r\n\r\n", nil},
		{"bad header", "INVITE sip:a@b SIP/2.0\r\nnocolon\r\n\r\n", nil},
		{"bare LF line ends", "INVITE sip:a@b SIP/2.0\nCall-ID: x\n\n", nil},
		{"truncated body", "INVITE sip:a@b SIP/2.0\r\nContent-Length: 10\r\n\r\nabc", nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m, err := dcr.ParseSIP([]byte(tt.raw))
			if err == nil {
				t.Fatalf("ParseSIP = %v, want error", m)
			}
			if tt.wantErr != nil && !errors.Is(err, tt.wantErr) {
				t.Errorf("err = %v, want %v", err, tt.wantErr)
			}
		})
	}
}

// TestKeyTable is the table of HTTP and SIP messages with the key a converged service uses:
// the DCR key when a rule matches, else the protocol default.
func TestKeyTable(t *testing.T) {
	rules := mustParse(t, dcrtest.ExampleRules)
	keyOf := func(m dcr.Message) string {
		if k, ok := rules.Key(m); ok {
			return k
		}
		switch m := m.(type) {
		case *dcr.SIPMessage:
			return dcr.DefaultSIPKey(m)
		case *dcr.HTTPMessage:
			return dcr.DefaultHTTPKey(m)
		}
		return ""
	}
	orig := [2]string{"P-Served-User", "<sip:alice@example.com>;sescase=orig"}
	tests := []struct {
		name string
		msg  func(t *testing.T) dcr.Message
		want string
	}{
		{"SIP originating PAI", func(t *testing.T) dcr.Message {
			return mustSIP(t, dcrtest.Request{Headers: [][2]string{orig, {"P-Asserted-Identity", "<sip:alice@example.com>"}}})
		}, "alice"},
		{"SIP originating From", func(t *testing.T) dcr.Message {
			return mustSIP(t, dcrtest.Request{From: "<sip:dave@example.com>", Headers: [][2]string{orig}})
		}, "dave"},
		{"SIP terminating R-URI number", func(t *testing.T) dcr.Message {
			return mustSIP(t, dcrtest.Request{RequestURI: "tel:+1-650-555-0111"})
		}, "+16505550111"},
		{"SIP no rule: from-tag and call-id", func(t *testing.T) dcr.Message {
			return mustSIP(t, dcrtest.Request{RequestURI: "sip:conference.example.com", FromTag: "9fxced76sl", CallID: "3848276298220188511@atlanta.example.com"})
		}, "9fxced76sl:3848276298220188511@atlanta.example.com"},
		{"SIP no rule, no from-tag", func(t *testing.T) dcr.Message {
			return mustSIP(t, dcrtest.Request{RequestURI: "sip:example.com", FromTag: "-", CallID: "c7"})
		}, ":c7"},
		{"HTTP user parameter", func(t *testing.T) dcr.Message {
			return dcr.NewHTTPMessage("GET", "/x?user=sip:alice@example.com", nil, "192.0.2.1:1000")
		}, "alice"},
		{"HTTP X-User", func(t *testing.T) dcr.Message {
			return dcr.NewHTTPMessage("GET", "/x", map[string][]string{"x-user": {"dave"}}, "192.0.2.1:1000")
		}, "dave"},
		{"HTTP no rule: remote host and port", func(t *testing.T) dcr.Message {
			return dcr.NewHTTPMessage("GET", "/x", nil, "192.0.2.1:1000")
		}, "192.0.2.1:1000"},
		{"HTTP no rule, IPv6 peer", func(t *testing.T) dcr.Message {
			return dcr.NewHTTPMessage("GET", "/x", nil, "[2001:db8::7]:443")
		}, "[2001:db8::7]:443"},
		{"HTTP no rule, peer without port", func(t *testing.T) dcr.Message {
			return dcr.NewHTTPMessage("GET", "/x", nil, "unix-socket")
		}, "unix-socket"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := keyOf(tt.msg(t)); got != tt.want {
				t.Errorf("key = %q, want %q", got, tt.want)
			}
		})
	}
}

func TestHTTPMessageHeaders(t *testing.T) {
	for _, headers := range []map[string][]string{
		{"x-user": {"a"}},
		{"X-User": {"a"}},
		{"X-USER": {"a"}},
	} {
		m := dcr.NewHTTPMessage("GET", "/", headers, "")
		if v, ok := m.Header("X-User"); !ok || v != "a" {
			t.Errorf("headers %v: Header(X-User) = %q, %v", headers, v, ok)
		}
	}
	m := dcr.NewHTTPMessage("GET", "/p?a=1&a=2&b=%zz&c=3#frag", map[string][]string{"x-empty": {}}, "")
	if _, ok := m.Header("x-empty"); ok {
		t.Error("header with no values is present")
	}
	if v, ok := m.Param("a"); !ok || v != "1" {
		t.Errorf("Param(a) = %q, %v; want first value", v, ok)
	}
	if v, ok := m.Param("c"); !ok || v != "3" {
		t.Errorf("Param(c) = %q, %v; want 3 despite a malformed pair", v, ok)
	}
	if _, ok := m.Param("frag"); ok {
		t.Error("fragment parsed as parameter")
	}
	if m.SessionCase() != "" || m.Protocol() != dcr.ProtocolHTTP {
		t.Errorf("SessionCase = %q, Protocol = %q", m.SessionCase(), m.Protocol())
	}
}
