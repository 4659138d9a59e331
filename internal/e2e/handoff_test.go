package e2e_test

import (
	"bufio"
	"context"
	"net/http"
	"strconv"
	"strings"
	"testing"

	"github.com/tether-dev/tether/internal/e2e"
	"github.com/tether-dev/tether/internal/testutil"
	"github.com/tether-dev/tether/pkg/registry"
)

// TestHandoffKeepsLongExchanges: a drain hands tether's fully answered exchanges off to the
// data plane (side streams closed with OK) and tether can then stop without resetting a
// stream: MCP SSE streams whose session id tether learned keep delivering events after the
// ext_proc server is gone, full-duplex streams arrive byte for byte (every chunk tether held
// was echoed before the close), and exchanges tether had not yet answered at their response
// headers finish normally, Set-Cookie included, before they are handed off in turn.
func TestHandoffKeepsLongExchanges(t *testing.T) {
	forEachKind(t, func(t *testing.T, kind e2e.Kind) {
		sse := service("mcp", registry.AffinityMCPSSE)
		sse.Match = registry.Match{PathPrefix: "/sse"}
		fd := service("fd", registry.AffinityHeader)
		fd.Match = registry.Match{PathPrefix: "/count"}
		fd.FullDuplexBodies = true
		ck := service("ck", registry.AffinityCookie)
		ck.Match = registry.Match{PathPrefix: "/block"}
		e := e2e.Start(t, kind, []registry.Service{sse, fd, ck}, map[string][]e2e.Instance{
			"mcp": instances("m1", "m2"), "fd": instances("f1", "f2"), "ck": instances("c1", "c2"),
		})
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		c := newClient(t, false)
		open := func(path string) *bufio.Reader {
			req, _ := http.NewRequestWithContext(ctx, "GET", e.DP.URL()+path, nil)
			resp, err := c.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = resp.Body.Close() })
			return bufio.NewReader(resp.Body)
		}
		const nSSE, nFD, nBlocked = 6, 4, 3
		var sseBodies, fdBodies []*bufio.Reader
		for range nSSE {
			br := open("/sse")
			readEndpoint(t, br)
			sseBodies = append(sseBodies, br)
		}
		for range nFD {
			// Events 200 ms apart leave the quiet gap a full-duplex handoff waits for (an
			// upstream that never pauses can lose the chunk in flight: see pkg/extproc).
			br := open("/count?interval=200ms")
			if n := readCount(t, br); n != 0 {
				t.Fatalf("first event %d, want 0", n)
			}
			fdBodies = append(fdBodies, br)
		}
		testutil.Eventually(t, "SSE sessions learned", func() bool { return e.ExtProc.Stats().SessionsLearned == nSSE })
		// Requests the upstream holds before its response headers: not answered by tether yet.
		blocked := make(chan result, nBlocked)
		for range nBlocked {
			go func() {
				r, err := doCtx(ctx, newClient(t, false), "GET", e.DP.URL()+"/block")
				if err != nil {
					r.status = -1
				}
				blocked <- r
			}()
		}
		testutil.Eventually(t, "blocked requests at the upstreams", func() bool {
			return e.Upstream("ck", "c1").Blocked()+e.Upstream("ck", "c2").Blocked() == nBlocked
		})

		e.ExtProc.Drain()
		e.ExtProc.HandOff()
		testutil.Eventually(t, "every answered exchange handed off", func() bool {
			return e.ExtProc.Stats().HandedOff == nSSE+nFD
		})
		if open := e.ExtProc.Stats().OpenStreams; open != nBlocked {
			t.Fatalf("open side streams %d after the handoff, want the %d exchanges not yet answered", open, nBlocked)
		}
		e.Upstream("ck", "c1").Release()
		e.Upstream("ck", "c2").Release()
		for range nBlocked {
			r := <-blocked
			if r.status != 200 || setCookie(r.header, "tether-session") == "" {
				t.Fatalf("held request: %d, Set-Cookie %q; want 200 with tether's cookie", r.status, r.header.Values("Set-Cookie"))
			}
		}
		testutil.Eventually(t, "no side stream left", func() bool {
			s := e.ExtProc.Stats()
			return s.OpenStreams == 0 && s.HandedOff == nSSE+nFD+nBlocked
		})

		e.StopExtProc() // the replica is gone
		for i, br := range sseBodies {
			for range 3 {
				if line := readLine(t, br); line != ": ping" && line != "" {
					t.Fatalf("SSE stream %d after tether stopped: %q", i, line)
				}
			}
		}
		for i, br := range fdBodies {
			// Every number in order: nothing lost or repeated across the handoff.
			want := 1
			for range 8 {
				if n := readCount(t, br); n != want {
					t.Fatalf("full-duplex stream %d: event %d, want %d", i, n, want)
				}
				want++
			}
		}
		if e.Kind == e2e.KindHarness {
			s := e.Harness().Stats()
			// The held requests' short bodies may end their side streams first (Envoy's close
			// after the last expected answer) or the handoff may: either way no error.
			if s.StreamErrors != 0 || s.FullDuplexChunksLost != 0 || s.StreamsClosedByServer < nSSE+nFD {
				t.Errorf("harness stats %+v: want no stream error, no chunk lost, ≥ %d server closes", s, nSSE+nFD)
			}
		}
	})
}

// readLine reads one LF-terminated line without its end.
func readLine(t *testing.T, br *bufio.Reader) string {
	t.Helper()
	line, err := br.ReadString('\n')
	if err != nil {
		t.Fatalf("reading the stream: %v (got %q)", err, line)
	}
	return strings.TrimSuffix(line, "\n")
}

// readCount reads the next "data: <n>" event of an upstream /count stream.
func readCount(t *testing.T, br *bufio.Reader) int {
	t.Helper()
	for {
		line := readLine(t, br)
		if line == "" {
			continue
		}
		v, ok := strings.CutPrefix(line, "data: ")
		if !ok {
			t.Fatalf("unexpected line %q", line)
		}
		n, err := strconv.Atoi(v)
		if err != nil {
			t.Fatalf("event %q: %v", line, err)
		}
		return n
	}
}
