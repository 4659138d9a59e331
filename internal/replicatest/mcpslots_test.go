package replicatest_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tether-dev/tether/internal/redistest"
	"github.com/tether-dev/tether/internal/replicatest"
	"github.com/tether-dev/tether/internal/testutil"
	"github.com/tether-dev/tether/pkg/affinity"
	"github.com/tether-dev/tether/pkg/affinity/affinitytest"
	"github.com/tether-dev/tether/pkg/registry"
	"github.com/tether-dev/tether/pkg/session"
)

// TestMCPInitializeSlotsExactAcrossReplicas: concurrent MCP initializes spread over three
// replicas never hold more than sessionsPerInstance slots of an instance, bound or not:
// counted at the upstream (initializes held there at once) and in Redis (sessions plus
// reservations); failed initializes give their reservations back; every reservation is back to
// 0 afterwards and every instance binds exactly its cap.
func TestMCPInitializeSlotsExactAcrossReplicas(t *testing.T) {
	const perInstance, clients = 4, 60
	svc := service("mcp", registry.AffinityMCPStreamable)
	svc.SessionsPerInstance = perInstance
	svc.RequestSlotsPerInstance = 1000
	f := startFleet(t, []registry.Service{svc})
	ctx := context.Background()
	st := f.replicas[0].Store
	reservations := func() int {
		n, err := st.ReservationCount(ctx, "mcp")
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	initialize := func(g int, path string) int {
		return f.do(t, g%3, "POST", path, "Content-Type", "application/json", "MCP-Protocol-Version", "2025-06-18").StatusCode
	}

	// Initializes the upstream answers with 500: each reservation is given back.
	var wg sync.WaitGroup
	var failed, refused atomic.Int64
	for g := range clients {
		wg.Go(func() {
			switch code := initialize(g, "/mcp/fail"); code {
			case 500:
				failed.Add(1)
			case 503, 504:
				refused.Add(1)
			default:
				t.Errorf("failing initialize %d: status %d", g, code)
			}
		})
	}
	wg.Wait()
	t.Logf("failing initializes: %d answered 500 by the upstream, %d refused", failed.Load(), refused.Load())
	testutil.Eventually(t, "the failed initializes' reservations released", func() bool { return reservations() == 0 })
	for id := range f.apps {
		if n := st.SessionCount(ctx, "mcp", id); n != 0 {
			t.Errorf("instance %s counts %d session slots after only failed initializes", id, n)
		}
	}

	// Initializes held at the upstream until released: at most the cap of each instance gets
	// there, the rest are refused (503), and the held ones fill every slot exactly.
	refused.Store(0)
	var bound atomic.Int64
	for g := range clients {
		wg.Go(func() {
			switch code := initialize(g, "/mcp/block"); code {
			case 200:
				bound.Add(1)
			case 503, 504:
				refused.Add(1)
			default:
				t.Errorf("initialize %d: status %d", g, code)
			}
		})
	}
	held := func() int64 {
		var n int64
		for _, a := range f.apps {
			n += a.blocked.Load()
		}
		return n
	}
	testutil.EventuallyWithin(t, 60*time.Second, "every initialize held at an upstream or refused", func() bool {
		return held()+refused.Load() == clients
	})
	for id, a := range f.apps {
		if n := a.blocked.Load(); n != perInstance {
			t.Errorf("instance %s holds %d initializes at once; sessionsPerInstance is %d", id, n, perInstance)
		}
		if n := st.SessionCount(ctx, "mcp", id); n != perInstance {
			t.Errorf("Redis counts %d session slots of %s while its initializes are pending, want %d", n, id, perInstance)
		}
	}
	if n := reservations(); n != 3*perInstance {
		t.Errorf("%d reservations while %d initializes are pending", n, 3*perInstance)
	}
	for _, a := range f.apps {
		a.release()
	}
	wg.Wait()
	t.Logf("initializes: %d bound, %d refused; peak at the upstreams: %d", bound.Load(), refused.Load(), func() (p int64) {
		for _, a := range f.apps {
			p = max(p, a.peak.Load())
		}
		return p
	}())
	if bound.Load() != 3*perInstance {
		t.Errorf("%d initializes bound, want %d", bound.Load(), 3*perInstance)
	}
	testutil.Eventually(t, "every reservation converted", func() bool { return reservations() == 0 })
	for id := range f.apps {
		list, err := f.replicas[1].Store.ActiveByInstance(ctx, "mcp", id)
		if err != nil || len(list) != perInstance {
			t.Errorf("instance %s binds %d MCP sessions (%v), want %d", id, len(list), err, perInstance)
		}
		if n := st.SessionCount(ctx, "mcp", id); n != perInstance {
			t.Errorf("Redis counts %d session slots of %s after binding, want %d", n, id, perInstance)
		}
		for _, s := range list {
			if _, err := st.End(ctx, "mcp", s.ID, session.StatusTerminated, time.Now()); err != nil {
				t.Fatal(err)
			}
		}
	}
	for id := range f.apps {
		testutil.Eventually(t, "session slots of "+id+" back to 0", func() bool { return st.SessionCount(ctx, "mcp", id) == 0 })
	}
}

// TestMCPHandleMintSlotsExactAcrossReplicas: handle mints (tools/call of a minting tool,
// MCP 2026-07-28, no session) decided concurrently by three replicas hold reservations: never
// more than sessionsPerInstance per instance across the replicas; the mints whose response
// names a handle bind it in the reservation's slot, the others give theirs back at the end.
func TestMCPHandleMintSlotsExactAcrossReplicas(t *testing.T) {
	const perInstance, mints = 3, 60
	svc := service("h", registry.AffinityMCPStreamable)
	svc.SessionsPerInstance = perInstance
	svc.RequestSlotsPerInstance = 1000
	svc.MCPHandle = registry.MCPHandle{Header: "handle", LearnHeader: "x-handle", MintTools: []string{"open"}}
	srv := redistest.Start(t)
	reps := replicatest.Start(t, srv.Addr, 3, []registry.Service{svc}, affinitytest.Instances("h", 3), replicatest.Options{})
	ctx := context.Background()
	req := affinity.Request{Protocol: affinity.ProtocolHTTP, Method: "POST", Authority: "h.example", Path: "/h", Headers: map[string][]string{
		"mcp-protocol-version": {"2026-07-28"}, "mcp-method": {"tools/call"}, "mcp-name": {"open"}}}
	var mu sync.Mutex
	var held []affinity.Decision
	var refused atomic.Int64
	var wg sync.WaitGroup
	for g := range mints {
		wg.Go(func() {
			d, err := reps[g%3].Engine.Decide(ctx, req)
			var rej *affinity.Reject
			switch {
			case err == nil:
				mu.Lock()
				held = append(held, d)
				mu.Unlock()
			case errors.As(err, &rej) && rej.Class == affinity.ClassNoCapacity:
				refused.Add(1)
			default:
				t.Errorf("mint %d: %v", g, err)
			}
		})
	}
	wg.Wait()
	st := reps[0].Store
	perInst := map[string]int{}
	for _, d := range held {
		perInst[d.Instance().ID]++
	}
	t.Logf("mints decided at once: %d (per instance %v), %d refused", len(held), perInst, refused.Load())
	if len(held) != 3*perInstance {
		t.Errorf("%d mints hold a slot at once over three replicas, want %d", len(held), 3*perInstance)
	}
	for id, n := range perInst {
		if n > perInstance || st.SessionCount(ctx, "h", id) != n {
			t.Errorf("instance %s: %d mints in flight, Redis counts %d; the cap is %d", id, n, st.SessionCount(ctx, "h", id), perInstance)
		}
	}
	bound := 0
	for i, d := range held {
		if i%2 == 0 {
			d.OnResponse(affinity.Response{Status: 200, Headers: map[string][]string{"x-handle": {fmt.Sprintf("handle-%02d", i)}}})
			bound++
		}
		d.End()
	}
	testutil.Eventually(t, "every mint's reservation converted or released", func() bool {
		n, err := st.ReservationCount(ctx, "h")
		return err == nil && n == 0
	})
	total := 0
	for _, in := range affinitytest.Instances("h", 3) {
		total += st.SessionCount(ctx, "h", in.ID)
	}
	if total != bound {
		t.Errorf("Redis counts %d session slots after %d handles were bound", total, bound)
	}
}
