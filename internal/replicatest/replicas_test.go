package replicatest_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tether-dev/tether/internal/redistest"
	"github.com/tether-dev/tether/internal/replicatest"
	"github.com/tether-dev/tether/internal/testutil"
	"github.com/tether-dev/tether/pkg/affinity"
	"github.com/tether-dev/tether/pkg/affinity/affinitytest"
	"github.com/tether-dev/tether/pkg/quota"
	"github.com/tether-dev/tether/pkg/registry"
	"github.com/tether-dev/tether/pkg/session"
)

// app is a small upstream instance: it names itself in X-Upstream-Instance, answers an MCP
// initialize (POST without Mcp-Session-Id) with a fresh Mcp-Session-Id, holds /block requests
// until released, and counts the requests it holds at once. A /stream request is a long-lived
// response (like SSE): headers at once, then one "event" line per nudge, until released or
// the request is cancelled. A /fail request gets 500.
type app struct {
	id      string
	addr    string
	srv     *http.Server
	gate    chan struct{}
	active  atomic.Int64
	peak    atomic.Int64
	blocked atomic.Int64
	streams atomic.Int64 // /stream responses open

	evMu sync.Mutex
	ev   chan struct{} // closed (and replaced) by nudge
}

// nudge makes every open /stream response send one event.
func (a *app) nudge() {
	a.evMu.Lock()
	close(a.ev)
	a.ev = make(chan struct{})
	a.evMu.Unlock()
}

func (a *app) events() <-chan struct{} {
	a.evMu.Lock()
	defer a.evMu.Unlock()
	return a.ev
}

func startApp(t *testing.T, id string) *app {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	a := &app{id: id, addr: ln.Addr().String(), gate: make(chan struct{}), ev: make(chan struct{})}
	a.srv = &http.Server{Handler: a, ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = a.srv.Serve(ln) }()
	t.Cleanup(func() { a.release(); _ = a.srv.Close() })
	return a
}

func (a *app) release() {
	select {
	case <-a.gate:
	default:
		close(a.gate)
	}
}

func (a *app) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	n := a.active.Add(1)
	defer a.active.Add(-1)
	for {
		m := a.peak.Load()
		if n <= m || a.peak.CompareAndSwap(m, n) {
			break
		}
	}
	w.Header().Set("X-Upstream-Instance", a.id)
	if strings.HasPrefix(r.URL.Path, "/mcp") && r.Method == http.MethodPost && r.Header.Get("Mcp-Session-Id") == "" {
		b := make([]byte, 16)
		_, _ = rand.Read(b)
		w.Header().Set("Mcp-Session-Id", hex.EncodeToString(b))
	}
	if strings.Contains(r.URL.Path, "/stream") {
		a.streams.Add(1)
		defer a.streams.Add(-1)
		w.Header().Set("Content-Type", "text/plain")
		w.WriteHeader(http.StatusOK)
		// A first line at once, as SSE servers send: the harness writes the response headers
		// downstream with the first body bytes.
		_, _ = io.WriteString(w, "open\n")
		rc := http.NewResponseController(w)
		_ = rc.Flush()
		for {
			ev := a.events()
			select {
			case <-a.gate:
				return
			case <-r.Context().Done():
				return
			case <-ev:
				if _, err := io.WriteString(w, "event\n"); err != nil {
					return
				}
				_ = rc.Flush()
			}
		}
	}
	if strings.Contains(r.URL.Path, "/fail") {
		w.WriteHeader(http.StatusInternalServerError)
		return
	}
	if strings.Contains(r.URL.Path, "/block") {
		a.blocked.Add(1)
		select {
		case <-a.gate:
		case <-r.Context().Done():
		}
		a.blocked.Add(-1)
	}
	_, _ = io.WriteString(w, a.id+"\n")
}

func (a *app) instance(service string) registry.Instance {
	host, port, _ := net.SplitHostPort(a.addr)
	var p int
	_, _ = fmt.Sscan(port, &p)
	return registry.Instance{Service: service, ID: a.id, Address: host, HTTPPort: p, Weight: 1, State: registry.StateActive}
}

type fleet struct {
	replicas []*replicatest.Replica
	apps     map[string]*app
	services []registry.Service
}

// startFleet runs three replicas on one Redis, each with its own harness data plane, over the
// services, each with instances i1..i3 (real upstreams).
func startFleet(t *testing.T, services []registry.Service) *fleet {
	t.Helper()
	return startFleetWith(t, services, replicatest.Options{})
}

// startFleetWith is startFleet with replica options.
func startFleetWith(t *testing.T, services []registry.Service, o replicatest.Options) *fleet {
	t.Helper()
	srv := redistest.Start(t)
	f := &fleet{apps: map[string]*app{}, services: services}
	var insts []registry.Instance
	for _, svc := range services {
		for i := range 3 {
			a := startApp(t, fmt.Sprintf("%s-i%d", svc.Name, i+1))
			f.apps[a.id] = a
			insts = append(insts, a.instance(svc.Name))
		}
	}
	f.replicas = replicatest.Start(t, srv.Addr, 3, services, insts, o)
	for _, r := range f.replicas {
		r.Serve(t, services)
	}
	return f
}

var client = &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 2000, MaxConnsPerHost: 0}, Timeout: 30 * time.Second}

// do sends one request through replica r's data plane.
// reply is what do keeps of a response: its status and headers (the body is read and closed).
type reply struct {
	StatusCode int
	Header     http.Header
}

func (f *fleet) do(t *testing.T, r int, method, path string, hdr ...string) *reply {
	t.Helper()
	return f.doWith(t, client, r, method, path, hdr...)
}

// streamClient has no overall timeout: its exchanges are held open by design (the harness's
// ext_proc message timeout still bounds each decision).
var streamClient = &http.Client{Transport: client.Transport}

func (f *fleet) doWith(t *testing.T, c *http.Client, r int, method, path string, hdr ...string) *reply {
	t.Helper()
	req, err := http.NewRequest(method, f.replicas[r].Harness.URL()+path, nil)
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Add(hdr[i], hdr[i+1])
	}
	resp, err := c.Do(req)
	if err != nil {
		t.Error(err)
		return &reply{}
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	_ = resp.Body.Close()
	return &reply{StatusCode: resp.StatusCode, Header: resp.Header}
}

func service(name string, mode registry.AffinityMode) registry.Service {
	s := affinitytest.Service(name, mode)
	s.Match.PathPrefix = "/" + name
	return s
}

// TestSessionsRouteIdenticallyThroughEveryReplica: cookie, header-field and MCP Streamable
// sessions created through one replica reach the same instance through the other two (50
// requests each), and the SessionAPI of one replica sees and deletes a session made on
// another.
func TestSessionsRouteIdenticallyThroughEveryReplica(t *testing.T) {
	f := startFleet(t, []registry.Service{
		service("ck", registry.AffinityCookie),
		service("hd", registry.AffinityHeader),
		service("mcp", registry.AffinityMCPStreamable),
	})
	type made struct {
		name, instance string
		hdr            []string
	}
	var sessions []made

	resp := f.do(t, 0, "GET", "/ck/page")
	cookie := strings.SplitN(resp.Header.Get("Set-Cookie"), ";", 2)[0]
	if !strings.HasPrefix(cookie, "tether-session=") {
		t.Fatalf("cookie session: Set-Cookie %q", resp.Header.Get("Set-Cookie"))
	}
	sessions = append(sessions, made{"cookie", resp.Header.Get("X-Upstream-Instance"), []string{"Cookie", cookie}})

	resp = f.do(t, 0, "GET", "/hd/page")
	hid := resp.Header.Get("X-Tether-Session")
	if hid == "" {
		t.Fatal("header session: no x-tether-session in the response")
	}
	sessions = append(sessions, made{"header", resp.Header.Get("X-Upstream-Instance"), []string{"X-Tether-Session", hid}})

	resp = f.do(t, 0, "POST", "/mcp", "Content-Type", "application/json", "MCP-Protocol-Version", "2025-06-18")
	mid := resp.Header.Get("Mcp-Session-Id")
	if resp.StatusCode != 200 || mid == "" {
		t.Fatalf("MCP initialize: %d, session %q", resp.StatusCode, mid)
	}
	sessions = append(sessions, made{"mcp", resp.Header.Get("X-Upstream-Instance"), []string{"Mcp-Session-Id", mid, "MCP-Protocol-Version", "2025-06-18"}})

	paths := map[string]string{"cookie": "/ck/page", "header": "/hd/page", "mcp": "/mcp"}
	for _, s := range sessions {
		for r := 1; r <= 2; r++ {
			for i := range 50 {
				resp := f.do(t, r, "POST", paths[s.name], s.hdr...)
				if got := resp.Header.Get("X-Upstream-Instance"); resp.StatusCode != 200 || got != s.instance {
					t.Fatalf("%s session, request %d through replica %d: status %d on %q, want 200 on %q",
						s.name, i, r, resp.StatusCode, got, s.instance)
				}
			}
		}
	}

	// The SessionAPI of replica c sees the cookie session made through a, and deletes it.
	ctx := context.Background()
	id := strings.TrimPrefix(cookie, "tether-session=")
	got, err := f.replicas[2].Engine.GetSession(ctx, "ck", id)
	if err != nil || got.Instance != sessions[0].instance {
		t.Fatalf("GetSession on replica c: %+v, %v", got, err)
	}
	list, _, err := f.replicas[2].Engine.ListSessions(ctx, session.Filter{Service: "ck"}, "", 100)
	if err != nil || len(list) != 1 || list[0].ID != id {
		t.Fatalf("ListSessions on replica c: %v, %v", list, err)
	}
	if err := f.replicas[2].Engine.DeleteSession(ctx, "ck", id); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, "replica b starts a new session for the deleted cookie", func() bool {
		return strings.HasPrefix(f.do(t, 1, "GET", "/ck/page", "Cookie", cookie).Header.Get("Set-Cookie"), "tether-session=")
	})
}

// TestQuotaHammerOverThreeReplicas: 1000 concurrent streams of one session (one instance, 200
// request slots) over three replicas never have more than 200 admitted at once, counted at the
// upstream and in tether; 300 concurrent new sessions never exceed sessionsPerInstance; every
// slot is back to 0 afterwards.
func TestQuotaHammerOverThreeReplicas(t *testing.T) {
	if testing.Short() {
		t.Skip("1300 concurrent requests")
	}
	svc := service("ck", registry.AffinityCookie)
	svc.SessionsPerInstance = 50
	svc.RequestSlotsPerInstance = 200
	f := startFleet(t, []registry.Service{svc})

	first := f.do(t, 0, "GET", "/ck/")
	cookie := strings.SplitN(first.Header.Get("Set-Cookie"), ";", 2)[0]
	target := f.apps[first.Header.Get("X-Upstream-Instance")]

	var ok, limited, unavailable, timedOut, retried atomic.Int64
	var wg sync.WaitGroup
	// A burst of 1000 at once is decided before the replicas' fair shares settle (the shares
	// follow demand from one lease round to the next), so some streams get 429 while slots
	// are still free; on a machine loaded past the store's call bound some get 503 with
	// Retry-After (StoreUnavailable) instead. A refused stream retries, as a client honouring
	// Retry-After does, until 150 streams hold slots or 30 s have passed; stuck leases would
	// keep it refused.
	retryUntil := time.Now().Add(30 * time.Second)
	retryLater := func(r *reply) bool {
		return r.StatusCode == 429 || r.StatusCode == 503 && r.Header.Get("Retry-After") != ""
	}
	for g := range 1000 {
		wg.Go(func() {
			resp := f.doWith(t, streamClient, g%3, "GET", "/ck/block", "Cookie", cookie)
			for retryLater(resp) && target.blocked.Load() < 150 && time.Now().Before(retryUntil) {
				retried.Add(1)
				time.Sleep(50 * time.Millisecond) // a client's back-off, not a wait for a condition
				resp = f.doWith(t, streamClient, g%3, "GET", "/ck/block", "Cookie", cookie)
			}
			switch resp.StatusCode {
			case 200:
				ok.Add(1)
			case 429:
				limited.Add(1)
			case 504:
				// The harness's ext_proc message timeout (5 s) on an overloaded test machine:
				// not admitted, never reached the upstream.
				timedOut.Add(1)
			default:
				if !retryLater(resp) {
					t.Errorf("stream %d: status %d", g, resp.StatusCode)
				}
				unavailable.Add(1)
			}
		})
	}
	testutil.EventuallyWithin(t, 90*time.Second, "every stream admitted (blocked upstream) or refused", func() bool {
		return target.blocked.Load()+limited.Load()+unavailable.Load()+timedOut.Load() == 1000
	})
	inTether := 0
	for _, r := range f.replicas {
		for _, u := range mustUsage(t, r.Engine, "ck") {
			if u.Instance.ID == target.id {
				inTether += u.Requests
			}
		}
	}
	t.Logf("streams admitted: %d at the upstream (peak %d), %d in tether; refused with 429: %d, with 503 + Retry-After: %d (retries after either: %d); ext_proc timeouts: %d",
		target.blocked.Load(), target.peak.Load(), inTether, limited.Load(), unavailable.Load(), retried.Load(), timedOut.Load())
	if target.peak.Load() > 200 || inTether > 200 {
		t.Fatalf("admitted at once: %d at the upstream, %d in tether; the cap is 200", target.peak.Load(), inTether)
	}
	if target.blocked.Load() < 150 {
		t.Errorf("only %d of 200 slots used by 1000 streams: leases stuck on idle replicas", target.blocked.Load())
	}
	target.release()
	wg.Wait()
	sessiontestDiff(t, "streams ended", int64(1000), ok.Load()+limited.Load()+timedOut.Load())

	// 300 concurrent new sessions over three instances of 50 session slots. Each needs a
	// request slot on the instance it is placed on; the stream phase left up to all 200 of the
	// target's slots leased (idle) to the replicas, which give idle leases back on their own.
	// Wait for that, so that any replica can borrow what the burst needs.
	waitLeasesIdle(t, f)
	var placed, full, limitedNew, timedOutNew atomic.Int64
	pending := make([]int, 300)
	for g := range pending {
		pending[g] = g
	}
	// A client refused with 429 (placed, but its replica's borrow of a request slot failed
	// or got nothing at once under load: the session was ended again) or 504 (the harness's
	// ext_proc message timeout) retries, as clients do, until it is placed or refused with 503.
	for round := 0; len(pending) > 0; round++ {
		if round > 0 {
			waitLeasesIdle(t, f)
		}
		if round == 20 {
			t.Fatalf("%d new-session clients still refused with 429/504 after %d rounds", len(pending), round)
		}
		var mu sync.Mutex
		var again []int
		for _, g := range pending {
			wg.Go(func() {
				resp := f.do(t, g%3, "GET", "/ck/new")
				switch resp.StatusCode {
				case 200:
					placed.Add(1)
					return
				case 503:
					full.Add(1)
					return
				case 429:
					limitedNew.Add(1)
				case 504:
					timedOutNew.Add(1)
				default:
					t.Errorf("new session %d: status %d", g, resp.StatusCode)
					return
				}
				mu.Lock()
				again = append(again, g)
				mu.Unlock()
			})
		}
		wg.Wait()
		pending = again
	}
	ctx := context.Background()
	total := 0
	for id := range f.apps {
		n := f.replicas[0].Store.SessionCount(ctx, "ck", id)
		total += n
		if n > 50 {
			t.Errorf("instance %s holds %d sessions; sessionsPerInstance is 50", id, n)
		}
		list, err := f.replicas[1].Store.ActiveByInstance(ctx, "ck", id)
		if err != nil || len(list) > 50 {
			t.Errorf("instance %s binds %d sessions (%v); sessionsPerInstance is 50", id, len(list), err)
		}
		if n != 50 {
			t.Errorf("instance %s holds %d sessions after every client was placed or refused with 503; want all 50 slots filled", id, n)
		}
	}
	t.Logf("new sessions: %d placed, %d refused (503); retried after 429: %d, after 504: %d; 149 slots were free, %d sessions in the store",
		placed.Load(), full.Load(), limitedNew.Load(), timedOutNew.Load(), total)
	// A 504 may leave its session placed with nobody to use it (its provisional idle timeout
	// ends it), so only without 504s must the clients have got every free slot.
	if placed.Load() > 149 || timedOutNew.Load() == 0 && placed.Load() != 149 {
		t.Errorf("%d new sessions placed into 149 free session slots (%d ext_proc timeouts)", placed.Load(), timedOutNew.Load())
	}

	// End every session through one replica's SessionAPI: every session slot is free again.
	for {
		list, _, err := f.replicas[1].Engine.ListSessions(ctx, session.Filter{Service: "ck", Status: session.StatusActive}, "", 1000)
		if err != nil {
			t.Fatal(err)
		}
		if len(list) == 0 {
			break
		}
		for _, s := range list {
			if err := f.replicas[1].Engine.DeleteSession(ctx, "ck", s.ID); err != nil && !errors.Is(err, session.ErrEnded) {
				t.Fatal(err)
			}
		}
	}
	for id := range f.apps {
		testutil.Eventually(t, "session slots of "+id+" back to 0", func() bool {
			return f.replicas[2].Store.SessionCount(ctx, "ck", id) == 0
		})
	}

	for _, r := range f.replicas {
		testutil.Eventually(t, "request slots back to 0 on replica "+r.Name, func() bool {
			for _, u := range mustUsage(t, r.Engine, "ck") {
				if u.Requests != 0 {
					return false
				}
			}
			return true
		})
	}
}

// waitLeasesIdle waits until no replica holds more than the idle reserve (one chunk) of any
// instance's request slots, so that each can borrow most of the cap.
func waitLeasesIdle(t *testing.T, f *fleet) {
	t.Helper()
	testutil.EventuallyWithin(t, 20*time.Second, "idle request leases given back", func() bool {
		for _, r := range f.replicas {
			for id := range f.apps {
				if r.Leases.Held("ck", id) > quota.DefaultChunk {
					return false
				}
			}
		}
		return true
	})
}

func mustUsage(t *testing.T, e *affinity.Engine, service string) []affinity.InstanceUsage {
	t.Helper()
	u, err := e.Usage(service)
	if err != nil {
		t.Fatal(err)
	}
	return u
}

func sessiontestDiff(t *testing.T, what string, want, got int64) {
	t.Helper()
	if want != got {
		t.Errorf("%s: got %d, want %d", what, got, want)
	}
}
