package main

import (
	"fmt"
	"io"
	"net/http"
	"net/http/cookiejar"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/tether-dev/tether/internal/envoyharness"
	"github.com/tether-dev/tether/internal/testutil"
	"github.com/tether-dev/tether/internal/upstream"
)

// TestReloadsUnderLoad: 20 SIGHUP reloads while cookie clients keep sending requests through
// the Envoy stand-in; every reload adds or removes a service, changes the kept one's settings
// and rotates the API token. No request of the kept service fails because of a reload, every
// client stays on its instance (no session lost), the new token works and the old one stops
// at once after each reload, and the removed service's requests get tether's documented
// answer (404 ServiceNotFound) instead of reaching an upstream.
func TestReloadsUnderLoad(t *testing.T) {
	ups := map[string]*upstream.Server{}
	for _, id := range []string{"w1", "w2", "x1"} {
		u, err := upstream.Start(id)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = u.Close() })
		ups[id] = u
	}
	dir := t.TempDir()
	path := filepath.Join(dir, "tether.yaml")
	tokenFile := filepath.Join(dir, "operator.token")
	config := func(i int) string {
		ttl := []string{"6h", "5h"}[i%2]
		var b strings.Builder
		fmt.Fprintf(&b, `apiVersion: tether/v1
registry: {allowedNetworks: [127.0.0.1/32]}
listeners: {api: 127.0.0.1:0, extProc: 127.0.0.1:0, xds: "", sip: ""}
auth:
  tokens:
  - {name: operator, tokenFile: %s, services: ["*"], access: write}
services:
- name: web
  match: {pathPrefix: /}
  affinity: cookie
  sessionsPerInstance: 200
  sessionTTL: %s
  instances:
  - {id: w1, address: 127.0.0.1, ports: {http: %d}}
  - {id: w2, address: 127.0.0.1, ports: {http: %d}}
`, tokenFile, ttl, ups["w1"].Port(), ups["w2"].Port())
		if i%2 == 1 {
			fmt.Fprintf(&b, `- name: extra
  match: {pathPrefix: /extra}
  instances:
  - {id: x1, address: 127.0.0.1, ports: {http: %d}}
`, ups["x1"].Port())
		}
		return b.String()
	}
	token := func(i int) string { return fmt.Sprintf("token-%02d-%s", i, strings.Repeat("x", 24)) }
	writeFile(t, tokenFile, token(0))
	writeFile(t, path, config(0))

	srv := serveFor(t, path)
	info, reload, logs := srv.serveInfo, srv.reload, srv.logs
	vhosts := []envoyharness.VirtualHost{{Name: "any", Domains: []string{"*"}, Routes: []envoyharness.Route{
		{Name: "extra", PathPrefix: "/extra", Cluster: "extra", Service: "extra"},
		{Name: "web", PathPrefix: "/", Cluster: "web", Service: "web"}}}}
	h, err := envoyharness.New(info.extProcAddr, envoyharness.EndpointsFunc(func(c string) []envoyharness.Endpoint {
		if c == "extra" {
			return []envoyharness.Endpoint{{Address: ups["x1"].Addr(), Healthy: true}}
		}
		return []envoyharness.Endpoint{{Address: ups["w1"].Addr(), Healthy: true}, {Address: ups["w2"].Addr(), Healthy: true}}
	}), vhosts, envoyharness.WithMessageTimeout(5*time.Second)) // a loaded test machine alone can pass 500 ms
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = h.Close() })

	// Cookie clients: each sticks to the instance of its first answer.
	const clients = 6
	var requests, failures atomic.Int64
	var mu sync.Mutex
	var failed []string
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for c := range clients {
		wg.Go(func() {
			jar, _ := cookiejar.New(nil)
			cl := &http.Client{Jar: jar, Timeout: 10 * time.Second}
			home := ""
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				resp, err := cl.Get(fmt.Sprintf("%s/page/%d/%d", h.URL(), c, i))
				requests.Add(1)
				var body []byte
				if err == nil {
					body, err = io.ReadAll(resp.Body)
					_ = resp.Body.Close()
				}
				inst := ""
				if err == nil {
					inst = resp.Header.Get(upstream.InstanceHeader)
				}
				if home == "" {
					home = inst
				}
				if err != nil || resp.StatusCode != 200 || inst != home {
					failures.Add(1)
					mu.Lock()
					failed = append(failed, fmt.Sprintf("client %d request %d: %v %v %q on %q (home %q)", c, i, err, statusOf(resp), body, inst, home))
					mu.Unlock()
				}
			}
		})
	}
	apiStatus := func(tok string) int {
		req, _ := http.NewRequest(http.MethodGet, "http://"+info.apiAddr+"/v1/services", nil)
		req.Header.Set("Authorization", "Bearer "+tok)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		_ = resp.Body.Close()
		return resp.StatusCode
	}
	for i := 1; i <= 20; i++ {
		before := requests.Load()
		testutil.Eventually(t, "traffic between reloads", func() bool { return requests.Load() >= before+clients })
		writeFile(t, tokenFile, token(i))
		writeFile(t, path, config(i))
		reload <- syscall.SIGHUP
		want := i
		testutil.Eventually(t, fmt.Sprintf("reload %d applied", i), func() bool {
			return strings.Count(logs.String(), `msg="config reloaded"`) >= want
		})
		if got := apiStatus(token(i)); got != http.StatusOK {
			t.Fatalf("reload %d: the new token answers %d, want 200", i, got)
		}
		if got := apiStatus(token(i - 1)); got != http.StatusUnauthorized {
			t.Fatalf("reload %d: the rotated-out token answers %d, want 401", i, got)
		}
		resp, err := http.Get(h.URL() + "/extra/x")
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		_ = resp.Body.Close()
		switch inst := resp.Header.Get(upstream.InstanceHeader); {
		case i%2 == 1 && (resp.StatusCode != 200 || inst != "x1"):
			t.Fatalf("reload %d added extra: %d from %q", i, resp.StatusCode, inst)
		case i%2 == 0 && resp.StatusCode != http.StatusNotFound:
			t.Fatalf("reload %d removed extra: %d, want 404 ServiceNotFound", i, resp.StatusCode)
		}
	}
	close(stop)
	wg.Wait()
	if n := failures.Load(); n != 0 {
		t.Fatalf("%d of %d requests failed or moved across 20 reloads:\n%s", n, requests.Load(), strings.Join(failed[:min(len(failed), 10)], "\n"))
	}
	t.Logf("%d requests across 20 reloads, none failed", requests.Load())
}

func statusOf(r *http.Response) int {
	if r == nil {
		return 0
	}
	return r.StatusCode
}
