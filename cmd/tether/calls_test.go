package main

import (
	"io"
	"net/http"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/tether-dev/tether/pkg/dcr/dcrtest"
)

// TestServeCallLoad: with calls.track and a cap of 1, the SIP decision endpoint of a running
// tether counts a decided INVITE, refuses a second call on the one instance (503
// CallCapReached), and counts its answer and end from the proxy's reports; a reload that
// turns calls.track off stops the counting (the endpoints answer 404).
func TestServeCallLoad(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "tether.yaml")
	conf := func(track bool) string {
		c := "apiVersion: tether/v1\nregistry: {allowedNetworks: [127.0.0.1/32]}\nlisteners: {api: 127.0.0.1:0, extProc: '', xds: '', sip: 127.0.0.1:0}\n" +
			"services:\n- name: voice\n  affinity: hash\n"
		if track {
			c += "  calls: {track: true, capPerInstance: 1}\n"
		}
		return c + "  instances: [{id: v1, address: 127.0.0.1, ports: {sip: 5070}}]\n"
	}
	writeFile(t, path, conf(true))
	srv := serveFor(t, path)
	info, reload := srv.serveInfo, srv.reload
	base := "http://" + info.sipAddr + "/v1/sip/voice/"
	post := func(path, body string) (int, string) {
		t.Helper()
		resp, err := http.Post(base+path, "text/plain", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = resp.Body.Close() }()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	invite := func(callID string) []byte {
		return dcrtest.SIP(dcrtest.Request{RequestURI: "sip:bob@example.com", CallID: callID})
	}
	if code, body := post("decide", string(invite("call-1"))); code != http.StatusOK || body != "sip:127.0.0.1:5070" {
		t.Fatalf("first call: %d %q", code, body)
	}
	if code, body := post("decide", string(invite("call-2"))); code != http.StatusServiceUnavailable || !strings.Contains(body, `"errorCode":"CallCapReached"`) {
		t.Fatalf("second call on a 1-call instance: %d %q, want 503 CallCapReached", code, body)
	}
	code, list := get(t, base+"calls")
	if code != http.StatusOK || !strings.Contains(list, `{"instance":"v1","setup":1,"answered":0,"cap":1}`) {
		t.Fatalf("GET calls = %d %s", code, list)
	}
	// The instances API and /v1/status agree on the call load (issue 25: the instances API
	// showed 0 calls while /v1/status showed the cap reached).
	for _, path := range []string{"/v1/services/voice/instances/v1", "/v1/status"} {
		code, body := get(t, "http://"+info.apiAddr+path)
		if code != http.StatusOK || !strings.Contains(body, `"calls": 1,`) || !strings.Contains(body, `"callCapacity": 1`) {
			t.Errorf("GET %s = %d, want the call load 1/1:\n%s", path, code, body)
		}
	}
	for _, step := range []struct{ path, body string }{{"calls/answered", "call-1"}, {"calls/ended", "call-1"}} {
		if code, body := post(step.path, step.body); code != http.StatusNoContent {
			t.Fatalf("POST %s: %d %q", step.path, code, body)
		}
	}
	if code, body := post("calls/ended", "call-1"); code != http.StatusNotFound {
		t.Fatalf("a second end report: %d %q, want 404", code, body)
	}
	if code, body := post("decide", string(invite("call-3"))); code != http.StatusOK {
		t.Fatalf("after the first call ended: %d %q", code, body)
	}

	writeFile(t, path, conf(false))
	reload <- syscall.SIGHUP
	waitFor(t, "call load off after the reload", func() bool {
		code, _ := get(t, base+"calls")
		return code == http.StatusNotFound
	})
	for i := range 3 {
		if code, body := post("decide", string(invite("untracked-"+string(rune('a'+i))))); code != http.StatusOK {
			t.Fatalf("untracked call %d: %d %q", i, code, body)
		}
	}
}
