package main

import (
	"bufio"
	"context"
	"fmt"
	"net/http"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/tether-dev/tether/internal/testutil"
	"github.com/tether-dev/tether/pkg/servertls/servertlstest"
	"github.com/tether-dev/tether/pkg/wire"
)

// openStream opens /v1/status/stream with token and returns a channel that receives one value
// per event and is closed when the stream ends.
func openStream(t *testing.T, c *http.Client, url, token string) <-chan struct{} {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url+"/v1/status/stream", nil)
	if err != nil {
		t.Fatal(err)
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := c.Do(req) //nolint:bodyclose // the reader goroutine below closes it
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("stream with %q: HTTP %d", token, resp.StatusCode)
	}
	events := make(chan struct{}, 1000)
	go func() {
		defer close(events)
		defer func() { _ = resp.Body.Close() }()
		sc := bufio.NewScanner(resp.Body)
		sc.Buffer(nil, 1<<20)
		for sc.Scan() {
			if strings.HasPrefix(sc.Text(), "event: status") {
				events <- struct{}{}
			}
		}
	}()
	return events
}

// TestReloadEndsRevokedStatusStreams is the regression test for issue 25's finding 6 (an open
// /v1/status/stream kept streaming after SIGHUP revoked its token): after the reload the
// revoked token's stream ends at once while the kept token's goes on.
func TestReloadEndsRevokedStatusStreams(t *testing.T) {
	path := filepath.Join(t.TempDir(), "tether.yaml")
	const base = "apiVersion: tether/v1\nlisteners: {api: 127.0.0.1:0, extProc: '', xds: '', sip: ''}\nservices: [{name: web}]\nauth:\n  tokens:\n"
	tok := func(name string) string {
		return "  - {name: " + name + ", token: " + name + "-secret, services: ['*']}\n"
	}
	writeFile(t, path, base+tok("old")+tok("kept"))
	srv := serveFor(t, path)
	url := "http://" + srv.apiAddr
	old, kept := openStream(t, http.DefaultClient, url, "old-secret"), openStream(t, http.DefaultClient, url, "kept-secret")
	<-old
	<-kept
	writeFile(t, path, base+tok("kept"))
	srv.reload <- syscall.SIGHUP
	testutil.Eventually(t, "the revoked token's stream ended", func() bool {
		for {
			select {
			case _, ok := <-old:
				if !ok {
					return true
				}
			default:
				return false
			}
		}
	})
	for range 2 { // events keep coming on the kept token's stream (one a second)
		if _, ok := <-kept; !ok {
			t.Fatal("the kept token's stream ended too")
		}
	}
}

// TestMutualTLSIdentities: with tls.clientCAFile and auth.clients, the API runs on client
// certificates alone: a URI SAN (a SPIFFE ID) and a DNS SAN map to their scopes as tokens do,
// an unknown certificate or an expired identity gets 401, a token past its notAfter 401 too;
// a write with a certificate still needs X-Tether-Client (a browser presents certificates on
// its own, as it does cookies).
func TestMutualTLSIdentities(t *testing.T) {
	ca := servertlstest.NewCA(t, "ca")
	pair := ca.Server(t, "tether")
	past := time.Now().Add(-time.Hour).UTC().Format(time.RFC3339)
	cfg := strings.Replace(testConfig(upstreamPort(t)), "services:\n", fmt.Sprintf(`auth:
  tokens:
  - {name: stale, token: stale-secret-0123456789, services: ["*"], notAfter: %q}
  clients:
  - {name: ops, id: "spiffe://test.example/ops", services: ["*"], access: write}
  - {name: reader, id: reader.test.example, services: [web]}
  - {name: gone, id: "spiffe://test.example/gone", services: ["*"], notAfter: %q}
services:
`, past, past), 1) + "tls: {certFile: '" + pair.CertFile + "', keyFile: '" + pair.KeyFile + "', clientCAFile: '" + ca.File + "'}\n"
	path := filepath.Join(t.TempDir(), "tether.yaml")
	writeFile(t, path, cfg)
	info := serveFor(t, path).serveInfo
	url := "https://" + info.apiAddr
	client := func(p *servertlstest.Pair) *http.Client {
		tr := &http.Transport{TLSClientConfig: servertlstest.ClientConfig(ca, p)}
		t.Cleanup(tr.CloseIdleConnections)
		return &http.Client{Transport: tr, Timeout: 10 * time.Second}
	}
	ops, reader := ca.ClientWithSANs(t, "ops", "spiffe://test.example/ops"), ca.ClientWithSANs(t, "reader", "reader.test.example")
	stranger, gone := ca.ClientWithSANs(t, "stranger", "spiffe://test.example/stranger"), ca.ClientWithSANs(t, "gone", "spiffe://test.example/gone")
	do := func(c *http.Client, method, path string, hdr ...string) int {
		req, err := http.NewRequest(method, url+path, strings.NewReader("{}"))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Content-Type", "application/json")
		for i := 0; i+1 < len(hdr); i += 2 {
			req.Header.Set(hdr[i], hdr[i+1])
		}
		resp, err := c.Do(req)
		if err != nil {
			t.Fatalf("%s %s: %v", method, path, err)
		}
		_ = resp.Body.Close()
		return resp.StatusCode
	}
	const create = "/v1/services/web/sessions"
	for _, tc := range []struct {
		name         string
		c            *http.Client
		method, path string
		hdr          []string
		want         int
	}{
		{"SPIFFE identity reads the snapshot", client(&ops), "GET", "/v1/status", nil, 200},
		{"SPIFFE identity writes", client(&ops), "POST", create, []string{wire.ClientHeader, "test"}, 201},
		{"certificate write without the client header", client(&ops), "POST", create, nil, 403},
		{"DNS identity reads its service", client(&reader), "GET", "/v1/services/web/instances", nil, 200},
		{"DNS identity may not write", client(&reader), "POST", create, []string{wire.ClientHeader, "test"}, 403},
		{"DNS identity may not read everything", client(&reader), "GET", "/v1/status", nil, 403},
		{"unknown certificate", client(&stranger), "GET", "/v1/services/web/instances", nil, 401},
		{"expired identity", client(&gone), "GET", "/v1/services/web/instances", nil, 401},
		{"expired token", client(&ops), "GET", "/v1/services/web/instances", []string{"Authorization", "Bearer stale-secret-0123456789"}, 401},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := do(tc.c, tc.method, tc.path, tc.hdr...); got != tc.want {
				t.Errorf("HTTP %d, want %d", got, tc.want)
			}
		})
	}
}
