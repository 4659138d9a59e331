package main

import (
	"net/http"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/tether-dev/tether/internal/testutil"
	"github.com/tether-dev/tether/pkg/wire"
)

// An instance registered through the admin API survives a config reload (it used to vanish:
// the reload replaced every instance with the config's), and so does a drain set through the API.
func TestReloadKeepsAPIRegisteredInstances(t *testing.T) {
	path := filepath.Join(t.TempDir(), "tether.yaml")
	cfg := func(weight string) string {
		return "apiVersion: tether/v1\nlisteners: {api: 127.0.0.1:0, extProc: '', xds: '', sip: ''}\n" +
			"services:\n- name: web\n  instances: [{id: a, address: 198.18.0.1, ports: {http: 80}, weight: " + weight + "}]\n"
	}
	writeFile(t, path, cfg("1"))
	srv := serveFor(t, path)
	info, reload, logs := srv.serveInfo, srv.reload, srv.logs
	call := func(method, path, body string, want int) string {
		t.Helper()
		r := testutil.Do(t, method, "http://"+info.apiAddr+path, body, wire.ClientHeader, "test", "Content-Type", "application/json")
		if r.Status != want {
			t.Fatalf("%s %s: %d %s, want %d", method, path, r.Status, r.Body, want)
		}
		return r.Body
	}
	call("POST", "/v1/services/web/instances", `{"id":"b","address":"198.18.0.2","httpPort":80}`, http.StatusCreated)
	call("POST", "/v1/services/web/instances/b/drain", `{}`, http.StatusOK)

	writeFile(t, path, cfg("5"))
	reload <- syscall.SIGHUP
	waitFor(t, "reload", func() bool { return strings.Contains(logs.String(), "msg=\"config reloaded\"") })
	got := strings.Join(strings.Fields(call("GET", "/v1/services/web/instances", "", http.StatusOK)), "")
	if !strings.Contains(got, `"id":"b","address":"198.18.0.2"`) || !strings.Contains(got, `"state":"INSTANCE_STATE_DRAINING"`) ||
		!strings.Contains(got, `"id":"a","address":"198.18.0.1","httpPort":80,"sipPort":0,"weight":5`) {
		t.Errorf("instances after the reload: %s\nwant b kept and draining, a at weight 5", got)
	}
}
