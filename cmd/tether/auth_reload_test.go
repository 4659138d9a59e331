package main

import (
	"net/http"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/tether-dev/tether/internal/testutil"
)

// TestReloadRemovesTokensAtOnce is the regression test for the SIGHUP finding of issue 14 (a
// token removed from the config kept working until restart): after the reload the removed
// token gets 401 on the very next request, the kept one still works, and an added one works.
func TestReloadRemovesTokensAtOnce(t *testing.T) {
	path := filepath.Join(t.TempDir(), "tether.yaml")
	const base = "apiVersion: tether/v1\nregistry: {allowedNetworks: [127.0.0.1/32]}\nlisteners: {api: 127.0.0.1:0, extProc: '', xds: '', sip: ''}\nservices: [{name: web}]\nauth:\n  tokens:\n"
	tok := func(name string) string {
		return "  - {name: " + name + ", token: " + name + "-secret, services: ['*'], access: write}\n"
	}
	writeFile(t, path, base+tok("old")+tok("kept"))
	srv := serveFor(t, path)
	info, reload, logs := srv.serveInfo, srv.reload, srv.logs
	status := func(token string) int {
		req, err := http.NewRequest(http.MethodGet, "http://"+info.apiAddr+"/v1/services/web/instances", nil)
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Authorization", "Bearer "+token)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		_ = resp.Body.Close()
		return resp.StatusCode
	}
	if got := status("old-secret"); got != http.StatusOK {
		t.Fatalf("old token before the reload: %d, want 200", got)
	}
	writeFile(t, path, base+tok("kept")+tok("new"))
	reload <- syscall.SIGHUP
	waitFor(t, "reload", func() bool { return strings.Contains(logs.String(), "msg=\"config reloaded\"") })
	for token, want := range map[string]int{"old-secret": http.StatusUnauthorized, "kept-secret": http.StatusOK, "new-secret": http.StatusOK} {
		if got := status(token); got != want {
			t.Errorf("%s after the reload: %d, want %d", token, got, want)
		}
	}
	if !strings.Contains(logs.String(), "auth tokens replaced") || strings.Contains(logs.String(), "needs a restart to take effect field=auth") {
		t.Errorf("the reload did not report the token change as applied:\n%s", logs.String())
	}
}

// TestReloadToNoTokensKeepsAuth is the regression test for issue 25's finding 6 (a reload to
// `auth.tokens: []` silently turned auth off): such a reload is rejected, loudly, and the
// tokens keep working; with auth.allowInsecure set it goes through, with a warning.
func TestReloadToNoTokensKeepsAuth(t *testing.T) {
	path := filepath.Join(t.TempDir(), "tether.yaml")
	const base = "apiVersion: tether/v1\nlisteners: {api: 127.0.0.1:0, extProc: '', xds: '', sip: ''}\nservices: [{name: web}]\n"
	writeFile(t, path, base+"auth:\n  tokens:\n  - {name: ops, token: ops-secret, services: ['*']}\n")
	srv := serveFor(t, path)
	code := func(token string) int {
		hdr := []string{}
		if token != "" {
			hdr = append(hdr, "Authorization", "Bearer "+token)
		}
		return testutil.Get(t, "http://"+srv.apiAddr+"/v1/services/web/instances", hdr...).Status
	}
	writeFile(t, path, base+"auth: {tokens: []}\n")
	srv.reload <- syscall.SIGHUP
	waitFor(t, "the reload's rejection", func() bool { return strings.Contains(srv.logs.String(), "would turn API authentication off") })
	if got := code(""); got != http.StatusUnauthorized {
		t.Errorf("no token after the emptied reload: %d, want 401 (auth still on)", got)
	}
	if got := code("ops-secret"); got != http.StatusOK {
		t.Errorf("the token after the emptied reload: %d, want 200", got)
	}
	writeFile(t, path, base+"auth: {tokens: [], allowInsecure: true}\n")
	srv.reload <- syscall.SIGHUP
	waitFor(t, "the explicit opt-out", func() bool { return strings.Contains(srv.logs.String(), "turns API authentication OFF") })
	if got := code(""); got != http.StatusOK {
		t.Errorf("no token after the explicit opt-out: %d, want 200", got)
	}
}
