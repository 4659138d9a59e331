package api_test

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strconv"
	"strings"
	"testing"

	"github.com/tether-dev/tether/pkg/affinity/affinitytest"
	"github.com/tether-dev/tether/pkg/api"
	"github.com/tether-dev/tether/pkg/registry"
	"github.com/tether-dev/tether/pkg/wire"
)

// fuzzHandler is the API handler over a real engine with a cookie service "web" and a header
// service "hdr", each on three instances.
func fuzzHandler(f *testing.F) http.Handler {
	svcs := []registry.Service{affinitytest.Service("web", registry.AffinityCookie), affinitytest.Service("hdr", registry.AffinityHeader)}
	svcs[1].Match.PathPrefix = "/hdr"
	insts := append(affinitytest.Instances("web", 3), affinitytest.Instances("hdr", 3)...)
	fx := affinitytest.New(f, svcs, insts)
	return api.NewServer(fx.Registry, api.WithEngine(fx.Engine)).Handler()
}

func do(h http.Handler, method, target, body string) *httptest.ResponseRecorder {
	req := httptest.NewRequest(method, target, strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set(wire.ClientHeader, "fuzz")
	req.Host = "localhost"
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	return rec
}

// FuzzSessionJSON sends arbitrary JSON bodies to CreateSession and UpdateSession (PUT and
// PATCH) on both services: every answer is a 2xx or a 4xx with a JSON error, never a 5xx; a
// session that create answered 201 for is then found Active by GET, one that PUT or PATCH
// answered 200 for is found, and one that DELETE answered 200 for is no longer Active.
func FuzzSessionJSON(f *testing.F) {
	for _, s := range []string{
		`{}`, `{"instance":"i1"}`, `{"id":"client-chosen-1","attributes":{"user":"u1"}}`, `{"ttl":"30s","idleTimeout":"10s"}`,
		`{"ttl":"-1s"}`, `{"instance":"nope"}`, `{"attributes":{"":"x"}}`, `{"id":"\u0000"}`, `[`, `null`, `{"ttl":1e400}`,
		`{"disableReuse":true,"attributes":{"a":"` + strings.Repeat("b", 20000) + `"}}`,
	} {
		f.Add(s, s, false)
	}
	h := fuzzHandler(f)
	f.Fuzz(func(t *testing.T, create, update string, hdr bool) {
		svc := "web"
		if hdr {
			svc = "hdr"
		}
		check := func(what string, rec *httptest.ResponseRecorder) {
			// 503 Unavailable is the documented answer when every instance is full.
			full := rec.Code == http.StatusServiceUnavailable && strings.Contains(rec.Body.String(), "Unavailable")
			if !full && (rec.Code >= 500 || rec.Code < 200 || rec.Code >= 300 && rec.Code < 400) {
				t.Fatalf("%s: status %d: %s", what, rec.Code, rec.Body.String())
			}
			if rec.Code >= 400 && !strings.Contains(rec.Header().Get("Content-Type"), "json") {
				t.Fatalf("%s: %d without a JSON error body", what, rec.Code)
			}
		}
		rec := do(h, http.MethodPost, "/v1/services/"+svc+"/sessions", create)
		check("create", rec)
		id := "s-fuzz"
		if rec.Code == http.StatusCreated {
			var s struct {
				ID string `json:"id"`
			}
			if err := json.Unmarshal(rec.Body.Bytes(), &s); err != nil || s.ID == "" {
				t.Fatalf("create answered 201 with %q (%v)", rec.Body.String(), err)
			}
			id = s.ID
		}
		item := "/v1/services/" + svc + "/sessions/" + url.PathEscape(id)
		// get answers the id and status of the session as GET reads it, or "" when GET finds
		// none.
		get := func(what string) (string, string) {
			rec := do(h, http.MethodGet, item, "")
			if rec.Code == http.StatusNotFound {
				return "", ""
			}
			var s struct {
				ID     string `json:"id"`
				Status string `json:"status"`
			}
			if rec.Code != http.StatusOK || json.Unmarshal(rec.Body.Bytes(), &s) != nil {
				t.Fatalf("GET after %s: %d %s", what, rec.Code, rec.Body.String())
			}
			return s.ID, s.Status
		}
		if got, st := get("create"); rec.Code == http.StatusCreated && (got != id || st != "SESSION_STATUS_ACTIVE") {
			t.Fatalf("session %q answered 201 but GET finds %q %q", id, got, st)
		}
		for _, m := range []string{http.MethodPut, http.MethodPatch} {
			rec := do(h, m, item, update)
			check(m, rec)
			if got, _ := get(m); rec.Code == http.StatusOK && got != id {
				t.Fatalf("%s of %q answered 200 but GET does not find it", m, id)
			}
		}
		rec = do(h, http.MethodDelete, item, "")
		check("delete", rec)
		if rec.Code == http.StatusOK {
			if got, st := get("delete"); got != "" && st == "SESSION_STATUS_ACTIVE" {
				t.Fatalf("session %q still active after DELETE answered 200", got)
			}
		}
	})
}

// FuzzListPageToken lists sessions with arbitrary page tokens and filters: 200 or 400, never
// a 5xx. From whatever page a 200 starts, following the server's own page tokens always
// succeeds and ends, and the pages together list sessions in strictly increasing id order
// (none twice), no page longer than the limit, each matching the instance and status
// filters.
func FuzzListPageToken(f *testing.F) {
	f.Add("", "", "2", "")
	f.Add("djE6d2ViOnMx", "Active", "1", "i1")
	f.Add("\x00\xff", "Bogus", "-1", "")
	f.Add("", "session_status_active", "1", "i2")
	h := fuzzHandler(f)
	for range 5 {
		do(h, http.MethodPost, "/v1/services/web/sessions", `{}`)
	}
	f.Fuzz(func(t *testing.T, token, status, limit, instance string) {
		q := url.Values{"pageToken": {token}, "status": {status}, "limit": {limit}, "instance": {instance}}
		rec := do(h, http.MethodGet, "/v1/services/web/sessions?"+q.Encode(), "")
		if rec.Code != http.StatusOK && rec.Code != http.StatusBadRequest {
			t.Fatalf("status %d: %s", rec.Code, rec.Body.String())
		}
		if rec.Code != http.StatusOK {
			return
		}
		// The status filter takes a name in any case, with or without the enum's prefix.
		wantStatus := strings.TrimPrefix(strings.ToUpper(status), "SESSION_STATUS_")
		if wantStatus == "UNSPECIFIED" {
			wantStatus = ""
		}
		n, _ := strconv.Atoi(limit)
		last := ""
		for pages := 0; ; pages++ {
			var page struct {
				Sessions []struct {
					ID       string `json:"id"`
					Instance string `json:"instance"`
					Status   string `json:"status"`
				} `json:"sessions"`
				NextPageToken string `json:"nextPageToken"`
			}
			if err := json.Unmarshal(rec.Body.Bytes(), &page); err != nil {
				t.Fatalf("list answered 200 with %q (%v)", rec.Body.String(), err)
			}
			if n > 0 && len(page.Sessions) > n {
				t.Fatalf("page of %d sessions for limit %d", len(page.Sessions), n)
			}
			for _, s := range page.Sessions {
				if s.ID <= last {
					t.Fatalf("session %q listed after %q", s.ID, last)
				}
				last = s.ID
				if instance != "" && s.Instance != instance || wantStatus != "" && s.Status != "SESSION_STATUS_"+wantStatus {
					t.Fatalf("session %s on %q, %s listed for instance %q, status %q", s.ID, s.Instance, s.Status, instance, status)
				}
			}
			next := page.NextPageToken
			if next == "" {
				return
			}
			if pages > 10 { // 5 sessions
				t.Fatalf("still a next page after %d pages", pages)
			}
			q.Set("pageToken", next)
			if rec = do(h, http.MethodGet, "/v1/services/web/sessions?"+q.Encode(), ""); rec.Code != http.StatusOK {
				t.Fatalf("the server's own page token %q refused: %d %s", next, rec.Code, rec.Body.String())
			}
		}
	})
}
