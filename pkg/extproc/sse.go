package extproc

import (
	"net/url"
	"strings"

	"github.com/tether-dev/tether/pkg/affinity"
)

// sseScanner finds the first "endpoint" event of a text/event-stream body fed to it in
// arbitrary chunks. It follows the WHATWG event-stream grammar: lines end with CRLF, LF or
// CR (a CR at the end of one chunk followed by LF at the start of the next is one line end);
// an empty line dispatches the event; "event:" sets the type, "data:" lines are joined with
// LF, one space after the colon is dropped, lines starting with ":" are comments, a leading
// UTF-8 BOM is skipped. It is not safe for concurrent use.
type sseScanner struct {
	limit   int
	scanned int
	line    []byte // the current, unterminated line
	skipLF  bool   // the previous chunk ended with CR: drop a leading LF
	started bool   // past the optional BOM
	bomSeen int    // BOM bytes matched so far
	event   string
	data    strings.Builder
	hasData bool
}

const utf8BOM = "\xEF\xBB\xBF"

func newSSEScanner(limit int) *sseScanner { return &sseScanner{limit: limit} }

// feed scans one chunk. It returns the endpoint event's data when found; gaveUp reports that
// limit bytes passed without one.
func (s *sseScanner) feed(chunk []byte) (data string, found, gaveUp bool) {
	for i := 0; i < len(chunk); i++ {
		c := chunk[i]
		if !s.started {
			// Skip a leading UTF-8 byte order mark, even one split across chunks.
			if c == utf8BOM[s.bomSeen] {
				if s.bomSeen++; s.bomSeen == len(utf8BOM) {
					s.started = true
				}
				continue
			}
			s.started = true
			s.line = append(s.line, utf8BOM[:s.bomSeen]...) // not a BOM after all
		}
		if s.skipLF {
			s.skipLF = false
			if c == '\n' {
				continue
			}
		}
		switch c {
		case '\r':
			s.skipLF = true
			fallthrough
		case '\n':
			if d, ok := s.endLine(); ok {
				return d, true, false
			}
		default:
			s.line = append(s.line, c)
		}
	}
	s.scanned += len(chunk)
	if s.scanned >= s.limit {
		return "", false, true
	}
	return "", false, false
}

// endLine processes the current line; ok reports an endpoint event dispatched.
func (s *sseScanner) endLine() (string, bool) {
	line := s.line
	s.line = s.line[:0]
	if len(line) == 0 { // blank line: dispatch
		typ, data, has := s.event, s.data.String(), s.hasData
		s.event, s.hasData = "", false
		s.data.Reset()
		if has && typ == "endpoint" {
			return data, true
		}
		return "", false
	}
	if line[0] == ':' {
		return "", false // comment
	}
	field, value := string(line), ""
	if i := strings.IndexByte(field, ':'); i >= 0 {
		field, value = field[:i], field[i+1:]
		value = strings.TrimPrefix(value, " ")
	}
	switch field {
	case "event":
		s.event = value
	case "data":
		if s.hasData {
			s.data.WriteByte('\n')
		}
		s.data.WriteString(value)
		s.hasData = true
	}
	return "", false
}

// SSESessionParamer is implemented by Decisions that know which query parameter of the MCP SSE
// endpoint URI carries the session id (the service's SSE.SessionParam). Without it the
// parameters sessionId, session_id and sessionid are tried in this order.
type SSESessionParamer interface {
	SSESessionParam() string
}

var defaultSessionParams = []string{"sessionId", "session_id", "sessionid"}

// sessionIDFromEndpoint extracts the session id from the endpoint event's data, a URI
// reference such as "/messages/?sessionId=abc". It returns the parameter used and the id ("" when
// absent).
func sessionIDFromEndpoint(data string, d affinity.Decision) (param, id string) {
	u, err := url.Parse(strings.TrimSpace(data))
	if err != nil {
		return "", ""
	}
	q := u.Query()
	if p, ok := d.(SSESessionParamer); ok && p.SSESessionParam() != "" {
		return p.SSESessionParam(), q.Get(p.SSESessionParam())
	}
	for _, p := range defaultSessionParams {
		if v := q.Get(p); v != "" {
			return p, v
		}
	}
	return "", ""
}
