package main

import (
	"io"
	"net/http"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

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
		req, err := http.NewRequest(method, "http://"+info.apiAddr+path, strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set(wire.ClientHeader, "test")
		req.Header.Set("Content-Type", "application/json")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = resp.Body.Close() }()
		b, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != want {
			t.Fatalf("%s %s: %d %s, want %d", method, path, resp.StatusCode, b, want)
		}
		return string(b)
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
