// Package dcrtest holds fixtures for tests of DCR key extraction and SIP decisions: a builder
// of raw SIP requests and the documented example rules file.
package dcrtest

import (
	"fmt"
	"strings"
)

// Request describes a SIP request for SIP to render. Zero fields get defaults; Headers are
// written after the standard ones, in order, as "Name: value".
type Request struct {
	Method     string // default INVITE
	RequestURI string // default sip:bob@example.com
	From       string // default "Alice" <sip:alice@example.com>
	FromTag    string // default "tag-1"; "-" for none
	To         string // default <sip:bob@example.com>
	ToTag      string // default none
	CallID     string // default "call-1@example.com"
	CSeq       int    // default 1
	Headers    [][2]string
	Body       string
}

// SIP renders r as a raw SIP request with CRLF line ends, a Via, Max-Forwards, CSeq and a
// correct Content-Length.
func SIP(r Request) []byte {
	def := func(v, d string) string {
		if v == "" {
			return d
		}
		return v
	}
	method := def(r.Method, "INVITE")
	var b strings.Builder
	fmt.Fprintf(&b, "%s %s SIP/2.0\r\n", method, def(r.RequestURI, "sip:bob@example.com"))
	b.WriteString("Via: SIP/2.0/UDP 192.0.2.10:5060;branch=z9hG4bK-test-1\r\n")
	b.WriteString("Max-Forwards: 70\r\n")
	from := def(r.From, `"Alice" <sip:alice@example.com>`)
	switch tag := def(r.FromTag, "tag-1"); tag {
	case "-":
		fmt.Fprintf(&b, "From: %s\r\n", from)
	default:
		fmt.Fprintf(&b, "From: %s;tag=%s\r\n", from, tag)
	}
	to := def(r.To, "<sip:bob@example.com>")
	if r.ToTag != "" {
		to += ";tag=" + r.ToTag
	}
	fmt.Fprintf(&b, "To: %s\r\n", to)
	fmt.Fprintf(&b, "Call-ID: %s\r\n", def(r.CallID, "call-1@example.com"))
	cseq := r.CSeq
	if cseq == 0 {
		cseq = 1
	}
	fmt.Fprintf(&b, "CSeq: %d %s\r\n", cseq, method)
	for _, h := range r.Headers {
		fmt.Fprintf(&b, "%s: %s\r\n", h[0], h[1])
	}
	fmt.Fprintf(&b, "Content-Length: %d\r\n\r\n%s", len(r.Body), r.Body)
	return []byte(b.String())
}

// ExampleRules is the documented DCR example completed: for an ORIGINATING session case the
// resolved user of P-Asserted-Identity if present, else of From; for a TERMINATING one the
// resolved user of the Request-URI. Its HTTP block keys on the "user" query parameter or the
// X-User header, so that one user's SIP and HTTP traffic share a key.
const ExampleRules = `<?xml version="1.0" encoding="ISO-8859-1"?>
<!DOCTYPE user-centric-rules PUBLIC "-//Sun Microsystems Inc.//DTD Sailfin 1.0//EN"
  "http://www.sun.com/software/appserver/dtds/sun-data-centric-rule_1_0.dtd">
<user-centric-rules>
  <sip-rules>
    <if>
      <session-case>
        <equal>ORIGINATING</equal>
        <if>
          <header name="P-Asserted-Identity" return="request.P-Asserted-Identity.uri.resolve.user">
            <exist/>
          </header>
          <header name="From" return="request.From.uri.resolve.user">
            <exist/>
          </header>
        </if>
      </session-case>
      <session-case>
        <equal>TERMINATING</equal>
        <request-uri return="request.uri.resolve.user">
          <match>^sips?:|^tel:</match>
        </request-uri>
      </session-case>
    </if>
  </sip-rules>
  <http-rules>
    <or>
      <request-uri parameter="user" return="parameter.user.uri.resolve.user"><exist/></request-uri>
      <header name="X-User" return="request.X-User"><exist/></header>
    </or>
  </http-rules>
</user-centric-rules>
`
