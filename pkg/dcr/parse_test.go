package dcr_test

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/tether-dev/tether/pkg/dcr"
	"github.com/tether-dev/tether/pkg/dcr/dcrtest"
)

// parseErrorCase is a malformed document and the exact error Parse must give for it as
// "rules.xml".
type parseErrorCase struct {
	name string
	doc  string
	want string
}

// parseErrorCases also seed FuzzParse.
func parseErrorCases() []parseErrorCase {
	return []parseErrorCase{
		{"empty input", "", "rules.xml:1: no <user-centric-rules> root element"},
		{"not XML", "hello", "rules.xml:1: text outside the root element"},
		{"unclosed element",
			"<user-centric-rules>\n<sip-rules>\n<or>\n</sip-rules>\n</user-centric-rules>\n",
			"rules.xml:4: XML syntax error: element <or> closed by </sip-rules>"},
		{"truncated file",
			"<user-centric-rules>\n<sip-rules>\n",
			"rules.xml:3: XML syntax error: unexpected EOF"},
		{"wrong root", "<?xml version=\"1.0\"?>\n<rules/>\n", "rules.xml:2: root element is <rules>, want <user-centric-rules>"},
		{"second root", "<user-centric-rules/>\n<user-centric-rules/>", "rules.xml:2: second root element <user-centric-rules>"},
		{"unknown section",
			"<user-centric-rules>\n  <sip-rules/>\n  <smtp-rules/>\n</user-centric-rules>",
			"rules.xml:3: unexpected <smtp-rules> in <user-centric-rules> (want <sip-rules> or <http-rules>)"},
		{"duplicate section",
			"<user-centric-rules>\n<http-rules/>\n<http-rules/>\n</user-centric-rules>",
			"rules.xml:3: duplicate <http-rules>"},
		{"unknown rule element",
			"<user-centric-rules>\n<sip-rules>\n\n  <xor/>\n</sip-rules>\n</user-centric-rules>",
			"rules.xml:4: unexpected <xor> in <sip-rules> (want or, and, if, header, request-uri, cookie or session-case)"},
		{"empty or",
			"<user-centric-rules><http-rules>\n<or>\n</or></http-rules></user-centric-rules>",
			"rules.xml:2: <or> needs at least one rule"},
		{"header without name",
			"<user-centric-rules><sip-rules>\n<header return=\"request.From\"><exist/></header>\n</sip-rules></user-centric-rules>",
			"rules.xml:2: <header> needs a name attribute"},
		{"header with two conditions",
			"<user-centric-rules><sip-rules>\n<header name=\"From\">\n<exist/>\n<notexist/>\n</header></sip-rules></user-centric-rules>",
			"rules.xml:2: <header> needs exactly one condition: <exist/>, <notexist/> or <match>"},
		{"unknown condition",
			"<user-centric-rules><sip-rules>\n<header name=\"From\">\n  <present/>\n</header></sip-rules></user-centric-rules>",
			"rules.xml:3: unexpected <present> in <header> (want <exist/>, <notexist/> or <match>)"},
		{"unknown attribute",
			"<user-centric-rules><sip-rules>\n<header name=\"From\" retrun=\"request.From\"><exist/></header></sip-rules></user-centric-rules>",
			`rules.xml:2: unknown attribute "retrun" on <header>`},
		{"unknown variable",
			"<user-centric-rules><sip-rules>\n\n<header name=\"From\" return=\"response.From\"><exist/></header></sip-rules></user-centric-rules>",
			`rules.xml:3: unknown return variable "response.From" (want match, request.method, request.uri…, request.<header>…, parameter.<name>… or cookie.<name>…)`},
		{"bad request.uri part",
			"<user-centric-rules><sip-rules>\n<header name=\"From\" return=\"request.uri.password\"><exist/></header></sip-rules></user-centric-rules>",
			`rules.xml:2: unknown request URI part in return variable "request.uri.password"`},
		{"match variable without match",
			"<user-centric-rules><sip-rules>\n<header name=\"From\" return=\"match\"><exist/></header></sip-rules></user-centric-rules>",
			`rules.xml:2: return variable "match" needs a <match> condition`},
		{"header match variable on another header",
			"<user-centric-rules><sip-rules>\n<header name=\"From\" return=\"request.To.match\"><match>x</match></header></sip-rules></user-centric-rules>",
			`rules.xml:2: return variable "request.To.match" must be used in <header name="To"> with <match>`},
		{"invalid regexp",
			"<user-centric-rules><sip-rules>\n<header name=\"From\">\n  <match>(unclosed</match>\n</header></sip-rules></user-centric-rules>",
			"rules.xml:3: <match> pattern: error parsing regexp: missing closing ): `(unclosed`"},
		{"empty match",
			"<user-centric-rules><sip-rules>\n<header name=\"From\"><match>  </match></header></sip-rules></user-centric-rules>",
			"rules.xml:2: <match> needs a regular expression"},
		{"request-uri exist without parameter",
			"<user-centric-rules><http-rules>\n<request-uri return=\"request.uri\"><exist/></request-uri></http-rules></user-centric-rules>",
			"rules.xml:2: <request-uri> needs a parameter attribute"},
		{"bad session case value",
			"<user-centric-rules><sip-rules>\n<session-case>\n<equal>originating</equal>\n</session-case></sip-rules></user-centric-rules>",
			`rules.xml:3: <equal> is "originating", want ORIGINATING or TERMINATING (case-sensitive)`},
		{"session case without equal",
			"<user-centric-rules><sip-rules>\n<session-case><header name=\"From\"><exist/></header></session-case></sip-rules></user-centric-rules>",
			"rules.xml:2: <session-case> must start with <equal>ORIGINATING</equal> or <equal>TERMINATING</equal>"},
		{"text in exist",
			"<user-centric-rules><sip-rules>\n<header name=\"From\"><exist>\nyes</exist></header></sip-rules></user-centric-rules>",
			"rules.xml:2: <exist/> must be empty"},
		{"stray text",
			"<user-centric-rules>\n<sip-rules>\n  oops\n</sip-rules></user-centric-rules>",
			"rules.xml:2: unexpected text in <sip-rules>"},
		{"invalid header name",
			"<user-centric-rules><sip-rules>\n<header name=\"Fr om\"><exist/></header></sip-rules></user-centric-rules>",
			`rules.xml:2: <header name="Fr om"> is not a valid name`},
		{"unsupported encoding",
			"<?xml version=\"1.0\" encoding=\"EBCDIC\"?>\n<user-centric-rules/>",
			`rules.xml:1: XML error: xml: opening charset "EBCDIC": unsupported encoding "EBCDIC" (use UTF-8 or ISO-8859-1)`},
		{"undefined entity",
			"<user-centric-rules>\n<sip-rules>&nope;</sip-rules></user-centric-rules>",
			"rules.xml:2: XML syntax error: invalid character entity &nope;"},
	}
}

func TestParseErrors(t *testing.T) {
	for _, tt := range parseErrorCases() {
		t.Run(tt.name, func(t *testing.T) {
			r, err := dcr.Parse(strings.NewReader(tt.doc), "rules.xml")
			if err == nil {
				t.Fatalf("Parse succeeded (%v), want error %q", r, tt.want)
			}
			if diff := cmp.Diff(tt.want, err.Error()); diff != "" {
				t.Errorf("error (-want +got):\n%s", diff)
			}
			var de *dcr.Error
			if !errors.As(err, &de) {
				t.Fatalf("error %T is not a *dcr.Error", err)
			}
			if de.File != "rules.xml" || de.Line < 1 {
				t.Errorf("Error{File: %q, Line: %d}", de.File, de.Line)
			}
		})
	}
}

func TestParseLimits(t *testing.T) {
	t.Run("depth", func(t *testing.T) {
		doc := "<user-centric-rules><sip-rules>" + strings.Repeat("<or>\n", dcr.MaxDepth) +
			`<header name="a"><exist/></header>` + strings.Repeat("</or>", dcr.MaxDepth) + "</sip-rules></user-centric-rules>"
		_, err := dcr.Parse(strings.NewReader(doc), "deep.xml")
		if err == nil || !strings.Contains(err.Error(), "nested deeper than") {
			t.Fatalf("err = %v, want a nesting error", err)
		}
		var de *dcr.Error
		if !errors.As(err, &de) || de.Line != dcr.MaxDepth-1 {
			t.Errorf("err = %v, want line %d", err, dcr.MaxDepth-1)
		}
	})
	t.Run("size", func(t *testing.T) {
		doc := "<user-centric-rules><!--" + strings.Repeat("x", dcr.MaxFileSize) + "--></user-centric-rules>"
		_, err := dcr.Parse(strings.NewReader(doc), "big.xml")
		if err == nil || !strings.Contains(err.Error(), "file larger than") {
			t.Fatalf("err = %v, want a size error", err)
		}
	})
}

func TestParseAccepts(t *testing.T) {
	tests := []struct {
		name string
		doc  string
	}{
		{"empty root", "<user-centric-rules/>"},
		{"empty sections", "<user-centric-rules><http-rules/><sip-rules></sip-rules></user-centric-rules>"},
		{"comments and processing instructions", "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<!-- c -->\n<user-centric-rules><!-- x --><sip-rules><?pi x?></sip-rules></user-centric-rules>\n<!-- after -->\n"},
		{"namespace declaration", `<user-centric-rules xmlns="urn:example"><sip-rules/></user-centric-rules>`},
		{"latin-1 text", "<?xml version=\"1.0\" encoding=\"ISO-8859-1\"?><user-centric-rules><sip-rules><header name=\"X\"><match>caf\xe9</match></header></sip-rules></user-centric-rules>"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if _, err := dcr.Parse(strings.NewReader(tt.doc), "ok.xml"); err != nil {
				t.Fatalf("Parse: %v", err)
			}
		})
	}
}

// TestParseLatin1 checks that an ISO-8859-1 file's non-ASCII text is decoded, not mangled.
func TestParseLatin1(t *testing.T) {
	doc := "<?xml version=\"1.0\" encoding=\"ISO-8859-1\"?><user-centric-rules><sip-rules>" +
		"<header name=\"Subject\" return=\"match\"><match>caf\xe9 (\\w+)</match></header></sip-rules></user-centric-rules>"
	rules := mustParse(t, doc)
	key, ok := rules.Key(mustSIP(t, dcrtest.Request{Headers: [][2]string{{"Subject", "café ouvert"}}}))
	if !ok || key != "ouvert" {
		t.Errorf("Key = %q, %v; want ouvert", key, ok)
	}
}

func TestLoad(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "data-centric-rules.xml")
	if err := os.WriteFile(path, []byte(dcrtest.ExampleRules), 0o644); err != nil {
		t.Fatal(err)
	}
	r, err := dcr.Load(path)
	if err != nil {
		t.Fatalf("Load: %v", err)
	}
	if r.File() != path {
		t.Errorf("File() = %q, want %q", r.File(), path)
	}
	if _, err := dcr.Load(filepath.Join(dir, "missing.xml")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("Load(missing) = %v, want ErrNotExist", err)
	}
	bad := filepath.Join(dir, "bad.xml")
	if err := os.WriteFile(bad, []byte("<user-centric-rules>\n<sip-rules>\n<bogus/>\n</sip-rules>\n</user-centric-rules>\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	_, err = dcr.Load(bad)
	if want := bad + ":3: unexpected <bogus>"; err == nil || !strings.HasPrefix(err.Error(), want) {
		t.Errorf("Load(bad) = %v, want prefix %q", err, want)
	}
}
