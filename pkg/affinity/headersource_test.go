package affinity_test

import (
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/tether-dev/tether/pkg/affinity"
	"github.com/tether-dev/tether/pkg/affinity/affinitytest"
	"github.com/tether-dev/tether/pkg/registry"
)

// pairs is a HeaderSource over name, value pairs (lower-case names), as the ext_proc server's
// view of Envoy's header list.
type pairs []string

func (p pairs) HeaderValue(name string, i int) (string, bool) {
	for j := 0; j+1 < len(p); j += 2 {
		if p[j] == name {
			if i == 0 {
				return p[j+1], true
			}
			i--
		}
	}
	return "", false
}

func (p pairs) HeaderMap() map[string][]string {
	m := map[string][]string{}
	for j := 0; j+1 < len(p); j += 2 {
		m[p[j]] = append(m[p[j]], p[j+1])
	}
	return m
}

// TestHeaderSource: a request or response whose headers come as a HeaderSource (no map)
// decides as the same headers in a map do — the session cookie found in any Cookie header,
// Header and HeaderMap reading the source.
func TestHeaderSource(t *testing.T) {
	svc := affinitytest.Service("fn", registry.AffinityCookie)
	f := affinitytest.New(t, []registry.Service{svc}, affinitytest.Instances("fn", 3))
	id, inst := newCookieSession(t, f, "fn")

	req := affinitytest.HTTP("fn", "GET", "/")
	req.Headers = nil
	req.HeaderSource = pairs{"accept", "*/*", "cookie", "a=1", "cookie", "b=2; tether-session=" + id, "mcp-method", "ping"}
	if got := req.Header("mcp-method"); got != "ping" {
		t.Errorf("Header(mcp-method) = %q", got)
	}
	if diff := cmp.Diff(map[string][]string{"accept": {"*/*"}, "cookie": {"a=1", "b=2; tether-session=" + id}, "mcp-method": {"ping"}},
		req.HeaderMap()); diff != "" {
		t.Errorf("HeaderMap (-want +got):\n%s", diff)
	}
	for range 3 {
		d := mustDecide(t, f, req)
		if d.Instance().ID != inst || d.NewSession() || d.SessionID() != id {
			t.Fatalf("request went to %s new=%v id=%q; want the session on %s", d.Instance().ID, d.NewSession(), d.SessionID(), inst)
		}
		if hv := d.OnResponse(affinity.Response{Status: 200, HeaderSource: pairs{"content-type", "text/html"}}); len(hv) != 0 {
			t.Errorf("existing session response adds %v", hv)
		}
		d.End()
	}
	resp := affinity.Response{HeaderSource: pairs{"set-cookie", "a=1", "content-type", "text/event-stream"}}
	if got := resp.Header("content-type"); got != "text/event-stream" {
		t.Errorf("Response.Header(content-type) = %q", got)
	}
	// A map, when given, is what counts.
	req.Headers = map[string][]string{"mcp-method": {"tools/list"}}
	if got := req.Header("mcp-method"); got != "tools/list" {
		t.Errorf("with a map: Header(mcp-method) = %q", got)
	}
}
