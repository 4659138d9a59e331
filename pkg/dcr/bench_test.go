package dcr_test

import (
	"testing"

	"github.com/tether-dev/tether/pkg/dcr"
	"github.com/tether-dev/tether/pkg/dcr/dcrtest"
)

// benchInvite is a realistic initial INVITE with an SDP body (≈ 900 bytes).
func benchInvite() []byte {
	return dcrtest.SIP(dcrtest.Request{
		RequestURI: "sip:bob@biloxi.example.com",
		From:       `"Alice" <sip:alice@atlanta.example.com>`,
		FromTag:    "9fxced76sl",
		CallID:     "3848276298220188511@atlanta.example.com",
		Headers: [][2]string{
			{"Contact", "<sip:alice@client.atlanta.example.com;transport=udp>"},
			{"P-Served-User", "<sip:alice@atlanta.example.com>;sescase=orig"},
			{"P-Asserted-Identity", `"Alice" <sip:+1.212.555.0100@atlanta.example.com;user=phone>`},
			{"Allow", "INVITE, ACK, CANCEL, OPTIONS, BYE"},
			{"Supported", "replaces, timer"},
			{"User-Agent", "bench/1.0"},
			{"Content-Type", "application/sdp"},
		},
		Body: "v=0\r\no=alice 2890844526 2890844526 IN IP4 client.atlanta.example.com\r\ns=-\r\n" +
			"c=IN IP4 192.0.2.101\r\nt=0 0\r\nm=audio 49172 RTP/AVP 0\r\na=rtpmap:0 PCMU/8000\r\n",
	})
}

// BenchmarkSIPParse is the baseline: sipgo's parser alone.
func BenchmarkSIPParse(b *testing.B) {
	raw := benchInvite()
	b.SetBytes(int64(len(raw)))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := dcr.ParseSIP(raw); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkSIPKeyDefault: parse + DefaultSIPKey (pure SIP service without DCR).
func BenchmarkSIPKeyDefault(b *testing.B) {
	raw := benchInvite()
	b.ReportAllocs()
	for b.Loop() {
		m, err := dcr.ParseSIP(raw)
		if err != nil {
			b.Fatal(err)
		}
		if dcr.DefaultSIPKey(m) == "" {
			b.Fatal("no key")
		}
	}
}

// BenchmarkSIPKeyDCR: parse + the documented example rules (originating, P-Asserted-Identity
// resolved).
func BenchmarkSIPKeyDCR(b *testing.B) {
	raw := benchInvite()
	rules := mustParse(b, dcrtest.ExampleRules)
	b.ReportAllocs()
	for b.Loop() {
		m, err := dcr.ParseSIP(raw)
		if err != nil {
			b.Fatal(err)
		}
		if k, ok := rules.Key(m); !ok || k != "+12125550100" {
			b.Fatalf("key %q %v", k, ok)
		}
	}
}

// BenchmarkHTTPKeyDCR: key of an HTTP request through the example rules' parameter rule.
func BenchmarkHTTPKeyDCR(b *testing.B) {
	rules := mustParse(b, dcrtest.ExampleRules)
	headers := map[string][]string{
		"user-agent": {"bench"}, "accept": {"*/*"}, "cookie": {"a=b; c=d"},
	}
	b.ReportAllocs()
	for b.Loop() {
		m := dcr.NewHTTPMessage("GET", "/app/call?user=sip%3Aalice%40example.com&x=1", headers, "192.0.2.1:40000")
		if k, ok := rules.Key(m); !ok || k != "alice" {
			b.Fatalf("key %q %v", k, ok)
		}
	}
}

// BenchmarkHTTPKeyDefault: no rule matches, DefaultHTTPKey.
func BenchmarkHTTPKeyDefault(b *testing.B) {
	rules := mustParse(b, dcrtest.ExampleRules)
	headers := map[string][]string{"user-agent": {"bench"}}
	b.ReportAllocs()
	for b.Loop() {
		m := dcr.NewHTTPMessage("GET", "/app", headers, "192.0.2.1:40000")
		if _, ok := rules.Key(m); ok {
			b.Fatal("unexpected key")
		}
		if dcr.DefaultHTTPKey(m) == "" {
			b.Fatal("no key")
		}
	}
}

// BenchmarkSIPParseFull is sipgo's whole parser, the path ParseSIP falls back to.
func BenchmarkSIPParseFull(b *testing.B) {
	raw := benchInvite()
	b.ReportAllocs()
	for b.Loop() {
		if _, err := dcr.ParseSIPFull(raw); err != nil {
			b.Fatal(err)
		}
	}
}
