package e2e_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/tether-dev/tether/internal/e2e"
	"github.com/tether-dev/tether/internal/envoyharness"
	"github.com/tether-dev/tether/internal/testutil"
	"github.com/tether-dev/tether/pkg/registry"
)

// TestFullDuplexBodies: with services[].bodyMode full-duplex every request and response chunk
// streams through tether's ext_proc (FULL_DUPLEX_STREAMED, set per route by the generated
// config) and arrives unchanged; cookie and header affinity stick as in headers-only mode;
// every exchange releases its request slot exactly once when its last chunk is answered.
func TestFullDuplexBodies(t *testing.T) {
	forEachKind(t, func(t *testing.T, kind e2e.Kind) {
		ck := service("ck", registry.AffinityCookie)
		ck.Match = registry.Match{PathPrefix: "/ck"}
		ck.FullDuplexBodies = true
		hd := service("hd", registry.AffinityHeader)
		hd.Match = registry.Match{PathPrefix: "/hd"}
		hd.FullDuplexBodies = true
		e := e2e.Start(t, kind, []registry.Service{ck, hd}, map[string][]e2e.Instance{
			"ck": instances("c1", "c2", "c3"), "hd": instances("h1", "h2", "h3"),
		})
		jar := newClient(t, true)
		first := do(t, jar, "GET", e.DP.URL()+"/ck/login")
		if first.status != 200 || setCookie(first.header, "tether-session") == "" || first.body != first.instance+"\n" {
			t.Fatalf("first request: %d from %q, body %q, Set-Cookie %q", first.status, first.instance, first.body, first.header.Values("Set-Cookie"))
		}
		for i := range 50 {
			if r := do(t, jar, "GET", fmt.Sprintf("%s/ck/page/%d", e.DP.URL(), i)); r.status != 200 || r.instance != first.instance {
				t.Fatalf("cookie request %d: %d from %q, want %q", i, r.status, r.instance, first.instance)
			}
		}

		c := newClient(t, false)
		gen := do(t, c, "GET", e.DP.URL()+"/hd/")
		id := gen.header.Get("X-Tether-Session")
		if gen.status != 200 || len(id) != 32 {
			t.Fatalf("header affinity: %d, id %q", gen.status, id)
		}
		for i := range 50 {
			if r := do(t, c, "GET", e.DP.URL()+"/hd/", "X-Tether-Session", id); r.status != 200 || r.instance != gen.instance {
				t.Fatalf("header request %d: %d from %q, want %q", i, r.status, r.instance, gen.instance)
			}
		}

		// A request body of many chunks goes up and comes back (upstream /echo) byte for byte.
		payload := make([]byte, 300<<10)
		_, _ = rand.Read(payload)
		req, err := http.NewRequest("POST", e.DP.URL()+"/ck/echo", bytes.NewReader(payload))
		if err != nil {
			t.Fatal(err)
		}
		resp, err := jar.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		got, err := io.ReadAll(resp.Body)
		_ = resp.Body.Close()
		if err != nil || resp.StatusCode != 200 || !bytes.Equal(got, payload) {
			t.Fatalf("echo: %d, %d bytes back (%v), want the %d bytes sent", resp.StatusCode, len(got), err, len(payload))
		}
		if resp.Header.Get(strings.ToLower("X-Upstream-Instance")) != first.instance {
			t.Errorf("echo served by %q, want the session's %q", resp.Header.Get("X-Upstream-Instance"), first.instance)
		}

		e.WaitSlotsReleased(t)
		if s := e.ExtProc.Stats(); s.OpenStreams != 0 || s.Decisions != 103 {
			t.Errorf("ext_proc stats %+v: want 103 decisions and no open stream", s)
		}
		if h := e.Harness(); h != nil {
			// Every exchange's side stream closed after its last answer (the last chunk's
			// end_of_stream), not at filter destruction.
			if s := h.Stats(); s.StreamsOpened != 103 || s.StreamsClosedEarly != 103 || s.SpuriousMessages != 0 {
				t.Errorf("harness stats %+v: want 103 streams, each closed after its last answer", s)
			}
			for _, r := range e.Upstream("ck", first.instance).Requests() {
				if r.Path == "/ck/echo" && r.Header.Get("Content-Length") != "" {
					t.Errorf("echo reached the upstream with content-length %q; Envoy removes it when bodies may change", r.Header.Get("Content-Length"))
				}
			}
		}
	})
}

// TestEarlyCloseReleasesSlotsOnce: with bodies NONE and response trailers SEND (the base
// mode), Envoy ≥ 1.37 closes the side stream right after the response_headers answer when the
// whole body — without trailers — arrived while tether was answering (envoy.md §10,
// isLastResponseAfterHeaderResp). The harness makes that timing certain; each such exchange
// releases its request slot exactly once: with one long request holding a slot on the same
// instance, the count returns to exactly 1 after 20 early-closed exchanges, then to 0.
func TestEarlyCloseReleasesSlotsOnce(t *testing.T) {
	svc := service("web", registry.AffinityCookie)
	e := e2e.Start(t, e2e.KindHarness, []registry.Service{svc}, map[string][]e2e.Instance{"web": instances("i1")},
		e2e.WithHarnessOptions(envoyharness.WithBodyBeforeHeadersAnswer(true)))
	jar := newClient(t, true)
	do(t, jar, "GET", e.DP.URL()+"/login")
	e.WaitSlotsReleased(t)
	held := make(chan result, 1)
	go func() {
		r, _ := doCtx(context.Background(), jar, "GET", e.DP.URL()+"/block")
		held <- r
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := e.Upstream("web", "i1").WaitBlocked(ctx, 1); err != nil {
		t.Fatal(err)
	}
	closedBefore := e.Harness().Stats().StreamsClosedEarly
	for i := range 20 {
		if r := do(t, jar, "GET", fmt.Sprintf("%s/page/%d", e.DP.URL(), i)); r.status != 200 || r.body != "i1\n" {
			t.Fatalf("request %d: %d %q", i, r.status, r.body)
		}
	}
	if got := e.Harness().Stats().StreamsClosedEarly - closedBefore; got != 20 {
		t.Fatalf("%d side streams closed right after the headers answer, want 20", got)
	}
	testutil.Eventually(t, "only the held request keeps a slot", func() bool { return e.RequestsInFlight(t, "web") == 1 })
	if s := e.ExtProc.Stats(); s.OpenStreams != 1 {
		t.Errorf("open ext_proc streams %d, want the held one", s.OpenStreams)
	}
	e.Upstream("web", "i1").Release()
	if r := <-held; r.status != 200 {
		t.Errorf("held request: %d", r.status)
	}
	e.WaitSlotsReleased(t)
}
