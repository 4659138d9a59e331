package dcr

import (
	"bytes"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"slices"
	"strings"

	"github.com/emiago/sipgo/sip"
)

// Protocol names the protocol of a Message.
type Protocol string

// Protocols a Message can carry.
const (
	ProtocolSIP  Protocol = "sip"
	ProtocolHTTP Protocol = "http"
)

// SessionCase is the IMS session case of a SIP request (3GPP TS 24.229): whether the request
// is handled on behalf of its originating or its terminating user.
type SessionCase string

// Session cases; the values are the exact contents of a DCR <equal> element.
const (
	SessionCaseOriginating SessionCase = "ORIGINATING"
	SessionCaseTerminating SessionCase = "TERMINATING"
)

// ErrNotRequest is returned by ParseSIP for a well-formed SIP response: only requests carry a
// key.
var ErrNotRequest = errors.New("dcr: SIP message is a response, not a request")

// Message is a protocol-neutral, read-only view of one request, the input of Rules.Key. The
// only implementations are *SIPMessage and *HTTPMessage (the interface is sealed).
//
// A Message is meant for the one goroutine handling the request: HTTPMessage caches its
// parsed query string and cookies lazily and must not be used concurrently.
type Message interface {
	// Protocol reports which rule set (sip-rules or http-rules) applies.
	Protocol() Protocol
	// Method is the request method (INVITE, GET, …).
	Method() string
	// RequestURI is the request URI as received: the SIP Request-URI, or the HTTP
	// path-and-query (or absolute form) of the request line.
	RequestURI() string
	// Header returns the value of the first header called name (case-insensitive; SIP compact
	// forms such as "f" for From are understood) and whether it is present.
	Header(name string) (string, bool)
	// Cookie returns the value of the first cookie called name (case-sensitive) and whether it
	// is present. SIP messages have no cookies.
	Cookie(name string) (string, bool)
	// Param returns a request-URI parameter: a SIP URI parameter (";name=value", then a URI
	// header "?name=value"), or an HTTP query parameter (URL-decoded). A parameter without a
	// value is present with value "".
	Param(name string) (string, bool)
	// SessionCase is the SIP request's IMS session case, "" for HTTP.
	SessionCase() SessionCase

	// uri returns the parsed request URI and whether it has one (SIP only).
	requestURIParts() (uriParts, bool)
}

// SIPMessage is a parsed SIP request. It is immutable after ParseSIP and safe for concurrent
// use by readers.
type SIPMessage struct {
	// Exactly one of req (the full parse, NewSIPMessage) and scan (the fast path, scanSIP) is
	// set.
	req  *sip.Request
	scan *scanned
	// rawURI is the Request-URI exactly as written in the request line.
	rawURI string
	sc     SessionCase
	// pooled is the allocation a fast-path message lives in, nil once released.
	pooled *scannedMessage
}

// Release hands the message's memory back for reuse by later parses: m must not be used
// afterwards by any goroutine, Release included; the strings it returned stay valid (they are
// never overwritten). Calling Release is optional (an unreleased message is garbage
// collected); for a message of the full parser or NewSIPMessage it does nothing.
func (m *SIPMessage) Release() {
	if m == nil || m.pooled == nil {
		return
	}
	p := m.pooled
	m.pooled = nil
	p.release()
}

// ParseSIP parses one complete SIP request (start line, headers, blank line and optional body)
// with github.com/emiago/sipgo's parser. A SIP response yields ErrNotRequest; any malformed
// input yields an error, never a panic. raw is not retained.
//
// A fast path (scanSIP) handles the common request itself and agrees with the full parse:
// the same messages are accepted and every method answers the same.
func ParseSIP(raw []byte) (m *SIPMessage, err error) {
	if m, ok := scanSIP(raw); ok {
		return m, nil
	}
	return parseSIPFull(raw)
}

// parseSIPFull is ParseSIP through sipgo's whole parser.
func parseSIPFull(raw []byte) (m *SIPMessage, err error) {
	defer func() {
		// The parser is third-party code fed with untrusted bytes: a panic in it must not take
		// the decision endpoint down.
		if r := recover(); r != nil {
			m, err = nil, fmt.Errorf("dcr: SIP parser failure: %v", r)
		}
	}()
	msg, err := sip.ParseMessage(raw)
	if err != nil {
		return nil, fmt.Errorf("dcr: parse SIP message: %w", err)
	}
	req, ok := msg.(*sip.Request)
	if !ok {
		return nil, ErrNotRequest
	}
	m = &SIPMessage{req: req, rawURI: requestLineURI(raw)}
	m.sc = sipSessionCase(m)
	return m, nil
}

// NewSIPMessage builds a SIP request from its parts, as a proxy hands them over (Kamailio's
// selected fields): the method, the Request-URI and headers by name (any case, compact forms
// included). The URI and each header value go through the same parsers ParseSIP uses (From,
// To, Call-ID and the other typed headers are typed), so every Message method answers as it
// would for the whole request, without writing a message out and parsing it again. Header
// names are applied in sorted order, values in order. Malformed parts yield an error, never a
// panic. The arguments are not retained.
func NewSIPMessage(method, requestURI string, headers map[string][]string) (m *SIPMessage, err error) {
	defer func() {
		if r := recover(); r != nil {
			m, err = nil, fmt.Errorf("dcr: SIP parser failure: %v", r)
		}
	}()
	if !isToken(method) {
		return nil, fmt.Errorf("dcr: SIP method %q is not a token", method)
	}
	var u sip.Uri
	if err := sip.ParseUri(requestURI, &u); err != nil {
		return nil, fmt.Errorf("dcr: parse Request-URI %q: %w", requestURI, err)
	}
	req := sip.NewRequest(sip.RequestMethod(method), u)
	parsers := sip.HeadersParser(sip.DefaultHeadersParser())
	names := make([]string, 0, len(headers))
	for name := range headers {
		names = append(names, name)
	}
	slices.Sort(names)
	var hs []sip.Header
	for _, name := range names {
		if !isToken(name) {
			return nil, fmt.Errorf("dcr: SIP header name %q is not a token", name)
		}
		for _, v := range headers[name] {
			if strings.ContainsAny(v, "\r\n") {
				return nil, fmt.Errorf("dcr: SIP header %s: a value may not span lines", name)
			}
			if hs, err = parsers.ParseHeader(hs[:0], []byte(name+": "+v)); err != nil {
				return nil, fmt.Errorf("dcr: parse SIP header %s: %w", name, err)
			}
			for _, h := range hs {
				req.AppendHeader(h)
			}
		}
	}
	m = &SIPMessage{req: req, rawURI: requestURI}
	m.sc = sipSessionCase(m)
	return m, nil
}

// sipTokenPunct are the characters other than letters and digits of an RFC 3261 token.
const sipTokenPunct = "-.!%*_+`'~"

// isToken reports whether s is a non-empty RFC 3261 token.
func isToken(s string) bool { return tokenOf(s, sipTokenPunct) }

// tokenOf reports whether s is non-empty and each of its bytes is an ASCII letter, a digit or
// one of punct.
func tokenOf[T ~string | ~[]byte](s T, punct string) bool {
	if len(s) == 0 {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9':
		case strings.IndexByte(punct, c) >= 0:
		default:
			return false
		}
	}
	return true
}

// CheckSIPRequest parses raw as ParseSIP does and also holds it to what RFC 3261 §8.1.1
// requires of every request on the wire (see ParseSIPRequest); it returns the error
// ParseSIPRequest would.
func CheckSIPRequest(raw []byte) error {
	_, err := ParseSIPRequest(raw)
	return err
}

// ParseSIPRequest parses raw as ParseSIP does and also holds it to what RFC 3261 §8.1.1
// requires of every request on the wire: version SIP/2.0, the To, From, Call-ID, CSeq and
// Via header fields, a CSeq method equal to the request's, and no headers in the Request-URI
// (RFC 4475 §3.1.2 lists each violation as a message to reject; the parser itself is lenient
// about all of them). It returns the parsed message, so a caller that checks a request and
// then extracts its key parses it once. The decision endpoint applies it to the raw requests
// a proxy relays; requests rebuilt from selected fields carry only what routing needs and are
// not held to it. raw is not retained.
func ParseSIPRequest(raw []byte) (*SIPMessage, error) {
	m, err := ParseSIP(raw)
	if err != nil {
		return nil, err
	}
	if err := checkRequest(m); err != nil {
		return nil, err
	}
	return m, nil
}

// checkRequest holds a parsed raw request to RFC 3261 §8.1.1 (see ParseSIPRequest).
func checkRequest(m *SIPMessage) error {
	var (
		version    = "SIP/2.0" // the fast path takes no other
		present    [5]bool     // To, From, Call-ID, CSeq, Via
		cseqMethod string
	)
	if req := m.req; req != nil {
		version = req.SipVersion
		present = [5]bool{req.To() != nil, req.From() != nil, req.CallID() != nil, req.CSeq() != nil, req.Via() != nil}
		if c := req.CSeq(); c != nil {
			cseqMethod = string(c.MethodName)
		}
	} else {
		s := m.scan
		for i, k := range [5]hkind{hTo, hFrom, hCallID, hCSeq, hVia} {
			present[i] = s.first(k) != nil
		}
		if l := s.last(hCSeq); l != nil {
			cseqMethod, _ = parseCSeq(s.value(l))
		}
	}
	var missing []string
	for i, name := range [5]string{"To", "From", "Call-ID", "CSeq", "Via"} {
		if !present[i] {
			missing = append(missing, name)
		}
	}
	switch {
	case version != "SIP/2.0":
		return fmt.Errorf("dcr: parse SIP message: version %q is not SIP/2.0", version)
	case len(missing) > 0:
		return fmt.Errorf("dcr: parse SIP message: missing %s", strings.Join(missing, ", "))
	case !strings.EqualFold(cseqMethod, m.Method()):
		return fmt.Errorf("dcr: parse SIP message: CSeq method %q differs from the request method %q", cseqMethod, m.Method())
	}
	// RFC 3261 §19.1.1: a Request-URI carries no headers ("?" after the host part; userinfo
	// may hold a "?").
	uri := m.rawURI
	if i := strings.LastIndexByte(uri, '@'); i >= 0 {
		uri = uri[i+1:]
	}
	if strings.Contains(uri, "?") {
		return fmt.Errorf("dcr: parse SIP message: the Request-URI %q carries headers", m.rawURI)
	}
	return nil
}

// requestLineURI returns the second field of the request line. The parser accepted the line,
// so it has exactly the form "METHOD SP Request-URI SP SIP-Version".
func requestLineURI(raw []byte) string {
	line := raw
	if i := bytes.IndexByte(raw, '\r'); i >= 0 {
		line = raw[:i]
	}
	s := string(line)
	_, rest, ok := strings.Cut(s, " ")
	if !ok {
		return ""
	}
	uri, _, _ := strings.Cut(rest, " ")
	return uri
}

// Protocol implements Message.
func (m *SIPMessage) Protocol() Protocol { return ProtocolSIP }

// Method implements Message.
func (m *SIPMessage) Method() string {
	if m.scan != nil {
		return m.scan.method
	}
	return string(m.req.Method)
}

// RequestURI implements Message.
func (m *SIPMessage) RequestURI() string { return m.rawURI }

// Header implements Message. Multi-valued headers written on one line (e.g.
// "P-Asserted-Identity: <sip:a@x>, <tel:+1>") are returned whole; URI variables use the first
// element.
func (m *SIPMessage) Header(name string) (string, bool) {
	if v, ok := m.header(name); ok {
		return v, true
	}
	// sipgo expands the compact forms it parses (f, t, i, m, v, l, c, …) to their long names;
	// other headers keep the name they were written with, so try the other form too.
	if alt, ok := sipCompactForm(name); ok {
		return m.header(alt)
	}
	return "", false
}

// header looks name up among the typed headers and the text headers (the two sets never
// share a name).
func (m *SIPMessage) header(name string) (string, bool) {
	if m.scan != nil {
		return m.scan.header(name)
	}
	if h := m.req.GetHeader(name); h != nil {
		return h.Value(), true
	}
	return "", false
}

// Cookie implements Message: SIP requests carry no cookies.
func (m *SIPMessage) Cookie(string) (string, bool) { return "", false }

// Param implements Message.
func (m *SIPMessage) Param(name string) (string, bool) {
	u := m.uri()
	if v, ok := u.UriParams.Get(name); ok {
		return v, true
	}
	return u.Headers.Get(name)
}

// uri is the parsed Request-URI.
func (m *SIPMessage) uri() *sip.Uri {
	if m.scan != nil {
		return &m.scan.ruri
	}
	return &m.req.Recipient
}

// SessionCase implements Message.
func (m *SIPMessage) SessionCase() SessionCase { return m.sc }

func (m *SIPMessage) requestURIParts() (uriParts, bool) {
	return partsFromURI(m.uri()), true
}

// CallID returns the Call-ID header value, "" when absent.
func (m *SIPMessage) CallID() string {
	if s := m.scan; s != nil {
		if l := s.last(hCallID); l != nil {
			return s.value(l)
		}
		return ""
	}
	if c := m.req.CallID(); c != nil {
		return c.Value()
	}
	return ""
}

// FromTag returns the tag parameter of the From header, "" when absent.
func (m *SIPMessage) FromTag() string {
	if m.scan != nil {
		return m.scan.tag(hFrom)
	}
	if f := m.req.From(); f != nil {
		v, _ := f.Params.Get("tag")
		return v
	}
	return ""
}

// ToTag returns the tag parameter of the To header, "" when absent (an initial request).
func (m *SIPMessage) ToTag() string {
	if m.scan != nil {
		return m.scan.tag(hTo)
	}
	if t := m.req.To(); t != nil {
		v, _ := t.Params.Get("tag")
		return v
	}
	return ""
}

// sipSessionCase derives the IMS session case: P-Served-User's sescase parameter (RFC 5502)
// wins; otherwise an "orig" parameter on the topmost Route URI (the S-CSCF's ISC marking)
// means ORIGINATING; everything else is TERMINATING, as an application server treats a request
// without an originating mark.
func sipSessionCase(m *SIPMessage) SessionCase {
	if v, ok := m.Header("P-Served-User"); ok && m.scan != nil {
		// The fast path reads the parameter without building the address (scan.go).
		if _, valid := validNameAddr(firstElement(v)); valid {
			if sc, _ := headerParam(nameAddrParams(firstElement(v)), "sescase"); asciiEqualFold(sc, "orig") {
				return SessionCaseOriginating
			} else if asciiEqualFold(sc, "term") {
				return SessionCaseTerminating
			}
		}
	} else if ok {
		var u sip.Uri
		var p sip.HeaderParams
		if _, err := sip.ParseAddressValue(firstElement(v), &u, &p); err == nil {
			switch sc, _ := p.Get("sescase"); strings.ToLower(sc) {
			case "orig":
				return SessionCaseOriginating
			case "term":
				return SessionCaseTerminating
			}
		}
	}
	if m.scan != nil {
		if m.scan.routeOrig() {
			return SessionCaseOriginating
		}
	} else if r := m.req.Route(); r != nil && r.Address.UriParams.Has("orig") {
		return SessionCaseOriginating
	}
	return SessionCaseTerminating
}

// sipCompactForms pairs each compact SIP header name with its long form (RFC 3261 §7.3.3 and the
// extensions registered with IANA).
var sipCompactForms = [...]struct{ compact, long string }{
	{"a", "Accept-Contact"},
	{"b", "Referred-By"},
	{"c", "Content-Type"},
	{"e", "Content-Encoding"},
	{"f", "From"},
	{"i", "Call-ID"},
	{"j", "Reject-Contact"},
	{"k", "Supported"},
	{"l", "Content-Length"},
	{"m", "Contact"},
	{"o", "Event"},
	{"r", "Refer-To"},
	{"s", "Subject"},
	{"t", "To"},
	{"u", "Allow-Events"},
	{"v", "Via"},
	{"x", "Session-Expires"},
	{"y", "Identity"},
}

// sipCompactForm maps a SIP header name to its compact form or back, case-insensitively.
func sipCompactForm(name string) (string, bool) {
	lower := strings.ToLower(name)
	for _, f := range sipCompactForms {
		switch {
		case lower == f.compact:
			return f.long, true
		case asciiEqualFold(lower, f.long): // f.long is ASCII: lower == strings.ToLower(f.long)
			return f.compact, true
		}
	}
	return "", false
}

// HTTPMessage is a view of one HTTP request. It parses its query string and cookies lazily and
// must not be used concurrently.
type HTTPMessage struct {
	method  string
	uri     string
	headers map[string][]string
	peer    string

	query       url.Values
	queryParsed bool
	cookies     []*http.Cookie
	cookieDone  bool
}

// NewHTTPMessage returns a view of an HTTP request. uri is the request target (path and query,
// or absolute form); headers may use lower-case (Envoy, affinity.Request) or canonical
// (net/http) names and are not copied: the caller must not modify them while the message is
// in use; peer is the client's "ip:port".
func NewHTTPMessage(method, uri string, headers map[string][]string, peer string) *HTTPMessage {
	return &HTTPMessage{method: method, uri: uri, headers: headers, peer: peer}
}

// Protocol implements Message.
func (m *HTTPMessage) Protocol() Protocol { return ProtocolHTTP }

// Method implements Message.
func (m *HTTPMessage) Method() string { return m.method }

// RequestURI implements Message.
func (m *HTTPMessage) RequestURI() string { return m.uri }

// Peer returns the client's address as given to NewHTTPMessage.
func (m *HTTPMessage) Peer() string { return m.peer }

// Header implements Message.
func (m *HTTPMessage) Header(name string) (string, bool) {
	vs, ok := m.headerValues(name)
	if !ok || len(vs) == 0 {
		return "", false
	}
	return vs[0], true
}

func (m *HTTPMessage) headerValues(name string) ([]string, bool) {
	if vs, ok := m.headers[name]; ok {
		return vs, true
	}
	if vs, ok := m.headers[strings.ToLower(name)]; ok {
		return vs, true
	}
	if vs, ok := m.headers[http.CanonicalHeaderKey(name)]; ok {
		return vs, true
	}
	for k, vs := range m.headers {
		if strings.EqualFold(k, name) {
			return vs, true
		}
	}
	return nil, false
}

// Cookie implements Message. Every Cookie header is considered; malformed pairs are skipped.
func (m *HTTPMessage) Cookie(name string) (string, bool) {
	if !m.cookieDone {
		m.cookieDone = true
		vs, _ := m.headerValues("cookie")
		for _, v := range vs {
			cs, err := http.ParseCookie(v)
			if err != nil {
				// Keep the well-formed pairs of a header with a bad one.
				for _, part := range strings.Split(v, ";") {
					if c, err := http.ParseCookie(strings.TrimSpace(part)); err == nil {
						cs = append(cs, c...)
					}
				}
			}
			m.cookies = append(m.cookies, cs...)
		}
	}
	for _, c := range m.cookies {
		if c.Name == name {
			return c.Value, true
		}
	}
	return "", false
}

// Param implements Message: the first value of the query parameter name.
func (m *HTTPMessage) Param(name string) (string, bool) {
	if !m.queryParsed {
		m.queryParsed = true
		_, q, ok := strings.Cut(m.uri, "?")
		if ok {
			q, _, _ = strings.Cut(q, "#")
			// ParseQuery keeps the well-formed pairs when some are malformed.
			m.query, _ = url.ParseQuery(q)
		}
	}
	vs, ok := m.query[name]
	if !ok || len(vs) == 0 {
		return "", false
	}
	return vs[0], true
}

// SessionCase implements Message: HTTP has none.
func (m *HTTPMessage) SessionCase() SessionCase { return "" }

func (m *HTTPMessage) requestURIParts() (uriParts, bool) { return uriParts{}, false }

// DefaultSIPKey is the key of a SIP request no rule matched: its From tag and Call-ID joined
// by ":" (a tag is a SIP token, which never contains ':', so the join is unambiguous), the
// seed's default "from-tag,call-id". It returns "" when the message has neither.
func DefaultSIPKey(m *SIPMessage) string {
	if m == nil {
		return ""
	}
	tag, cid := m.FromTag(), m.CallID()
	if tag == "" && cid == "" {
		return ""
	}
	return tag + ":" + cid
}

// DefaultHTTPKey is the key of an HTTP request of a converged service no rule matched: the
// request's remote host and port, as "host:port" (IPv6 in brackets). A peer that is not a
// host:port pair is returned as given.
func DefaultHTTPKey(m *HTTPMessage) string {
	if m == nil {
		return ""
	}
	host, port, err := net.SplitHostPort(m.peer)
	if err != nil {
		return m.peer
	}
	return net.JoinHostPort(host, port)
}
