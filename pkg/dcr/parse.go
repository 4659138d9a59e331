package dcr

import (
	"bufio"
	"encoding/xml"
	"errors"
	"fmt"
	"io"
	"os"
	"regexp"
	"strings"
	"unicode/utf8"
)

// Limits that keep hostile files from exhausting memory or the stack.
const (
	// MaxFileSize is the largest rules file Parse accepts, in bytes.
	MaxFileSize = 1 << 20
	// MaxDepth is the deepest element nesting Parse accepts.
	MaxDepth = 32
	// maxPattern bounds a <match> pattern's length in bytes.
	maxPattern = 4096
)

// Error is a problem in a rules file, at a 1-based line.
type Error struct {
	File   string
	Line   int
	Reason string
}

// Error formats the problem as "file:line: reason".
func (e *Error) Error() string { return fmt.Sprintf("%s:%d: %s", e.File, e.Line, e.Reason) }

// Load reads and parses the rules file at path.
func Load(path string) (*Rules, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("dcr: %w", err)
	}
	defer func() { _ = f.Close() }() // opened read-only: closing cannot lose data
	return Parse(f, path)
}

// Parse reads a data-centric-rules.xml document from r. filename is used in error messages,
// which have the form "file:line: reason" and are *Error values (errors.As). Parse validates
// the whole document (elements, attributes, conditions, return variables, regular expressions)
// and never panics, whatever r holds.
func Parse(r io.Reader, filename string) (*Rules, error) {
	if filename == "" {
		filename = "<input>"
	}
	p := &parser{file: filename}
	root, err := p.readTree(r)
	if err != nil {
		return nil, err
	}
	rules := &Rules{file: filename}
	if err := p.compileRoot(root, rules); err != nil {
		return nil, err
	}
	return rules, nil
}

// element is one XML element of the document tree.
type element struct {
	name     string
	line     int
	attrs    []xml.Attr
	children []*element
	text     strings.Builder
	// textLine is the line of the first non-space text directly inside the element (0: none).
	textLine int
}

type parser struct {
	file string
}

func (p *parser) errorf(line int, format string, args ...any) error {
	if line < 1 {
		line = 1
	}
	return &Error{File: p.file, Line: line, Reason: fmt.Sprintf(format, args...)}
}

// readTree builds the element tree, enforcing well-formedness, MaxFileSize and MaxDepth.
func (p *parser) readTree(r io.Reader) (*element, error) {
	lim := &limitReader{r: r, n: MaxFileSize + 1}
	d := xml.NewDecoder(bufio.NewReader(lim))
	d.Strict = true
	d.CharsetReader = charsetReader
	t := &treeBuilder{p: p}
	for {
		line, _ := d.InputPos()
		tok, err := d.Token()
		if lim.n <= 0 {
			return nil, p.errorf(line, "file larger than %d bytes", MaxFileSize)
		}
		if errors.Is(err, io.EOF) {
			return t.finish(line)
		}
		if err != nil {
			var se *xml.SyntaxError
			if errors.As(err, &se) {
				return nil, p.errorf(se.Line, "XML syntax error: %s", se.Msg)
			}
			return nil, p.errorf(line, "XML error: %v", err)
		}
		if err := t.add(tok, line); err != nil {
			return nil, err
		}
	}
}

// treeBuilder is readTree's state: the root element once seen, and the open elements.
type treeBuilder struct {
	p     *parser
	root  *element
	stack []*element
}

// add takes one token read at line.
func (t *treeBuilder) add(tok xml.Token, line int) error {
	switch tok := tok.(type) {
	case xml.StartElement:
		return t.start(tok, line)
	case xml.EndElement:
		t.stack = t.stack[:len(t.stack)-1]
	case xml.CharData:
		return t.text(tok, line)
	}
	return nil
}

// start opens an element: the root, or a child of the innermost open element.
func (t *treeBuilder) start(tok xml.StartElement, line int) error {
	if len(t.stack) >= MaxDepth {
		return t.p.errorf(line, "elements nested deeper than %d", MaxDepth)
	}
	e := &element{name: tok.Name.Local, line: line}
	for _, a := range tok.Attr {
		if a.Name.Space == "xmlns" || a.Name.Local == "xmlns" || a.Name.Space != "" {
			continue // namespace declarations and foreign attributes
		}
		e.attrs = append(e.attrs, a)
	}
	if len(t.stack) == 0 {
		if t.root != nil {
			return t.p.errorf(line, "second root element <%s>", e.name)
		}
		t.root = e
	} else {
		parent := t.stack[len(t.stack)-1]
		parent.children = append(parent.children, e)
	}
	t.stack = append(t.stack, e)
	return nil
}

// text adds character data to the innermost open element (up to maxPattern+1 bytes); outside
// the root only white space may stand.
func (t *treeBuilder) text(tok xml.CharData, line int) error {
	if len(t.stack) == 0 {
		if len(strings.TrimSpace(string(tok))) > 0 {
			return t.p.errorf(line, "text outside the root element")
		}
		return nil
	}
	e := t.stack[len(t.stack)-1]
	if e.textLine == 0 && strings.TrimSpace(string(tok)) != "" {
		e.textLine = line
	}
	if e.text.Len() < maxPattern+1 {
		e.text.Write(tok)
	}
	return nil
}

// finish ends the tree at the end of the file (line).
func (t *treeBuilder) finish(line int) (*element, error) {
	if t.root == nil {
		return nil, t.p.errorf(line, "no <user-centric-rules> root element")
	}
	if len(t.stack) > 0 {
		return nil, t.p.errorf(line, "unexpected end of file inside <%s>", t.stack[len(t.stack)-1].name)
	}
	return t.root, nil
}

// limitReader is io.LimitReader that lets the caller see whether the limit was reached.
type limitReader struct {
	r io.Reader
	n int64
}

func (l *limitReader) Read(b []byte) (int, error) {
	if l.n <= 0 {
		return 0, io.EOF
	}
	if int64(len(b)) > l.n {
		b = b[:l.n]
	}
	n, err := l.r.Read(b)
	l.n -= int64(n)
	return n, err
}

// charsetReader accepts the encodings a DCR file plausibly declares: UTF-8, US-ASCII and
// ISO-8859-1 (the documented example's declaration).
func charsetReader(label string, input io.Reader) (io.Reader, error) {
	switch strings.ToLower(label) {
	case "utf-8", "utf8", "us-ascii", "ascii":
		return input, nil
	case "iso-8859-1", "iso8859-1", "latin1", "latin-1", "l1":
		return &latin1Reader{r: bufio.NewReader(input)}, nil
	}
	return nil, fmt.Errorf("unsupported encoding %q (use UTF-8 or ISO-8859-1)", label)
}

// latin1Reader converts ISO-8859-1 bytes to UTF-8.
type latin1Reader struct {
	r   io.ByteReader
	buf []byte
}

func (l *latin1Reader) Read(p []byte) (int, error) {
	n := 0
	for n < len(p) {
		if len(l.buf) > 0 {
			c := copy(p[n:], l.buf)
			l.buf = l.buf[c:]
			n += c
			continue
		}
		b, err := l.r.ReadByte()
		if err != nil {
			if n > 0 {
				return n, nil
			}
			return 0, err
		}
		if b < utf8.RuneSelf {
			p[n] = b
			n++
			continue
		}
		l.buf = utf8.AppendRune(l.buf[:0], rune(b))
	}
	return n, nil
}

func (p *parser) compileRoot(root *element, rules *Rules) error {
	if root.name != "user-centric-rules" {
		return p.errorf(root.line, "root element is <%s>, want <user-centric-rules>", root.name)
	}
	if err := p.checkAttrs(root); err != nil {
		return err
	}
	if err := p.noText(root); err != nil {
		return err
	}
	var seenSIP, seenHTTP bool
	for _, c := range root.children {
		var seen *bool
		var dst *[]*node
		switch c.name {
		case "sip-rules":
			seen, dst = &seenSIP, &rules.sip
		case "http-rules":
			seen, dst = &seenHTTP, &rules.http
		default:
			return p.errorf(c.line, "unexpected <%s> in <user-centric-rules> (want <sip-rules> or <http-rules>)", c.name)
		}
		if *seen {
			return p.errorf(c.line, "duplicate <%s>", c.name)
		}
		*seen = true
		if err := p.checkAttrs(c); err != nil {
			return err
		}
		if err := p.noText(c); err != nil {
			return err
		}
		list, err := p.compileRules(c, c.children)
		if err != nil {
			return err
		}
		*dst = list
	}
	return nil
}

func (p *parser) compileRules(parent *element, list []*element) ([]*node, error) {
	out := make([]*node, 0, len(list))
	for _, c := range list {
		n, err := p.compileRule(parent, c)
		if err != nil {
			return nil, err
		}
		out = append(out, n)
	}
	return out, nil
}

func (p *parser) compileRule(parent, e *element) (*node, error) {
	n := &node{line: e.line}
	switch e.name {
	case "or", "and", "if":
		switch e.name {
		case "or":
			n.kind = kindOr
		case "and":
			n.kind = kindAnd
		default:
			n.kind = kindIf
		}
		if err := p.checkAttrs(e); err != nil {
			return nil, err
		}
		if err := p.noText(e); err != nil {
			return nil, err
		}
		if len(e.children) == 0 {
			return nil, p.errorf(e.line, "<%s> needs at least one rule", e.name)
		}
		var err error
		if n.children, err = p.compileRules(e, e.children); err != nil {
			return nil, err
		}
		return n, nil
	case "session-case":
		return p.compileSessionCase(e)
	case "header", "cookie", "request-uri":
		return p.compileTest(e)
	}
	return nil, p.errorf(e.line, "unexpected <%s> in <%s> (want or, and, if, header, request-uri, cookie or session-case)", e.name, parent.name)
}

func (p *parser) compileSessionCase(e *element) (*node, error) {
	n := &node{kind: kindSessionCase, line: e.line}
	if err := p.checkAttrs(e); err != nil {
		return nil, err
	}
	if err := p.noText(e); err != nil {
		return nil, err
	}
	if len(e.children) == 0 || e.children[0].name != "equal" {
		return nil, p.errorf(e.line, "<session-case> must start with <equal>ORIGINATING</equal> or <equal>TERMINATING</equal>")
	}
	eq := e.children[0]
	if err := p.checkAttrs(eq); err != nil {
		return nil, err
	}
	if len(eq.children) > 0 {
		return nil, p.errorf(eq.children[0].line, "<equal> holds text only")
	}
	switch v := strings.TrimSpace(eq.text.String()); v {
	case string(SessionCaseOriginating), string(SessionCaseTerminating):
		n.sc = SessionCase(v)
	default:
		return nil, p.errorf(eq.line, "<equal> is %s, want ORIGINATING or TERMINATING (case-sensitive)", quote(v))
	}
	var err error
	if n.children, err = p.compileRules(e, e.children[1:]); err != nil {
		return nil, err
	}
	return n, nil
}

// compileTest compiles <header>, <cookie> and <request-uri>.
func (p *parser) compileTest(e *element) (*node, error) {
	n := &node{line: e.line}
	nameAttr := "name"
	switch e.name {
	case "header":
		n.kind = kindHeader
	case "cookie":
		n.kind = kindCookie
	case "request-uri":
		n.kind, nameAttr = kindRequestURI, "parameter"
	}
	if err := p.checkAttrs(e, nameAttr, "return"); err != nil {
		return nil, err
	}
	if err := p.noText(e); err != nil {
		return nil, err
	}
	name, hasName := attr(e, nameAttr)
	if hasName && !validName(name) {
		return nil, p.errorf(e.line, "<%s %s=%s> is not a valid name", e.name, nameAttr, quote(name))
	}
	n.name = name
	if len(e.children) != 1 {
		return nil, p.errorf(e.line, "<%s> needs exactly one condition: <exist/>, <notexist/> or <match>", e.name)
	}
	if err := p.compileCondition(n, e, e.children[0]); err != nil {
		return nil, err
	}
	if !hasName && (e.name != "request-uri" || n.cond != condMatch) {
		return nil, p.errorf(e.line, "<%s> needs a %s attribute", e.name, nameAttr)
	}
	if ret, ok := attr(e, "return"); ok {
		if err := p.compileReturn(n, e, ret); err != nil {
			return nil, err
		}
	}
	return n, nil
}

// compileCondition compiles c, the one condition of test e, into n.
func (p *parser) compileCondition(n *node, e, c *element) error {
	if err := p.checkAttrs(c); err != nil {
		return err
	}
	if len(c.children) > 0 {
		return p.errorf(c.children[0].line, "<%s> holds no elements", c.name)
	}
	switch c.name {
	case "exist", "notexist":
		if c.textLine != 0 {
			return p.errorf(c.textLine, "<%s/> must be empty", c.name)
		}
		n.cond = condExist
		if c.name == "notexist" {
			n.cond = condNotExist
		}
	case "match":
		n.cond = condMatch
		pat := strings.TrimSpace(c.text.String())
		if pat == "" {
			return p.errorf(c.line, "<match> needs a regular expression")
		}
		if len(pat) > maxPattern {
			return p.errorf(c.line, "<match> pattern longer than %d bytes", maxPattern)
		}
		re, err := regexp.Compile(pat)
		if err != nil {
			return p.errorf(c.line, "<match> pattern: %v", err)
		}
		n.re = re
	default:
		return p.errorf(c.line, "unexpected <%s> in <%s> (want <exist/>, <notexist/> or <match>)", c.name, e.name)
	}
	return nil
}

// compileReturn compiles test e's return variable ret into n, whose condition is compiled.
func (p *parser) compileReturn(n *node, e *element, ret string) error {
	v, matchHeader, reason := parseVariable(ret)
	if reason != "" {
		return p.errorf(e.line, "%s", reason)
	}
	if v.src == srcMatch && n.cond != condMatch {
		return p.errorf(e.line, "return variable %s needs a <match> condition", quote(ret))
	}
	if matchHeader && (n.kind != kindHeader || !strings.EqualFold(v.name, n.name)) {
		return p.errorf(e.line, "return variable %s must be used in <header name=%s> with <match>", quote(ret), quote(v.name))
	}
	n.ret = v
	return nil
}

// checkAttrs rejects attributes other than allowed, and duplicates.
func (p *parser) checkAttrs(e *element, allowed ...string) error {
	for i, a := range e.attrs {
		ok := false
		for _, name := range allowed {
			if a.Name.Local == name {
				ok = true
			}
		}
		if !ok {
			return p.errorf(e.line, "unknown attribute %s on <%s>", quote(a.Name.Local), e.name)
		}
		for _, b := range e.attrs[:i] {
			if b.Name.Local == a.Name.Local {
				return p.errorf(e.line, "duplicate attribute %s on <%s>", quote(a.Name.Local), e.name)
			}
		}
	}
	return nil
}

func (p *parser) noText(e *element) error {
	if e.textLine != 0 {
		return p.errorf(e.textLine, "unexpected text in <%s>", e.name)
	}
	return nil
}

func attr(e *element, name string) (string, bool) {
	for _, a := range e.attrs {
		if a.Name.Local == name {
			return a.Value, true
		}
	}
	return "", false
}
