package dcr

import (
	"errors"
	"strconv"
	"strings"

	"github.com/emiago/sipgo/sip"
)

// uriParts are the pieces of one URI a variable can return. Empty means absent. The URI text
// and the port are formatted only when a variable asks for them.
type uriParts struct {
	// u, when set, is the parsed URI the text comes from; derived means the text is built
	// from scheme, user and host instead (tel URIs, resolved numbers).
	u           *sip.Uri
	derived     bool
	scheme      string
	user        string
	host        string
	port        int // 0: absent
	displayName string
	tag         string
	// phone reports that user is a telephone number: a tel URI, a SIP URI with user=phone,
	// or a bare global number.
	phone bool
}

// uriText is the URI without header parameters.
func (p *uriParts) uriText() string {
	switch {
	case p.derived:
		s := p.scheme + ":" + p.user
		if p.host != "" {
			s += "@" + p.host
		}
		return s
	case p.u != nil:
		return p.u.String()
	}
	return ""
}

// portText is the port in decimal, "" when absent.
func (p *uriParts) portText() string {
	if p.port > 0 {
		return strconv.Itoa(p.port)
	}
	return ""
}

// partsFromURI converts a parsed sipgo URI, which must not change while the parts are in use.
// For tel URIs the user is the telephone-subscriber part (before any ';' parameter); other
// non-SIP schemes have no user or host.
func partsFromURI(u *sip.Uri) uriParts {
	p := uriParts{u: u, scheme: u.Scheme}
	switch u.Scheme {
	case "sip", "sips":
		p.user, p.host = u.User, u.Host
		if u.Port > 0 {
			p.port = u.Port
		}
		if v, ok := u.UriParams.Get("user"); ok && strings.EqualFold(v, "phone") {
			p.phone = true
		} else {
			p.phone = isGlobalNumber(u.User)
		}
	case "tel":
		p.user, _, _ = strings.Cut(u.Raw(), ";")
		p.u, p.derived = nil, true // "tel:" + user
		p.phone = true
	}
	return p
}

// parseAddress parses the first element of a header or parameter value as a name-addr
// ("Alice" <sip:alice@example.com>;tag=1) or addr-spec (sip:alice@example.com). A bare global
// telephone number (+1-212-555-0100) counts as a tel URI.
func parseAddress(v string) (uriParts, bool) {
	v = strings.TrimSpace(firstElement(v))
	if v == "" {
		return uriParts{}, false
	}
	if isGlobalNumber(v) {
		return uriParts{derived: true, scheme: "tel", user: v, phone: true}, true
	}
	var u sip.Uri
	var params sip.HeaderParams
	dn, err := parseAddressValue(v, &u, &params)
	if err != nil || u.Scheme == "" {
		return uriParts{}, false
	}
	p := partsFromURI(&u)
	p.displayName = dn
	p.tag, _ = params.Get("tag")
	return p, true
}

// parseAddressValue calls sipgo's address parser, turning a panic on hostile input into an
// error.
func parseAddressValue(v string, u *sip.Uri, params *sip.HeaderParams) (dn string, err error) {
	defer func() {
		if r := recover(); r != nil {
			err = errParserPanic
		}
	}()
	return sip.ParseAddressValue(v, u, params)
}

var errParserPanic = errors.New("dcr: address parser failure")

// firstElement returns the text before the first comma that is outside quotes and angle
// brackets: the first value of a comma-separated header such as P-Asserted-Identity.
func firstElement(v string) string {
	inQuote, inAngle := false, false
	for i := 0; i < len(v); i++ {
		switch c := v[i]; {
		case inQuote && c == '\\':
			i++
		case c == '"':
			inQuote = !inQuote
		case inQuote:
		case c == '<':
			inAngle = true
		case c == '>':
			inAngle = false
		case c == ',' && !inAngle:
			return v[:i]
		}
	}
	return v
}

// isGlobalNumber reports whether s looks like a global telephone number: '+', then digits and
// visual separators, with at least one digit.
func isGlobalNumber(s string) bool {
	if len(s) < 2 || s[0] != '+' {
		return false
	}
	digits := 0
	for i := 1; i < len(s); i++ {
		switch c := s[i]; {
		case c >= '0' && c <= '9':
			digits++
		case isVisualSeparator(c):
		default:
			return false
		}
	}
	return digits > 0
}

func isVisualSeparator(c byte) bool {
	return c == '-' || c == '.' || c == '(' || c == ')' || c == ' '
}

// normalizeNumber removes visual separators and any ';' parameters from a telephone number:
// "+1-212-555-0100;npdi" → "+12125550100".
func normalizeNumber(s string) string {
	s, _, _ = strings.Cut(s, ";")
	clean := true
	for i := 0; i < len(s) && clean; i++ {
		clean = !isVisualSeparator(s[i])
	}
	if clean {
		return s
	}
	var b strings.Builder
	b.Grow(len(s))
	for i := 0; i < len(s); i++ {
		if !isVisualSeparator(s[i]) {
			b.WriteByte(s[i])
		}
	}
	return b.String()
}

// resolved applies tether's "resolve": a telephone number (tel URI, user=phone, or a bare
// global number) is normalized to its digits (E.164 when global) so that every spelling of
// one number yields one key; other URIs are unchanged. See the package documentation for why
// no DNS ENUM lookup happens.
func (p uriParts) resolved() uriParts {
	if !p.phone {
		return p
	}
	r := p
	r.user = normalizeNumber(p.user)
	r.u, r.derived = nil, true // "tel:" + user, or scheme:user[@host]
	return r
}
