package dcr

import (
	"regexp"
	"strings"
)

// Rules is a compiled data-centric rules file. It is immutable and safe for concurrent use; a
// nil *Rules has no rules.
type Rules struct {
	file string
	sip  []*node
	http []*node
}

// File returns the file name the rules were parsed from.
func (r *Rules) File() string {
	if r == nil {
		return ""
	}
	return r.file
}

// HasSIP reports whether the file has a <sip-rules> element with at least one rule.
func (r *Rules) HasSIP() bool { return r != nil && len(r.sip) > 0 }

// HasHTTP reports whether the file has an <http-rules> element with at least one rule.
func (r *Rules) HasHTTP() bool { return r != nil && len(r.http) > 0 }

// Key evaluates the rules for m's protocol in document order and returns the first non-null
// result as the key. ok is false when no rule yields a key (the caller then uses
// DefaultSIPKey or DefaultHTTPKey), when r or m is nil, or when the file has no rules for the
// protocol. Key never panics and never returns ok with an empty key.
func (r *Rules) Key(m Message) (key string, ok bool) {
	if r == nil || m == nil {
		return "", false
	}
	var list []*node
	switch m.Protocol() {
	case ProtocolSIP:
		list = r.sip
	case ProtocolHTTP:
		list = r.http
	}
	for _, n := range list {
		if res := n.eval(m); res.state == stateValue {
			return res.val, true
		}
	}
	return "", false
}

// resultState says whether a rule matched and whether it produced a usable value.
type resultState uint8

const (
	// stateNull: the rule did not match.
	stateNull resultState = iota
	// stateMarker: the rule matched but has no return variable and nothing to return (a
	// <notexist/> condition, a present but empty header). It counts as non-null inside
	// or/and/if/session-case, but a top-level rule ending in a marker yields no key.
	stateMarker
	// stateValue: the rule matched and returned a non-empty value.
	stateValue
)

type result struct {
	val   string
	state resultState
}

func value(s string) result {
	if s == "" {
		return result{state: stateMarker}
	}
	return result{val: s, state: stateValue}
}

type nodeKind uint8

const (
	kindOr nodeKind = iota + 1
	kindAnd
	kindIf
	kindHeader
	kindRequestURI
	kindCookie
	kindSessionCase
)

type condKind uint8

const (
	condExist condKind = iota + 1
	condNotExist
	condMatch
)

// node is one compiled rule element.
type node struct {
	kind nodeKind
	line int
	// children: the operands of or/and/if, or the nested rules of a session-case.
	children []*node
	// name: the header, cookie or request-URI parameter tested ("" = the whole request URI).
	name string
	cond condKind
	re   *regexp.Regexp
	ret  *variable // nil: return the tested value (see test)
	sc   SessionCase
}

func (n *node) eval(m Message) result {
	switch n.kind {
	case kindOr, kindIf:
		return firstNonNull(n.children, m)
	case kindAnd:
		last := result{}
		for _, c := range n.children {
			last = c.eval(m)
			if last.state == stateNull {
				return result{}
			}
		}
		return last
	case kindSessionCase:
		if m.SessionCase() != n.sc {
			return result{}
		}
		if len(n.children) == 0 {
			return result{state: stateMarker}
		}
		return firstNonNull(n.children, m)
	case kindHeader, kindRequestURI, kindCookie:
		return n.test(m)
	}
	return result{}
}

func firstNonNull(list []*node, m Message) result {
	for _, c := range list {
		if r := c.eval(m); r.state != stateNull {
			return r
		}
	}
	return result{}
}

// test evaluates a header, request-uri or cookie condition and its return variable.
func (n *node) test(m Message) result {
	v, present := n.subject(m)
	matched, ok := n.holds(v, present)
	if !ok {
		return result{}
	}
	if n.ret == nil {
		switch n.cond {
		case condMatch:
			return value(matched)
		case condExist:
			return value(v)
		default:
			return result{state: stateMarker}
		}
	}
	// A return variable that is empty or absent makes the rule null: every rule returns a
	// value, and no value means no match.
	v = n.ret.eval(m, matched)
	if v == "" {
		return result{}
	}
	return result{val: v, state: stateValue}
}

// subject returns the value the test looks at, and whether m has it.
func (n *node) subject(m Message) (string, bool) {
	switch n.kind {
	case kindHeader:
		return m.Header(n.name)
	case kindCookie:
		return m.Cookie(n.name)
	case kindRequestURI:
		if n.name == "" {
			return m.RequestURI(), true
		}
		return m.Param(n.name)
	}
	return "", false
}

// holds reports whether the condition holds for subject v; for <match> with a return variable
// that reads it, it also returns the matched text: the first capture group that took part in
// the match, if the pattern has groups, else the whole match.
func (n *node) holds(v string, present bool) (matched string, ok bool) {
	switch n.cond {
	case condExist:
		return "", present
	case condNotExist:
		return "", !present
	case condMatch:
		if !present {
			return "", false
		}
		if n.ret != nil && n.ret.src != srcMatch {
			// The variable does not read the matched text: whether it matches is enough.
			return "", n.re.MatchString(v)
		}
		idx := n.re.FindStringSubmatchIndex(v)
		if idx == nil {
			return "", false
		}
		for g := 1; 2*g+1 < len(idx); g++ {
			if idx[2*g] >= 0 {
				return v[idx[2*g]:idx[2*g+1]], true
			}
		}
		return v[idx[0]:idx[1]], true
	}
	return "", true
}

type varSource uint8

const (
	srcMethod varSource = iota + 1
	srcRequestURI
	srcHeader
	srcParam
	srcCookie
	srcMatch
)

type varPart uint8

const (
	partWhole varPart = iota + 1 // the value itself
	partURI                      // the value parsed as a URI, without header parameters
	partScheme
	partUser
	partHost
	partPort
	partDisplayName
	partTag
)

// variable is a compiled return="…" expression.
type variable struct {
	src     varSource
	name    string // header, parameter or cookie name
	part    varPart
	resolve bool
}

// eval returns the variable's value for m, "" when it is null. matched is the text the
// enclosing rule's <match> matched.
func (v *variable) eval(m Message, matched string) string {
	var raw string
	switch v.src {
	case srcMethod:
		return m.Method()
	case srcRequestURI:
		if v.part == partWhole {
			return m.RequestURI()
		}
		p, ok := m.requestURIParts()
		if !ok {
			if p, ok = parseAddress(m.RequestURI()); !ok {
				return ""
			}
		}
		return v.pick(p)
	case srcHeader:
		var ok bool
		if raw, ok = m.Header(v.name); !ok {
			return ""
		}
	case srcParam:
		var ok bool
		if raw, ok = m.Param(v.name); !ok {
			return ""
		}
	case srcCookie:
		var ok bool
		if raw, ok = m.Cookie(v.name); !ok {
			return ""
		}
	case srcMatch:
		raw = matched
	}
	if v.part == partWhole {
		return raw
	}
	p, ok := parseAddress(raw)
	if !ok {
		return ""
	}
	return v.pick(p)
}

func (v *variable) pick(p uriParts) string {
	if v.resolve {
		p = p.resolved()
	}
	switch v.part {
	case partURI:
		return p.uriText()
	case partScheme:
		return p.scheme
	case partUser:
		return p.user
	case partHost:
		return p.host
	case partPort:
		return p.portText()
	case partDisplayName:
		return p.displayName
	case partTag:
		return p.tag
	}
	return ""
}

// varSuffix is one suffix a header, parameter or cookie variable may end with.
type varSuffix struct {
	text    string
	part    varPart
	resolve bool
	match   bool
}

// varSuffixes lists the suffixes longest first, so that "request.X.uri.resolve.user" is not
// read as header "X.uri.resolve" with suffix ".user".
func varSuffixes() []varSuffix {
	return []varSuffix{
		{".uri.resolve.user", partUser, true, false},
		{".uri.resolve.host", partHost, true, false},
		{".match.resolve.user", partUser, true, true},
		{".uri.display-name", partDisplayName, false, false},
		{".uri.resolve", partURI, true, false},
		{".uri.scheme", partScheme, false, false},
		{".uri.user", partUser, false, false},
		{".uri.host", partHost, false, false},
		{".uri.port", partPort, false, false},
		{".match", partWhole, false, true},
		{".uri", partURI, false, false},
		{".tag", partTag, false, false},
	}
}

// fixedVariables are the return variables whose text is the whole expression.
var fixedVariables = map[string]variable{
	"match":                    {src: srcMatch, part: partWhole},
	"match.resolve.user":       {src: srcMatch, part: partUser, resolve: true},
	"request.method":           {src: srcMethod, part: partWhole},
	"request.uri":              {src: srcRequestURI, part: partWhole},
	"request.uri.scheme":       {src: srcRequestURI, part: partScheme},
	"request.uri.user":         {src: srcRequestURI, part: partUser},
	"request.uri.host":         {src: srcRequestURI, part: partHost},
	"request.uri.port":         {src: srcRequestURI, part: partPort},
	"request.uri.resolve":      {src: srcRequestURI, part: partURI, resolve: true},
	"request.uri.resolve.user": {src: srcRequestURI, part: partUser, resolve: true},
	"request.uri.resolve.host": {src: srcRequestURI, part: partHost, resolve: true},
}

// namedSources are the prefixes of the return variables that name a header, parameter or
// cookie.
var namedSources = [...]struct {
	prefix string
	src    varSource
}{
	{"request.", srcHeader},
	{"parameter.", srcParam},
	{"cookie.", srcCookie},
}

// parseVariable compiles a return="…" expression; see the package documentation for the
// grammar. matchHeader reports that the variable is "request.<header>.match…", whose header
// must be the one the enclosing rule tests.
func parseVariable(s string) (v *variable, matchHeader bool, reason string) {
	if f, ok := fixedVariables[s]; ok {
		return &f, false, ""
	}
	if strings.HasPrefix(s, "request.uri.") {
		return nil, false, "unknown request URI part in return variable " + quote(s)
	}
	for _, ns := range namedSources {
		if rest, ok := strings.CutPrefix(s, ns.prefix); ok {
			v = namedVariable(ns.src, rest)
			if !validName(v.name) {
				return nil, false, "invalid name " + quote(v.name) + " in return variable " + quote(s)
			}
			return v, v.src == srcMatch, ""
		}
	}
	return nil, false, "unknown return variable " + quote(s) +
		" (want match, request.method, request.uri…, request.<header>…, parameter.<name>… or cookie.<name>…)"
}

// namedVariable compiles the rest of a variable of source src: a name and an optional suffix
// (the first of varSuffixes that fits; .match… and .tag only on headers). A header's .match…
// variable reads the matched text.
func namedVariable(src varSource, rest string) *variable {
	v := &variable{src: src, name: rest, part: partWhole}
	for _, suf := range varSuffixes() {
		name, ok := strings.CutSuffix(rest, suf.text)
		if !ok || name == "" {
			continue
		}
		if (suf.match || suf.part == partTag) && src != srcHeader {
			continue
		}
		v.name, v.part, v.resolve = name, suf.part, suf.resolve
		if suf.match {
			v.src = srcMatch
		}
		break
	}
	return v
}

// validName reports whether s is a non-empty token (RFC 3261 / RFC 9110 tchar), the syntax of
// header names, and a sane syntax for cookie and parameter names.
func validName(s string) bool { return tokenOf(s, "!#$%&'*+-.^_`|~") }

func quote(s string) string {
	const max = 80
	if len(s) > max {
		s = s[:max] + "…"
	}
	return `"` + strings.ToValidUTF8(s, "\uFFFD") + `"`
}
