package dcr_test

import (
	"strings"
	"testing"

	"github.com/tether-dev/tether/pkg/dcr"
)

// TestNewSIPMessageAgreesWithParseSIP: a message built from fields answers every Message
// method as the same request written out and parsed does.
func TestNewSIPMessageAgreesWithParseSIP(t *testing.T) {
	headers := map[string][]string{
		"from":                {`"Alice" <sip:alice@example.com>;tag=a73kszlfl`},
		"to":                  {"<sip:bob@example.com>"},
		"call-id":             {"f81d4fae-7dec-11d0-a765-00a0c91e6bf6@host"},
		"p-asserted-identity": {"<sip:+15551234@example.com;user=phone>, <tel:+15551234>"},
		"p-served-user":       {"<sip:alice@example.com>;sescase=orig;regstate=reg"},
		"x-tenant":            {"blue"},
	}
	uri := "sip:bob@example.com;transport=tcp?subject=hi"
	var raw strings.Builder
	raw.WriteString("INVITE " + uri + " SIP/2.0\r\n")
	for _, name := range []string{"call-id", "from", "p-asserted-identity", "p-served-user", "to", "x-tenant"} {
		raw.WriteString(name + ": " + headers[name][0] + "\r\n")
	}
	raw.WriteString("\r\n")
	want, err := dcr.ParseSIP([]byte(raw.String()))
	if err != nil {
		t.Fatal(err)
	}
	got, err := dcr.NewSIPMessage("INVITE", uri, headers)
	if err != nil {
		t.Fatal(err)
	}
	if got.Method() != want.Method() || got.RequestURI() != want.RequestURI() || got.CallID() != want.CallID() ||
		got.FromTag() != want.FromTag() || got.ToTag() != want.ToTag() || got.SessionCase() != want.SessionCase() ||
		dcr.DefaultSIPKey(got) != dcr.DefaultSIPKey(want) || dcr.DefaultSIPKey(got) == "" {
		t.Errorf("fields message %q/%q/%q/%q/%v, parsed %q/%q/%q/%q/%v", got.Method(), got.RequestURI(), got.CallID(), got.FromTag(), got.SessionCase(),
			want.Method(), want.RequestURI(), want.CallID(), want.FromTag(), want.SessionCase())
	}
	for _, h := range []string{"From", "f", "To", "Call-ID", "i", "P-Asserted-Identity", "P-Served-User", "X-Tenant", "Via"} {
		gv, gok := got.Header(h)
		wv, wok := want.Header(h)
		if gv != wv || gok != wok {
			t.Errorf("Header(%s) = %q, %v; parsed %q, %v", h, gv, gok, wv, wok)
		}
	}
	for _, p := range []string{"transport", "subject", "user"} {
		gv, gok := got.Param(p)
		wv, wok := want.Param(p)
		if gv != wv || gok != wok {
			t.Errorf("Param(%s) = %q, %v; parsed %q, %v", p, gv, gok, wv, wok)
		}
	}

	for _, bad := range []struct {
		name, method, uri string
		headers           map[string][]string
	}{
		{"empty method", "", uri, headers},
		{"method with a space", "IN VITE", uri, headers},
		{"bad URI", "INVITE", "not a uri", headers},
		{"header value spanning lines", "INVITE", uri, map[string][]string{"from": {"<sip:a@x>;tag=1\r\nVia: evil"}}},
		{"bad header name", "INVITE", uri, map[string][]string{"fr om": {"<sip:a@x>"}}},
		{"bad From", "INVITE", uri, map[string][]string{"from": {"<sip:"}}},
	} {
		if _, err := dcr.NewSIPMessage(bad.method, bad.uri, bad.headers); err == nil {
			t.Errorf("%s: no error", bad.name)
		}
	}
}
