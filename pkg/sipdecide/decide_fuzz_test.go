package sipdecide_test

import (
	"net/http"
	"net/url"
	"strings"
	"testing"

	"github.com/tether-dev/tether/pkg/affinity/affinitytest"
	"github.com/tether-dev/tether/pkg/sipdecide"
	"github.com/tether-dev/tether/pkg/wire"
)

// FuzzDecideRaw posts arbitrary bytes as a raw SIP request to the decision endpoint over a
// real engine (hash affinity, the example DCR rules). Every answer is 200, 400 or 413 —
// never 500 — and a 200 is deterministic: the same message gets the same instance again.
// Seeds: the RFC 4475 torture messages (testdata/rfc4475) and testdata/fuzz.
func FuzzDecideRaw(f *testing.F) {
	for _, msg := range rfc4475(f) {
		f.Add(msg)
	}
	f.Add([]byte(""))
	f.Add([]byte("INVITE sip:bob@example.com SIP/2.0\r\nVia: SIP/2.0/UDP 127.0.0.1;branch=z9hG4bK1\r\n" +
		"From: <sip:alice@example.com>;tag=1\r\nTo: <sip:bob@example.com>\r\nCall-ID: c1\r\nCSeq: 1 INVITE\r\n" +
		"P-Asserted-Identity: <tel:+15551234>\r\nContent-Length: 0\r\n\r\n"))
	h := sipdecide.NewHandler(hashFixture(f, affinitytest.Instances("voice", 4)).Engine)
	f.Fuzz(func(t *testing.T, msg []byte) {
		first := post(t, h, "/v1/sip/voice/decide", string(msg), nil)
		switch first.Code {
		case http.StatusOK, http.StatusBadRequest, http.StatusRequestEntityTooLarge:
		default:
			t.Fatalf("status %d: %s", first.Code, first.Body.String())
		}
		if first.Code != http.StatusOK {
			return
		}
		again := post(t, h, "/v1/sip/voice/decide", string(msg), nil)
		if a, b := first.Header().Get(wire.SIPInstanceHeader), again.Header().Get(wire.SIPInstanceHeader); again.Code != http.StatusOK || a == "" || a != b {
			t.Fatalf("not deterministic: %s then %d %s", a, again.Code, b)
		}
	})
}

// FuzzDecideFields drives the selected-fields form (an empty body, the fields in the query)
// with arbitrary values: 200 or 400, never 500, deterministic.
func FuzzDecideFields(f *testing.F) {
	f.Add("INVITE", "sip:bob@example.com", "<sip:alice@example.com>;tag=1", "<sip:bob@example.com>", "c1", "<tel:+1555>", "")
	f.Add("REGISTER", "sip:example.com", "sip:null-%00-null@example.com", "", "x", "", "<sip:a@b>;sescase=orig")
	f.Add("", "", "", "", "", "", "")
	h := sipdecide.NewHandler(hashFixture(f, affinitytest.Instances("voice", 3)).Engine)
	f.Fuzz(func(t *testing.T, method, ruri, from, to, callid, pai, psu string) {
		q := url.Values{"method": {method}, "ruri": {ruri}, "from": {from}, "to": {to}, "callid": {callid}}
		if pai != "" {
			q.Set("pai", pai)
		}
		if psu != "" {
			q.Set("psu", psu)
		}
		target := "/v1/sip/voice/decide?" + q.Encode()
		first := post(t, h, target, "", nil)
		if first.Code != http.StatusOK && first.Code != http.StatusBadRequest {
			t.Fatalf("status %d: %s", first.Code, strings.TrimSpace(first.Body.String()))
		}
		if first.Code == http.StatusOK {
			again := post(t, h, target, "", nil)
			if again.Header().Get(wire.SIPInstanceHeader) != first.Header().Get(wire.SIPInstanceHeader) {
				t.Fatal("the same fields chose another instance")
			}
		}
	})
}
