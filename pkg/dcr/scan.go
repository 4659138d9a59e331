package dcr

import (
	"bytes"
	"strconv"
	"strings"
	"sync"

	"github.com/emiago/sipgo/sip"
)

// The fast path of ParseSIP. sipgo's parser builds a typed or generic header object for every
// header line and copies the body; a key needs a handful of headers. scanSIP walks the header
// section once and keeps each line as offsets into one copy of the header section, with no
// allocation per header. It still holds every line to what sipgo accepts, so both paths accept
// the same messages: the typed headers (From, To, Call-ID, CSeq, Via, Contact, …) go through
// validators that mirror sipgo's parsers (validURI, validNameAddr, validVia) on the common
// forms, and through sipgo's own per-header parser on the rest (Route, Record-Route, Refer-To,
// comma lists). Values are produced only when asked for: a text header is its trimmed text
// (what sipgo keeps); a typed header asked for by a rule, and the From and To tags, are parsed
// by sipgo's per-header parser then, so they answer exactly as in the full parse.
//
// scanSIP answers ok=false, and ParseSIP runs the full parser (which then decides, errors
// included), for anything it does not handle itself: folded lines, a bare CR or LF, unusual
// whitespace, a start line that is not "METHOD SP URI SP SIP/2.0", a response, a body shorter
// than its Content-Length or without one, an oversized message, a line sipgo would refuse. So
// the fast path accepts only what the full parser accepts and yields the same answers
// (FuzzSIPFastPathAgrees).

// hkind classifies a header line: hText for the headers sipgo keeps as text, else the typed
// header sipgo parses it into.
type hkind uint8

const (
	hText hkind = iota
	hVia
	hFrom
	hTo
	hCallID
	hCSeq
	hContact
	hRoute
	hRecordRoute
	hContentLength
	hContentType
	hMaxForwards
	hReferTo
	hReferredBy
	nKinds
)

// kindNames are the names sipgo's typed headers report (Header.Name), compact forms expanded.
var kindNames = [nKinds]string{
	hVia: "Via", hFrom: "From", hTo: "To", hCallID: "Call-ID", hCSeq: "CSeq", hContact: "Contact",
	hRoute: "Route", hRecordRoute: "Record-Route", hContentLength: "Content-Length",
	hContentType: "Content-Type", hMaxForwards: "Max-Forwards", hReferTo: "Refer-To",
	hReferredBy: "Referred-By",
}

// compactKinds maps the lower-cased compact forms among sipgo's typed headers to their kinds
// (hText, the zero value, for every other byte).
var compactKinds = [256]hkind{
	'c': hContentType, 'f': hFrom, 't': hTo, 'm': hContact, 'i': hCallID, 'v': hVia, 'l': hContentLength,
}

// classify maps a header name to its kind by byte comparison (sipgo's typed set, compact forms
// included; case-insensitive).
func classify(name []byte) hkind {
	if len(name) == 1 {
		return compactKinds[asciiLower(name[0])]
	}
	for k := hVia; k < nKinds; k++ {
		if asciiEqualFoldBytes(name, kindNames[k]) { // the length is compared first
			return k
		}
	}
	return hText
}

// sipLine is one header line of a scanned message, as offsets into SIPMessage.text: the name
// [ns, ne), the trimmed value [vs, ve). The line itself is [ns, ve) as far as sipgo's header
// parser is concerned (it trims the rest).
type sipLine struct {
	ns, ne, vs, ve uint16
	kind           hkind
}

// inlineLines is how many header lines a scanned message holds without a further allocation.
const inlineLines = 24

// maxFastLines bounds the header lines of the fast path; more sends the message to the full
// parser.
const maxFastLines = 128

func scanSIP(raw []byte) (*SIPMessage, bool) {
	if len(raw) == 0 || len(raw) > sip.ParseMaxMessageLength || len(raw) > 1<<16-1 {
		return nil, false
	}
	end := headerEnd(raw)
	if end < 2 { // no empty line, or no request line before it
		return nil, false
	}
	head := raw[:end] // every line with its CRLF
	i := bytes.IndexByte(head, '\r')
	methodEnd, uriEnd, ok := scanRequestLine(head[:i])
	if !ok {
		return nil, false
	}
	both := scannedMessages.Get().(*scannedMessage)
	*both = scannedMessage{}
	m := &both.scanned
	m.text = string(head) // one copy for every value; raw is not retained
	m.method, m.rawURI = m.text[:methodEnd], m.text[methodEnd+1:uriEnd]
	if err := sip.ParseUri(m.rawURI, &m.ruri); err != nil || m.ruri.Wildcard {
		return nil, both.release()
	}
	contentLength, ok := m.scanLines(head, i+2)
	if !ok {
		return nil, both.release()
	}
	body := len(raw) - (end + 2)
	// sipgo sets a Content-Length header for a body that came without one: the full parser.
	if contentLength > body || (contentLength < 0 && body > 0) {
		return nil, both.release()
	}
	sm := &both.SIPMessage
	sm.scan, sm.rawURI, sm.pooled = m, m.rawURI, both
	sm.sc = sipSessionCase(sm)
	return sm, true
}

// headerEnd returns the offset of the CRLF of the empty line that ends raw's header section,
// or -1. Every line must end in CRLF and hold no other CR or LF: anything else (a bare CR or
// LF) is the full parser's business, and so -1.
func headerEnd(raw []byte) int {
	for pos := 0; pos < len(raw); {
		j := bytes.IndexByte(raw[pos:], '\n')
		if j < 1 || raw[pos+j-1] != '\r' || bytes.IndexByte(raw[pos:pos+j-1], '\r') >= 0 {
			return -1
		}
		if j == 1 {
			return pos
		}
		pos += j + 1
	}
	return -1
}

// scanLines classifies and checks the header lines of head from pos on, appending them to
// s.lines. It returns the value of the last Content-Length (-1: none, as in sipgo the last one
// counts) and false for anything the full parser must see: a folded line, too many lines, or a
// value sipgo would refuse or read differently.
func (s *scanned) scanLines(head []byte, pos int) (contentLength int, ok bool) {
	s.lines = s.buf[:0]
	contentLength = -1
	for pos < len(head) {
		n := bytes.IndexByte(head[pos:], '\r')
		line := head[pos : pos+n]
		next := pos + n + 2
		if next < len(head) && (head[next] == ' ' || head[next] == '\t') {
			return 0, false // folded: the full parser unfolds
		}
		nameEnd, valStart, valEnd, ok := splitHeaderLine(line)
		if !ok || len(s.lines) == maxFastLines {
			return 0, false
		}
		l := sipLine{ns: uint16(pos), ne: uint16(pos + nameEnd), vs: uint16(pos + valStart), ve: uint16(pos + valEnd),
			kind: classify(line[:nameEnd])}
		v := s.text[l.vs:l.ve]
		if l.kind == hContentLength {
			cl, err := strconv.ParseUint(v, 10, 32)
			if err != nil {
				return 0, false
			}
			contentLength = int(cl)
		} else if !fastValue(l.kind, v, line) {
			return 0, false
		}
		s.add(l)
		pos = next
	}
	return contentLength, true
}

// fastValue reports whether the fast path reads value v of a header of kind k (whole line
// line) as sipgo's parser does. Content-Length is scanLines' own.
func fastValue(k hkind, v string, line []byte) bool {
	switch k {
	case hText:
		return true
	case hCallID, hContentType:
		return v != ""
	case hCSeq:
		_, ok := parseCSeq(v)
		return ok
	case hMaxForwards:
		_, err := strconv.ParseUint(v, 10, 32)
		return err == nil
	case hFrom, hTo, hReferredBy:
		wild, valid := validNameAddr(v)
		return valid && !wild
	case hContact:
		if strings.IndexByte(v, ',') < 0 {
			_, ok := validNameAddr(v)
			return ok
		}
	case hVia:
		if strings.IndexByte(v, ',') < 0 {
			return validVia(v)
		}
	}
	// Route, Record-Route, Refer-To, and a Contact or Via list: sipgo's parser decides
	return sipgoAccepts(line)
}

// add appends l to s.lines and records it as the first and last line of its kind.
func (s *scanned) add(l sipLine) {
	s.lines = append(s.lines, l)
	if s.firstAt[l.kind] == 0 {
		s.firstAt[l.kind] = uint8(len(s.lines))
	}
	s.lastAt[l.kind] = uint8(len(s.lines))
}

// scannedMessage is a message of the fast path and its scanned form, allocated together and
// recycled through scannedMessages when its user calls SIPMessage.Release.
type scannedMessage struct {
	SIPMessage
	scanned
}

var scannedMessages = sync.Pool{New: func() any { return new(scannedMessage) }}

// release puts s back into the pool; it returns false for scanSIP's refusals.
func (s *scannedMessage) release() bool {
	*s = scannedMessage{} // drop the references it holds
	scannedMessages.Put(s)
	return false
}

// scanned is the fast path's form of a SIP request.
type scanned struct {
	text   string // the start line and header lines, CRLFs included
	method string
	rawURI string
	ruri   sip.Uri
	lines  []sipLine
	buf    [inlineLines]sipLine
	// firstAt and lastAt are the first and last line of each kind, as index+1 (0: none).
	firstAt, lastAt [nKinds]uint8
}

func (s *scanned) name(l *sipLine) string {
	if l.kind != hText {
		return kindNames[l.kind]
	}
	return s.text[l.ns:l.ne]
}

// header returns the value of the first line called name, as the full parse's GetHeader does:
// a text header's trimmed text, a typed header's value as sipgo renders it.
func (s *scanned) header(name string) (string, bool) {
	for i := range s.lines {
		l := &s.lines[i]
		if !asciiEqualFold(s.name(l), name) {
			continue
		}
		if l.kind == hText {
			return s.text[l.vs:l.ve], true
		}
		if h := s.typed(l); h != nil {
			return h.Value(), true
		}
		return "", false
	}
	return "", false
}

// typed parses a typed line with sipgo's per-header parser and returns its first header (the
// line was accepted by the scan, so the parse succeeds; nil if it does not).
func (s *scanned) typed(l *sipLine) sip.Header {
	hs, err := sip.HeadersParser(sip.DefaultHeadersParser()).ParseHeader(nil, []byte(s.text[l.ns:l.ve]))
	if err != nil || len(hs) == 0 {
		return nil
	}
	return hs[0]
}

// first and last return the first and the last line of a kind, nil when there is none. sipgo's
// request keeps the first Via and Route, and the last From, To, Call-ID and CSeq.
func (s *scanned) first(k hkind) *sipLine { return s.at(s.firstAt[k]) }

func (s *scanned) last(k hkind) *sipLine { return s.at(s.lastAt[k]) }

func (s *scanned) at(i uint8) *sipLine {
	if i == 0 {
		return nil
	}
	return &s.lines[i-1]
}

func (s *scanned) value(l *sipLine) string { return s.text[l.vs:l.ve] }

// tag returns the tag parameter of the last line of kind k (From or To), read from the text
// as sipgo's address parser reads it (the scan accepted the line as a name-addr).
func (s *scanned) tag(k hkind) string {
	l := s.last(k)
	if l == nil {
		return ""
	}
	v, _ := headerParam(nameAddrParams(s.value(l)), "tag")
	return v
}

// nameAddrParams returns the header parameters of a name-addr or addr-spec that
// validNameAddr accepts: the text after the URI's closing ">", or after the ";" that ends a
// bare URI; "" when there are none. It follows sipgo.ParseAddressValue's states.
func nameAddrParams(s string) string {
	for i := 0; i < len(s); i++ {
		switch s[i] {
		case '"':
			return quotedNameAddrParams(s[i+1:])
		case '<':
			return afterByte(s[i+1:], '>')
		case ';':
			return afterByte(s, ';')
		}
	}
	return ""
}

func quotedNameAddrParams(s string) string {
	escaped := false
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c == '\\' {
			escaped = !escaped
			continue
		}
		if escaped {
			escaped = false
			continue
		}
		if c != '"' {
			continue
		}
		rest := s[i+1:]
		for j := 0; j < len(rest); j++ {
			switch rest[j] {
			case '<':
				return afterByte(rest[j+1:], '>')
			case ';':
				return afterByte(rest[j+1:], ';')
			}
		}
		return ""
	}
	return ""
}

// afterByte is the text after the first c in s, "" without one.
func afterByte(s string, c byte) string {
	if i := strings.IndexByte(s, c); i >= 0 {
		return s[i+1:]
	}
	return ""
}

// headerParam looks key up in ";"-separated header parameters as sipgo's address parser
// stores them: each part is name=value split at its last "=", or a bare name; a later
// occurrence of a name replaces the earlier value.
func headerParam(params, key string) (val string, ok bool) {
	for params != "" {
		seg := params
		if i := strings.IndexByte(params, ';'); i >= 0 {
			seg, params = params[:i], params[i+1:]
		} else {
			params = ""
		}
		name, v := seg, ""
		if eq := strings.LastIndexByte(seg, '='); eq > 0 {
			name, v = seg[:eq], seg[eq+1:]
		}
		if seg != "" && name == key {
			val, ok = v, true
		}
	}
	return val, ok
}

// routeOrig reports whether the first Route's URI has an "orig" parameter.
func (s *scanned) routeOrig() bool {
	l := s.first(hRoute)
	if l == nil {
		return false
	}
	r, ok := s.typed(l).(*sip.RouteHeader)
	return ok && r.Address.UriParams.Has("orig")
}

// sipgoAccepts reports whether sipgo's per-header parser accepts line.
func sipgoAccepts(line []byte) bool {
	var scratch [4]sip.Header
	_, err := sip.HeadersParser(sip.DefaultHeadersParser()).ParseHeader(scratch[:0], line)
	return err == nil
}

// parseCSeq is sipgo's CSeq parse: "seq" then one space or tab, then the method (the rest, as
// is); seq at most 2³¹−1.
func parseCSeq(v string) (method string, ok bool) {
	ind := strings.IndexAny(v, " \t")
	if ind < 1 || len(v)-ind < 2 {
		return "", false
	}
	seq, err := strconv.ParseUint(v[:ind], 10, 32)
	if err != nil || seq > 2147483647 {
		return "", false
	}
	return v[ind+1:], true
}

// validVia mirrors sipgo's Via parse of a value without commas: it fails only without
// "protocol/version/transport" followed by a space or tab, or on an IPv6 host without "]".
func validVia(v string) bool {
	i := strings.IndexByte(v, '/')
	if i < 0 {
		return false
	}
	v = v[i+1:]
	if i = strings.IndexByte(v, '/'); i < 0 {
		return false
	}
	v = v[i+1:]
	if i = strings.IndexAny(v, " \t"); i < 0 {
		return false
	}
	v = v[i+1:]
	return len(v) == 0 || v[0] != '[' || strings.IndexByte(v, ']') >= 0
}

// validNameAddr mirrors sipgo.ParseAddressValue: whether it accepts s, and whether the URI is
// the wildcard. Delimiters are ASCII, so scanning bytes finds what sipgo's rune loops find.
func validNameAddr(s string) (wild, ok bool) {
	if s == "" {
		return false, false
	}
	for i := 0; i < len(s); i++ {
		switch s[i] {
		case '"':
			return validQuotedNameAddr(s[i+1:])
		case '<':
			return validBracketURI(s[i+1:])
		case ';':
			return validBareURI(s)
		}
	}
	return validBareURI(s)
}

func validQuotedNameAddr(s string) (wild, ok bool) {
	escaped := false
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c == '\\' {
			escaped = !escaped
			continue
		}
		if escaped {
			if c == '\n' || c == '\r' {
				return false, false
			}
			escaped = false
			continue
		}
		if c != '"' {
			continue
		}
		rest := s[i+1:]
		for j := 0; j < len(rest); j++ {
			switch rest[j] {
			case '<':
				return validBracketURI(rest[j+1:])
			case ';':
				return validBareURI(rest[j+1:])
			}
		}
		return false, false
	}
	return false, false
}

func validBracketURI(s string) (wild, ok bool) {
	if s == "" {
		return false, false
	}
	if i := strings.IndexByte(s, '>'); i >= 0 {
		return validURI(s[:i]) // header parameters never fail
	}
	return false, false
}

func validBareURI(s string) (wild, ok bool) {
	if s == "" {
		return false, false
	}
	if i := strings.IndexByte(s, ';'); i >= 0 {
		return validURI(s[:i])
	}
	return validURI(s)
}

// validURI mirrors sip.ParseUri: whether it accepts s, and whether s is the wildcard.
func validURI(s string) (wild, ok bool) {
	if len(s) < 3 {
		return s == "*", s == "*"
	}
	colon := -1
	for i := 0; i < len(s); i++ {
		if s[i] == ':' {
			colon = i
			break
		}
		if c := s[i] | 0x20; c < 'a' || c > 'z' { // sipgo: a scheme is letters only
			return false, false
		}
	}
	if colon < 0 {
		return false, false
	}
	if scheme := s[:colon]; !asciiEqualFold(scheme, "sip") && !asciiEqualFold(scheme, "sips") {
		return false, true // other schemes stay uninterpreted
	}
	rest, _ := strings.CutPrefix(s[colon+1:], "//")
	host := uriHostPart(rest)
	for i := 0; i < len(host); i++ {
		switch host[i] {
		case '[':
			return false, validIPv6Host(host[i:])
		case ':':
			return false, validPort(host[i+1:])
		case ';', '?':
			return false, true // parameters and headers never fail
		}
	}
	return host == "*", true
}

// uriHostPart returns the part of a SIP URI after its scheme from the host on: from the first
// "[", or after the first "@", whichever comes first; the whole of rest if neither does.
func uriHostPart(rest string) string {
	for i := 0; i < len(rest); i++ {
		switch rest[i] {
		case '[':
			return rest[i:]
		case '@':
			return rest[i+1:]
		}
	}
	return rest
}

// validIPv6Host: "]" within the first 42 bytes, then optionally ":port".
func validIPv6Host(s string) bool {
	ind := strings.IndexByte(s[:min(len(s), 42)], ']')
	if ind <= 0 {
		return false
	}
	if ind+1 < len(s) && s[ind+1] == ':' {
		return validPort(s[ind+2:])
	}
	return true
}

// validPort: the text up to ";" or "?" is a decimal integer (strconv.Atoi).
func validPort(s string) bool {
	if i := strings.IndexAny(s, ";?"); i >= 0 {
		s = s[:i]
	}
	_, err := strconv.Atoi(s)
	return err == nil
}

// scanRequestLine accepts "METHOD SP Request-URI SP SIP/2.0" with an upper-case token method
// (what sipgo would upper-case is left to it) and returns the end of the method and of the
// URI.
func scanRequestLine(line []byte) (methodEnd, uriEnd int, ok bool) {
	sp1 := bytes.IndexByte(line, ' ')
	if sp1 <= 0 {
		return 0, 0, false
	}
	rest := line[sp1+1:]
	sp2 := bytes.IndexByte(rest, ' ')
	if sp2 <= 0 || string(rest[sp2+1:]) != "SIP/2.0" {
		return 0, 0, false
	}
	for _, c := range line[:sp1] {
		if c < 'A' || c > 'Z' {
			return 0, 0, false
		}
	}
	return sp1, sp1 + 1 + sp2, true
}

// splitHeaderLine splits "name: value" where name is a token (optionally followed by spaces
// or tabs) and the value is trimmed of spaces and tabs; it returns the end of the name and the
// bounds of the value in line. A value that begins or ends with any other white space or a
// non-ASCII byte is refused (sipgo trims Unicode white space).
func splitHeaderLine(line []byte) (nameEnd, valStart, valEnd int, ok bool) {
	colon := bytes.IndexByte(line, ':')
	if colon <= 0 {
		return 0, 0, 0, false
	}
	nameEnd = colon
	for nameEnd > 0 && (line[nameEnd-1] == ' ' || line[nameEnd-1] == '\t') {
		nameEnd--
	}
	if !isTokenBytes(line[:nameEnd]) {
		return 0, 0, 0, false
	}
	valStart, valEnd = colon+1, len(line)
	for valStart < valEnd && (line[valStart] == ' ' || line[valStart] == '\t') {
		valStart++
	}
	for valEnd > valStart && (line[valEnd-1] == ' ' || line[valEnd-1] == '\t') {
		valEnd--
	}
	if valStart < valEnd && (!plainEdge(line[valStart]) || !plainEdge(line[valEnd-1])) {
		return 0, 0, 0, false
	}
	return nameEnd, valStart, valEnd, true
}

// isTokenBytes is isToken without a conversion.
func isTokenBytes(b []byte) bool { return tokenOf(b, sipTokenPunct) }

func plainEdge(c byte) bool { return c > ' ' && c < 0x7f }

func asciiLower(c byte) byte {
	if 'A' <= c && c <= 'Z' {
		return c + 'a' - 'A'
	}
	return c
}

// asciiEqualFold is sipgo's header-name comparison: equal after ASCII lower-casing.
func asciiEqualFold(a, b string) bool {
	if len(a) != len(b) {
		return false
	}
	for i := 0; i < len(a); i++ {
		if asciiLower(a[i]) != asciiLower(b[i]) {
			return false
		}
	}
	return true
}

func asciiEqualFoldBytes(a []byte, b string) bool {
	if len(a) != len(b) {
		return false
	}
	for i := 0; i < len(a); i++ {
		if asciiLower(a[i]) != asciiLower(b[i]) {
			return false
		}
	}
	return true
}
