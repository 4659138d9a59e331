package dcr

import (
	"bytes"

	"github.com/emiago/sipgo/sip"
)

// The fast path of ParseSIP. sipgo's parser builds a typed or generic header object for every
// header line and copies the body; a key needs a handful of headers. scanSIP walks the header
// section once, hands only the lines sipgo types (From, To, Call-ID, CSeq, Via, Route, Contact,
// …) to sipgo's own per-header parsers, so they parse and fail exactly as in the full parse,
// and keeps every other header as a (name, value) slice of one copy of the header section —
// sipgo keeps such headers as the trimmed text, which is what Header returns for them. It
// answers ok=false, and ParseSIP runs the full parser (which then decides, errors included),
// for anything it does not handle itself: folded lines, a bare CR or LF, unusual whitespace,
// a start line that is not "METHOD SP URI SP SIP/2.0", a response, a body shorter than its
// Content-Length or without one, an oversized message. So the fast path accepts only what the full parser
// accepts and yields the same answers (FuzzSIPFastPathAgrees).

// sipField is one header line kept as text: its name as written and its trimmed value.
type sipField struct{ name, value string }

// maxFastFields bounds the text headers of the fast path; more sends the message to the full
// parser.
const maxFastFields = 64

func scanSIP(raw []byte) (*SIPMessage, bool) {
	if len(raw) == 0 || len(raw) > sip.ParseMaxMessageLength {
		return nil, false
	}
	end := bytes.Index(raw, []byte("\r\n\r\n"))
	if end < 0 {
		return nil, false
	}
	head := raw[:end+2] // every line with its CRLF
	// A CR or LF anywhere but in a CRLF pair is the full parser's business.
	if bytes.Count(head, []byte{'\r'}) != bytes.Count(head, []byte{'\n'}) ||
		bytes.Count(head, []byte("\r\n")) != bytes.Count(head, []byte{'\n'}) {
		return nil, false
	}
	i := bytes.IndexByte(head, '\r')
	method, uri, ok := scanRequestLine(head[:i])
	if !ok {
		return nil, false
	}
	var ru sip.Uri
	if err := sip.ParseUri(uri, &ru); err != nil || ru.Wildcard {
		return nil, false
	}
	req := sip.NewRequest(sip.RequestMethod(method), ru)
	req.SipVersion = "SIP/2.0"
	text := string(head) // one copy for every text header; raw is not retained
	fields := make([]sipField, 0, 16)
	parsers := sip.HeadersParser(sip.DefaultHeadersParser())
	var typed []sip.Header
	contentLength := -1
	for pos := i + 2; pos < len(head); {
		n := bytes.IndexByte(head[pos:], '\r')
		line := head[pos : pos+n]
		next := pos + n + 2
		if next < len(head) && (head[next] == ' ' || head[next] == '\t') {
			return nil, false // folded: the full parser unfolds
		}
		nameEnd, valStart, valEnd, ok := splitHeaderLine(line)
		if !ok {
			return nil, false
		}
		name := line[:nameEnd]
		var lower [16]byte
		if len(name) <= len(lower) {
			for k := 0; k < len(name); k++ {
				lower[k] = asciiLower(name[k])
			}
			if _, isTyped := parsers[string(lower[:len(name)])]; isTyped {
				var err error
				if typed, err = parsers.ParseHeader(typed[:0], line); err != nil {
					return nil, false
				}
				for _, h := range typed {
					if cl, ok := h.(*sip.ContentLengthHeader); ok {
						contentLength = int(*cl)
					}
					req.AppendHeader(h)
				}
				pos = next
				continue
			}
		}
		if len(fields) == maxFastFields {
			return nil, false
		}
		fields = append(fields, sipField{name: text[pos : pos+nameEnd], value: text[pos+valStart : pos+valEnd]})
		pos = next
	}
	body := len(raw) - (end + 4)
	// sipgo sets a Content-Length header for a body that came without one: the full parser.
	if contentLength > body || (contentLength < 0 && body > 0) {
		return nil, false
	}
	m := &SIPMessage{req: req, rawURI: uri, fields: fields}
	m.sc = sipSessionCase(m)
	return m, true
}

// scanRequestLine accepts "METHOD SP Request-URI SP SIP/2.0" with an upper-case token method
// (what sipgo would upper-case is left to it) and returns the method and the URI.
func scanRequestLine(line []byte) (method, uri string, ok bool) {
	sp1 := bytes.IndexByte(line, ' ')
	if sp1 <= 0 {
		return "", "", false
	}
	rest := line[sp1+1:]
	sp2 := bytes.IndexByte(rest, ' ')
	if sp2 <= 0 || string(rest[sp2+1:]) != "SIP/2.0" {
		return "", "", false
	}
	for _, c := range line[:sp1] {
		if c < 'A' || c > 'Z' {
			return "", "", false
		}
	}
	return string(line[:sp1]), string(rest[:sp2]), true
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
	if !isToken(string(line[:nameEnd])) {
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
