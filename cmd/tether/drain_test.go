package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/tether-dev/tether/internal/envoyharness"
	"github.com/tether-dev/tether/internal/testutil"
	"github.com/tether-dev/tether/internal/upstream"
)

// drainRig is tether serve (memory store) with the Envoy stand-in in front and one upstream.
type drainRig struct {
	info serveInfo
	h    *envoyharness.Harness
	up   *upstream.Server
	logs *testutil.SyncBuffer
	done chan error
	stop context.CancelFunc
	// returned is set once waitServeReturned saw serve return.
	returned bool
}

func startDrainRig(t *testing.T, shutdown string) *drainRig {
	t.Helper()
	up, err := upstream.Start("u1")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = up.Close() })
	path := filepath.Join(t.TempDir(), "tether.yaml")
	writeFile(t, path, fmt.Sprintf(`apiVersion: tether/v1
registry: {allowedNetworks: [127.0.0.1/32]}
listeners: {api: 127.0.0.1:0, extProc: 127.0.0.1:0, xds: "", sip: ""}
shutdown: %s
services:
- name: web
  affinity: cookie
  sessionsPerInstance: 100
  instances:
  - {id: u1, address: 127.0.0.1, ports: {http: %d}}
`, shutdown, up.Port()))
	ctx, cancel := context.WithCancel(context.Background())
	r := &drainRig{up: up, logs: &testutil.SyncBuffer{}, done: make(chan error, 1), stop: cancel}
	ready := make(chan serveInfo, 1)
	go func() {
		r.done <- serve(ctx, serveOptions{configPath: path, logOut: r.logs, reload: make(chan os.Signal),
			ready: func(i serveInfo) { ready <- i }, moveAway: 200 * time.Millisecond, shutdownTimeout: 2 * time.Second})
	}()
	select {
	case r.info = <-ready:
	case err := <-r.done:
		t.Fatalf("serve: %v\n%s", err, r.logs.String())
	case <-time.After(10 * time.Second):
		t.Fatal("serve not ready")
	}
	t.Cleanup(func() {
		cancel()
		if !r.returned {
			select {
			case err := <-r.done:
				_ = err // the test is over: only the goroutine's end matters
			case <-time.After(20 * time.Second):
			}
		}
	})
	vhosts := []envoyharness.VirtualHost{{Name: "any", Domains: []string{"*"}, Routes: []envoyharness.Route{
		{Name: "web", PathPrefix: "/", Cluster: "web", Service: "web"}}}}
	r.h, err = envoyharness.New(r.info.extProcAddr, envoyharness.EndpointsFunc(func(string) []envoyharness.Endpoint {
		return []envoyharness.Endpoint{{Address: up.Addr(), Healthy: true}}
	}), vhosts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = r.h.Close() })
	return r
}

// openStreams opens n SSE responses through the harness (past their response headers) and
// returns their bodies.
func (r *drainRig) openStreams(t *testing.T, n int) []*bufio.Reader {
	t.Helper()
	var out []*bufio.Reader
	for range n {
		resp, err := http.Get(r.h.URL() + "/sse")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = resp.Body.Close() })
		if resp.StatusCode != 200 || !strings.HasPrefix((&http.Response{Header: resp.Header}).Cookies()[0].Name, "tether") {
			t.Fatalf("SSE response %d, cookies %v %+v\n%s", resp.StatusCode, resp.Header.Values("Set-Cookie"), r.h.Stats(), r.logs.String())
		}
		br := bufio.NewReader(resp.Body)
		if _, err := br.ReadString('\n'); err != nil {
			t.Fatal(err)
		}
		out = append(out, br)
	}
	return out
}

func (r *drainRig) waitServeReturned(t *testing.T, within time.Duration) {
	t.Helper()
	select {
	case err := <-r.done:
		r.returned = true
		if err != nil {
			t.Fatalf("serve = %v", err)
		}
	case <-time.After(within):
		t.Fatalf("serve did not return within %v\n%s", within, r.logs.String())
	}
}

// closedWithOK waits until the harness saw n side streams closed with OK, and checks none
// failed.
func (r *drainRig) closedWithOK(t *testing.T, n uint64) {
	t.Helper()
	testutil.Eventually(t, fmt.Sprintf("%d side streams closed with OK", n), func() bool {
		return r.h.Stats().StreamsClosedByServer == n
	})
	if s := r.h.Stats(); s.StreamErrors != 0 {
		t.Errorf("harness stats %+v: want no failed side stream", s)
	}
}

// keepsDelivering reads a few more SSE lines from every stream: none was reset.
func keepsDelivering(t *testing.T, bodies []*bufio.Reader) {
	t.Helper()
	for i, br := range bodies {
		for range 4 {
			if _, err := br.ReadString('\n'); err != nil {
				t.Fatalf("stream %d after tether stopped: %v", i, err)
			}
		}
	}
}

// TestShutdownKeepsThenHandsOff: SIGTERM with 20 exchanges past their response headers —
// the ones that used to end with UNAVAILABLE within milliseconds. tether turns NOT_SERVING,
// keeps serving new streams while Envoy moves away, keeps the open exchanges until
// shutdown.drainTimeout, then closes their side streams with OK: not one is reset, each keeps
// delivering after tether exited.
func TestShutdownKeepsThenHandsOff(t *testing.T) {
	r := startDrainRig(t, "{drainTimeout: 1s}")
	bodies := r.openStreams(t, 20)
	start := time.Now()
	r.stop()
	// New streams are still served while Envoy's health checks move away.
	testutil.Eventually(t, "NOT_SERVING", func() bool { return strings.Contains(r.logs.String(), "ext_proc draining") })
	late := r.openStreams(t, 1)
	r.waitServeReturned(t, 20*time.Second)
	if took := time.Since(start); took < time.Second {
		t.Errorf("serve returned after %v, before shutdown.drainTimeout: the exchanges were not kept", took)
	}
	keepsDelivering(t, append(bodies, late...))
	r.closedWithOK(t, 21)
}

// TestShutdownHandoffAtOnce: with shutdown.handoff the exchanges are handed off as soon as
// Envoy moved away, without waiting for drainTimeout.
func TestShutdownHandoffAtOnce(t *testing.T) {
	r := startDrainRig(t, "{drainTimeout: 1h, handoff: true}")
	bodies := r.openStreams(t, 20)
	r.stop()
	r.waitServeReturned(t, 20*time.Second)
	keepsDelivering(t, bodies)
	r.closedWithOK(t, 20)
}

// TestAPIDrainOfTheReplica: POST /v1/replica/drain runs the same drain as SIGTERM; the process
// then exits (serve returns nil).
func TestAPIDrainOfTheReplica(t *testing.T) {
	r := startDrainRig(t, "{drainTimeout: 1h, handoff: true}")
	bodies := r.openStreams(t, 3)
	req, _ := http.NewRequest(http.MethodPost, "http://"+r.info.apiAddr+"/v1/replica/drain", nil)
	req.Header.Set("X-Tether-Client", "test") // a POST without a token must say it is no page
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	msg, _ := io.ReadAll(resp.Body)
	_ = resp.Body.Close()
	if resp.StatusCode != http.StatusAccepted {
		t.Fatalf("drain: %d %s", resp.StatusCode, msg)
	}
	r.waitServeReturned(t, 20*time.Second)
	keepsDelivering(t, bodies)
	r.closedWithOK(t, 3)
	if !strings.Contains(r.logs.String(), "POST /v1/replica/drain") {
		t.Errorf("log lacks the drain's reason:\n%s", r.logs.String())
	}
}
