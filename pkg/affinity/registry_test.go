package affinity_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"

	"github.com/tether-dev/tether/internal/testutil"
	"github.com/tether-dev/tether/pkg/affinity"
	"github.com/tether-dev/tether/pkg/affinity/affinitytest"
	"github.com/tether-dev/tether/pkg/registry"
)

// Concurrent requests of one session whose instance died rebind it exactly once: they all land
// on the same new instance and exactly one session slot is held.
func TestConcurrentRebind(t *testing.T) {
	f := affinitytest.New(t, []registry.Service{affinitytest.Service("fn", registry.AffinityCookie)}, affinitytest.Instances("fn", 4))
	id, from := newCookieSession(t, f, "fn")
	setHealth(t, f, "fn", from, registry.HealthUnhealthy)
	var wg sync.WaitGroup
	got := make(chan string, 64)
	for range 64 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			d, err := f.Engine.Decide(context.Background(), cookieReq("fn", id))
			if err != nil {
				t.Error(err)
				return
			}
			got <- d.Instance().ID
			d.End()
		}()
	}
	wg.Wait()
	close(got)
	var to string
	for inst := range got {
		if to == "" {
			to = inst
		}
		if inst != to || inst == from {
			t.Fatalf("requests of one session went to %s and %s (dead: %s)", to, inst, from)
		}
	}
	total := 0
	for _, u := range f.Usage(t, "fn") {
		total += u[0]
		if u[1] != 0 {
			t.Errorf("request slot left: %v", u)
		}
	}
	if total != 1 {
		t.Errorf("%d session slots held for one session: %v", total, f.Usage(t, "fn"))
	}
}

// Config reloads change the slot caps of existing instances; an instance removed and added
// back keeps its exact count.
func TestRegistryChanges(t *testing.T) {
	svc := affinitytest.Service("fn", registry.AffinityHeader)
	svc.SessionsPerInstance = 2
	insts := affinitytest.Instances("fn", 2)
	f := affinitytest.New(t, []registry.Service{svc}, insts)
	for _, id := range []string{"a", "b"} {
		mustDecide(t, f, affinitytest.HTTP("fn", "GET", "/", "x-tether-session", id)).End()
	}
	svc.SessionsPerInstance = 3
	svc.RequestSlotsPerInstance = 7
	if err := f.Registry.Apply([]registry.Service{svc}, insts); err != nil {
		t.Fatal(err)
	}
	f.Sync(t)
	u, err := f.Engine.Usage("fn")
	if err != nil {
		t.Fatal(err)
	}
	if u[0].SessionCap != 3 || u[0].RequestCap != 7 || u[0].Sessions != 2 {
		t.Errorf("after reload %+v, want caps 3/7 with the 2 sessions kept", u[0])
	}
	mustDecide(t, f, affinitytest.HTTP("fn", "GET", "/", "x-tether-session", "c")).End()
	if u := f.Usage(t, "fn")["i1"]; u[0] != 3 {
		t.Errorf("the raised cap did not apply: %v", u)
	}
	// Remove i1 (its sessions stay bound until their next request) and add it back.
	if err := f.Registry.Deregister(registry.Key{Service: "fn", ID: "i1"}); err != nil {
		t.Fatal(err)
	}
	f.Sync(t)
	if _, err := f.Engine.Usage("fn"); err != nil {
		t.Fatal(err)
	}
	if err := f.Registry.Register(insts[0]); err != nil {
		t.Fatal(err)
	}
	f.Sync(t)
	if u := f.Usage(t, "fn")["i1"]; u[0] != 3 {
		t.Errorf("re-registered i1 counts %d sessions, want 3", u[0])
	}
	d := mustDecide(t, f, affinitytest.HTTP("fn", "GET", "/", "x-tether-session", "a"))
	if d.Instance().ID != "i1" || d.NewSession() {
		t.Errorf("session a went to %s (new %v)", d.Instance().ID, d.NewSession())
	}
	d.End()
}

// A hash service whose DCR file is missing uses the default keys (still hashing HTTP by peer)
// and picks the rules up once the file appears.
func TestHashMissingDCRFile(t *testing.T) {
	svc := affinitytest.Service("conv", registry.AffinityHash)
	svc.DCRFile = filepath.Join(t.TempDir(), "later.xml")
	f := affinitytest.New(t, []registry.Service{svc}, affinitytest.Instances("conv", 8))
	req := func(peer string) affinity.Request {
		r := affinitytest.HTTP("conv", "GET", "/", "x-user", "alice")
		r.Peer = peer
		return r
	}
	d := mustDecide(t, f, req("192.0.2.1:1"))
	if hv := d.OnResponse(affinity.Response{Status: 200}); len(hv) != 0 {
		t.Errorf("a DCR service fell back to sticky cookies: %v", hv)
	}
	d.End()
	if err := os.WriteFile(svc.DCRFile, []byte(testDCR), 0o600); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, "the DCR file to load", func() bool {
		first := ""
		for p := range 16 {
			d := mustDecide(t, f, req("192.0.2."+string(rune('a'+p))+":1"))
			d.End()
			if first == "" {
				first = d.Instance().ID
			} else if d.Instance().ID != first {
				return false
			}
		}
		return true // every peer with X-User alice lands together: the rule applies
	})
}

// Decisions of every mode built while the sweeper walks the open set and DELETEs end streams:
// run under -race, this checks that a decision is complete before anyone else can see it.
func TestConcurrentModesWithSweeper(t *testing.T) {
	services := []registry.Service{
		affinitytest.Service("ck", registry.AffinityCookie),
		affinitytest.Service("mcp", registry.AffinityMCPStreamable),
		affinitytest.Service("sse", registry.AffinityMCPSSE),
	}
	var insts []registry.Instance
	for _, s := range services {
		insts = append(insts, affinitytest.Instances(s.Name, 2)...)
	}
	f := affinitytest.New(t, services, insts, affinitytest.WithEngineOptions(affinity.WithSweepInterval(100_000))) // 100 µs
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 60 {
				sid := "S" + string(rune('a'+g)) + string(rune('a'+i%26))
				for _, req := range []affinity.Request{
					cookieReq("ck", ""),
					mcpReq("POST", ""),
					mcpReq("GET", sid),
					mcpReq("DELETE", sid),
					affinitytest.HTTP("sse", "GET", "/sse"),
				} {
					d, err := f.Engine.Decide(context.Background(), req)
					if err != nil {
						continue // 404s for ids not learned yet are expected
					}
					d.OnResponse(affinity.Response{Status: 200, Headers: map[string][]string{"mcp-session-id": {sid}}})
					if d.WantsResponseBody() {
						_ = d.LearnSession(sid)
					}
					d.End()
				}
			}
		}()
	}
	wg.Wait()
	for _, svc := range []string{"ck", "mcp", "sse"} {
		for id, u := range f.Usage(t, svc) {
			if u[1] != 0 {
				t.Errorf("%s/%s: %d request slots still held", svc, id, u[1])
			}
		}
	}
}

// HashBalanceFactor bounds the in-flight load per instance: one hot key spreads once its
// instance reaches factor × average; without the factor it stays on one instance.
func TestHashBoundedLoad(t *testing.T) {
	for _, factor := range []float64{0, 1.25} {
		t.Run(fmt.Sprint(factor), func(t *testing.T) {
			svc := affinitytest.Service("conv", registry.AffinityHash)
			svc.HashBalanceFactor = factor
			svc.DCRFile = filepath.Join(t.TempDir(), "dcr.xml")
			if err := os.WriteFile(svc.DCRFile, []byte(testDCR), 0o600); err != nil {
				t.Fatal(err)
			}
			f := affinitytest.New(t, []registry.Service{svc}, affinitytest.Instances("conv", 4))
			var open []affinity.Decision
			for range 40 {
				open = append(open, mustDecide(t, f, affinitytest.HTTP("conv", "GET", "/", "x-user", "hot")))
			}
			maxLoad := 0
			for _, u := range f.Usage(t, "conv") {
				maxLoad = max(maxLoad, u[1])
			}
			want := 40
			if factor > 0 {
				want = 13 // ceil(1.25 × 40 / 4)
			}
			if (factor == 0 && maxLoad != want) || (factor > 0 && maxLoad > want) {
				t.Errorf("busiest instance carries %d of 40, want %s %d", maxLoad, map[bool]string{true: "=", false: "≤"}[factor == 0], want)
			}
			for _, d := range open {
				d.End()
			}
		})
	}
}
