package sipdecide_test

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/tether-dev/tether/internal/testutil"
	"github.com/tether-dev/tether/pkg/affinity"
	"github.com/tether-dev/tether/pkg/affinity/affinitytest"
	"github.com/tether-dev/tether/pkg/balance"
	"github.com/tether-dev/tether/pkg/dcr/dcrtest"
	"github.com/tether-dev/tether/pkg/registry"
	"github.com/tether-dev/tether/pkg/sipdecide"
)

// hashFixture builds a real engine (registry + memstore + affinity.New) with one hash service
// "voice" over instances, using the documented example DCR rules.
func hashFixture(t testing.TB, instances []registry.Instance) *affinitytest.Fixture {
	t.Helper()
	path := filepath.Join(t.TempDir(), "data-centric-rules.xml")
	if err := os.WriteFile(path, []byte(dcrtest.ExampleRules), 0o644); err != nil {
		t.Fatal(err)
	}
	svc := affinitytest.Service("voice", registry.AffinityHash)
	svc.DCRFile = path
	return affinitytest.New(t, []registry.Service{svc}, instances)
}

// oracle computes, independently of the engine, which instance Maglev gives a key among the
// usable instances: the table the engine must build (ids in registry order, their weights,
// the default table size).
type oracle struct {
	sorted []registry.Instance
	m      *balance.Maglev
}

func newOracle(t testing.TB, instances []registry.Instance) *oracle {
	t.Helper()
	sorted := slices.Clone(instances)
	slices.SortFunc(sorted, func(a, b registry.Instance) int { return strings.Compare(a.ID, b.ID) })
	ids := make([]string, len(sorted))
	wts := make([]uint32, len(sorted))
	for i, in := range sorted {
		ids[i], wts[i] = in.ID, in.Weight
	}
	m, err := balance.NewMaglev(ids, wts)
	if err != nil {
		t.Fatal(err)
	}
	return &oracle{sorted: sorted, m: m}
}

func (o *oracle) pick(t testing.TB, key string, usable func(registry.Instance) bool) registry.Instance {
	t.Helper()
	idx, ok := o.m.Lookup(balance.Hash(key), func(i int) bool { return usable(o.sorted[i]) })
	if !ok {
		t.Fatalf("no usable instance for key %q", key)
	}
	return o.sorted[idx]
}

func allUsable(registry.Instance) bool { return true }

func sipURI(in registry.Instance) string { return "sip:" + in.Address + ":" + strconv.Itoa(in.SIPPort) }

// decide POSTs raw to the handler in-process and returns status and body.
func decide(t testing.TB, h http.Handler, service string, raw []byte) (int, string) {
	t.Helper()
	req := httptest.NewRequest(http.MethodPost, "/v1/sip/"+service+"/decide", bytes.NewReader(raw))
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	return rec.Code, rec.Body.String()
}

// TestSIPDecisionsFollowMaglev: every SIP decision answers the SIP URI of the instance Maglev
// gives the request's key — the DCR key (Request-URI user of a terminating call, resolved
// number) or, when no rule matches, From tag + Call-ID.
func TestSIPDecisionsFollowMaglev(t *testing.T) {
	insts := affinitytest.Instances("voice", 5)
	f := hashFixture(t, insts)
	h := sipdecide.NewHandler(f.Engine)
	o := newOracle(t, insts)
	counts := map[string]int{}
	for i := range 300 {
		var req dcrtest.Request
		var key string
		switch i % 3 {
		case 0: // DCR: terminating, Request-URI user
			req = dcrtest.Request{RequestURI: fmt.Sprintf("sip:user%d@example.com", i), CallID: fmt.Sprintf("c%d", i)}
			key = fmt.Sprintf("user%d", i)
		case 1: // DCR: resolved telephone number
			req = dcrtest.Request{RequestURI: fmt.Sprintf("tel:+1-650-555-%04d", i), CallID: fmt.Sprintf("c%d", i)}
			key = fmt.Sprintf("+1650555%04d", i)
		default: // no rule matches: From tag and Call-ID
			req = dcrtest.Request{RequestURI: "sip:conference.example.com", FromTag: fmt.Sprintf("ft%d", i), CallID: fmt.Sprintf("call-%d@host", i)}
			key = fmt.Sprintf("ft%d:call-%d@host", i, i)
		}
		code, body := decide(t, h, "voice", dcrtest.SIP(req))
		if code != http.StatusOK {
			t.Fatalf("request %d: status %d: %s", i, code, body)
		}
		want := o.pick(t, key, allUsable)
		if body != sipURI(want) {
			t.Errorf("request %d (key %q): answer %q, want %q (%s)", i, key, body, sipURI(want), want.ID)
		}
		counts[body]++
	}
	if len(counts) != 5 {
		t.Errorf("300 calls reached %d instances, want all 5: %v", len(counts), counts)
	}
	// SIP decisions hold no request slot once answered.
	for id, u := range f.Usage(t, "voice") {
		if u[1] != 0 {
			t.Errorf("instance %s has %d requests in flight after SIP decisions", id, u[1])
		}
	}
}

// TestSelectedFieldsForm: a decision asked with query fields instead of the raw message (the
// engine rebuilds the request) answers like the raw form.
func TestSelectedFieldsForm(t *testing.T) {
	insts := affinitytest.Instances("voice", 4)
	f := hashFixture(t, insts)
	h := sipdecide.NewHandler(f.Engine)
	o := newOracle(t, insts)
	for i := range 50 {
		user := fmt.Sprintf("field%d", i)
		q := url.Values{
			"method": {"INVITE"}, "ruri": {"sip:" + user + "@example.com"},
			"from": {"<sip:caller@example.com>;tag=t" + strconv.Itoa(i)}, "to": {"<sip:" + user + "@example.com>"},
			"callid": {fmt.Sprintf("fields-%d@host", i)},
		}
		req := httptest.NewRequest(http.MethodPost, "/v1/sip/voice/decide?"+q.Encode(), nil)
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		if rec.Code != http.StatusOK {
			t.Fatalf("%s: status %d: %s", user, rec.Code, rec.Body)
		}
		if want := sipURI(o.pick(t, user, allUsable)); rec.Body.String() != want {
			t.Errorf("%s: answer %q, want %q", user, rec.Body, want)
		}
		raw := dcrtest.SIP(dcrtest.Request{RequestURI: "sip:" + user + "@example.com", CallID: fmt.Sprintf("fields-%d@host", i)})
		if _, body := decide(t, h, "voice", raw); body != rec.Body.String() {
			t.Errorf("%s: raw form answers %q, fields form %q", user, body, rec.Body)
		}
	}
}

// TestConvergedSameInstance: an HTTP request and a SIP call carrying one user's key reach one
// instance, for many users.
func TestConvergedSameInstance(t *testing.T) {
	insts := affinitytest.Instances("voice", 4)
	f := hashFixture(t, insts)
	h := sipdecide.NewHandler(f.Engine)
	o := newOracle(t, insts)
	ctx := context.Background()
	for i := range 200 {
		user := fmt.Sprintf("user%d", i)
		// SIP: an originating call from the user (P-Asserted-Identity).
		raw := dcrtest.SIP(dcrtest.Request{
			RequestURI: "sip:someone@example.com",
			CallID:     fmt.Sprintf("conv-%d", i),
			Headers: [][2]string{
				{"P-Served-User", "<sip:" + user + "@example.com>;sescase=orig"},
				{"P-Asserted-Identity", "<sip:" + user + "@example.com>"},
			},
		})
		code, sipAnswer := decide(t, h, "voice", raw)
		if code != http.StatusOK {
			t.Fatalf("SIP %d: %d %s", i, code, sipAnswer)
		}
		// HTTP: the user's web request, through the engine's HTTP path.
		d, err := f.Engine.Decide(ctx, affinity.Request{
			Service: "voice", Protocol: affinity.ProtocolHTTP, Method: "GET",
			Authority: "voice.example.com", Path: "/api/calls?user=sip%3A" + user + "%40example.com",
			Headers: map[string][]string{}, Peer: "198.51.100.9:40000",
		})
		if err != nil {
			t.Fatalf("HTTP %d: %v", i, err)
		}
		httpInst := d.Instance()
		d.End()
		if sipAnswer != sipURI(httpInst) {
			t.Errorf("user %s: SIP went to %s, HTTP to %s (%s)", user, sipAnswer, sipURI(httpInst), httpInst.ID)
		}
		if want := o.pick(t, user, allUsable); want.ID != httpInst.ID {
			t.Errorf("user %s: HTTP instance %s, Maglev says %s", user, httpInst.ID, want.ID)
		}
	}
}

// TestUnhealthyInstanceMovesOnlyItsKeys: when one of N instances turns unhealthy only its keys
// move, and they come back when it recovers.
func TestUnhealthyInstanceMovesOnlyItsKeys(t *testing.T) {
	insts := affinitytest.Instances("voice", 5)
	f := hashFixture(t, insts)
	h := sipdecide.NewHandler(f.Engine)
	o := newOracle(t, insts)
	const n = 1000
	raws := make([][]byte, n)
	for i := range raws {
		raws[i] = dcrtest.SIP(dcrtest.Request{RequestURI: fmt.Sprintf("sip:u%d@example.com", i), CallID: fmt.Sprintf("h%d", i)})
	}
	snapshot := func() []string {
		out := make([]string, n)
		for i, raw := range raws {
			code, body := decide(t, h, "voice", raw)
			if code != http.StatusOK {
				t.Fatalf("status %d: %s", code, body)
			}
			out[i] = body
		}
		return out
	}
	before := snapshot()
	down := insts[2]
	if _, err := f.Registry.SetHealth(down.Key(), registry.HealthUnhealthy); err != nil {
		t.Fatal(err)
	}
	f.Sync(t)
	after := waitFor(t, snapshot, func(s []string) bool { return !slices.Contains(s, sipURI(down)) })
	movedOthers, movedDown := 0, 0
	for i := range before {
		switch {
		case before[i] == sipURI(down):
			movedDown++
			if want := o.pick(t, fmt.Sprintf("u%d", i), func(in registry.Instance) bool { return in.ID != down.ID }); after[i] != sipURI(want) {
				t.Errorf("key u%d moved to %s, Maglev fallback is %s", i, after[i], sipURI(want))
			}
		case before[i] != after[i]:
			movedOthers++
		}
	}
	if movedDown == 0 {
		t.Fatal("the unhealthy instance had no keys; test proves nothing")
	}
	if limit := (n - movedDown) / 100; movedOthers > limit {
		t.Errorf("%d keys of healthy instances moved, want ≤ %d (1%%)", movedOthers, limit)
	}
	t.Logf("%d keys moved off %s, %d other keys moved", movedDown, down.ID, movedOthers)

	if _, err := f.Registry.SetHealth(down.Key(), registry.HealthHealthy); err != nil {
		t.Fatal(err)
	}
	f.Sync(t)
	back := waitFor(t, snapshot, func(s []string) bool { return slices.Contains(s, sipURI(down)) })
	for i := range before {
		if back[i] != before[i] {
			t.Errorf("key u%d: %s after recovery, %s before", i, back[i], before[i])
		}
	}
}

// TestRemovedInstanceMovesFewOtherKeys: deregistering one of N instances rebuilds the Maglev
// table over N-1; keys of the remaining instances stay put (≤ 1 % move).
func TestRemovedInstanceMovesFewOtherKeys(t *testing.T) {
	insts := affinitytest.Instances("voice", 5)
	f := hashFixture(t, insts)
	h := sipdecide.NewHandler(f.Engine)
	const n = 1000
	raws := make([][]byte, n)
	for i := range raws {
		raws[i] = dcrtest.SIP(dcrtest.Request{RequestURI: fmt.Sprintf("sip:r%d@example.com", i)})
	}
	snapshot := func() []string {
		out := make([]string, n)
		for i, raw := range raws {
			code, body := decide(t, h, "voice", raw)
			if code != http.StatusOK {
				t.Fatalf("status %d: %s", code, body)
			}
			out[i] = body
		}
		return out
	}
	before := snapshot()
	gone := insts[1]
	if err := f.Registry.Deregister(gone.Key()); err != nil {
		t.Fatal(err)
	}
	f.Sync(t)
	after := waitFor(t, snapshot, func(s []string) bool { return !slices.Contains(s, sipURI(gone)) })
	o := newOracle(t, slices.Delete(slices.Clone(insts), 1, 2))
	movedOthers, others := 0, 0
	for i := range before {
		if want := o.pick(t, fmt.Sprintf("r%d", i), allUsable); after[i] != sipURI(want) {
			t.Errorf("key r%d: %s, Maglev over the remaining instances gives %s", i, after[i], sipURI(want))
		}
		if before[i] == sipURI(gone) {
			continue
		}
		others++
		if before[i] != after[i] {
			movedOthers++
		}
	}
	if limit := others / 100; movedOthers > limit {
		t.Errorf("%d of %d keys of remaining instances moved, want ≤ %d (1%%)", movedOthers, others, limit)
	}
	t.Logf("%d of %d keys of remaining instances moved", movedOthers, others)
}

// waitFor retakes a snapshot until ok holds (the engine follows registry generations
// asynchronously) or 10 s pass.
func waitFor(t *testing.T, snapshot func() []string, ok func([]string) bool) []string {
	t.Helper()
	var s []string
	testutil.Eventually(t, "the engine to follow the registry change", func() bool { s = snapshot(); return ok(s) })
	return s
}

// TestWeightsRespected: SIP keys spread in proportion to instance weights.
func TestWeightsRespected(t *testing.T) {
	insts := affinitytest.Instances("voice", 3)
	for i := range insts {
		insts[i].Weight = uint32(i + 1) // 1, 2, 3
	}
	f := hashFixture(t, insts)
	h := sipdecide.NewHandler(f.Engine)
	const n = 6000
	counts := map[string]int{}
	for i := range n {
		code, body := decide(t, h, "voice", dcrtest.SIP(dcrtest.Request{RequestURI: fmt.Sprintf("sip:w%d@example.com", i)}))
		if code != http.StatusOK {
			t.Fatalf("status %d: %s", code, body)
		}
		counts[body]++
	}
	for i, in := range insts {
		want := float64(n) * float64(i+1) / 6
		got := float64(counts[sipURI(in)])
		if got < want*0.9 || got > want*1.1 {
			t.Errorf("instance %s (weight %d): %v calls, want %v ±10%%", in.ID, in.Weight, got, want)
		}
	}
}

func TestSIPDecisionRejects(t *testing.T) {
	insts := affinitytest.Instances("voice", 2)
	f := hashFixture(t, insts)
	h := sipdecide.NewHandler(f.Engine)
	raw := dcrtest.SIP(dcrtest.Request{})

	if code, body := decide(t, h, "nosuch", raw); code != http.StatusNotFound {
		t.Errorf("unknown service: %d %s", code, body)
	}
	if code, body := decide(t, h, "voice", []byte("not a SIP message\r\n\r\n")); code != http.StatusBadRequest {
		t.Errorf("garbage: %d %s", code, body)
	}
	if code, body := decide(t, h, "voice", []byte("SIP/2.0 200 OK\r\nCall-ID: x\r\n\r\n")); code != http.StatusBadRequest {
		t.Errorf("a response: %d %s", code, body)
	}
	for _, in := range insts {
		if _, err := f.Registry.SetHealth(in.Key(), registry.HealthUnhealthy); err != nil {
			t.Fatal(err)
		}
		f.Sync(t)
	}
	var rec *httptest.ResponseRecorder
	if !testutil.Poll(testutil.DefaultWait, func() bool {
		req := httptest.NewRequest(http.MethodPost, "/v1/sip/voice/decide", bytes.NewReader(raw))
		rec = httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		return rec.Code == http.StatusServiceUnavailable
	}) {
		t.Fatalf("all instances unhealthy: status %d %s, want 503", rec.Code, rec.Body)
	}
	if rec.Header().Get("Retry-After") == "" {
		t.Error("503 without Retry-After")
	}
}

// TestConcurrentSIPDecisions runs decisions from many goroutines (under -race) and checks
// each answer against Maglev.
func TestConcurrentSIPDecisions(t *testing.T) {
	insts := affinitytest.Instances("voice", 3)
	f := hashFixture(t, insts)
	srv := httptest.NewServer(sipdecide.NewHandler(f.Engine))
	t.Cleanup(srv.Close)
	o := newOracle(t, insts)
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 50 {
				user := fmt.Sprintf("g%du%d", g, i)
				raw := dcrtest.SIP(dcrtest.Request{RequestURI: "sip:" + user + "@example.com"})
				resp, err := srv.Client().Post(srv.URL+"/v1/sip/voice/decide", "message/sip", bytes.NewReader(raw))
				if err != nil {
					t.Error(err)
					return
				}
				var b bytes.Buffer
				_, _ = b.ReadFrom(resp.Body)
				_ = resp.Body.Close()
				if want := sipURI(o.pick(t, user, allUsable)); resp.StatusCode != 200 || b.String() != want {
					t.Errorf("%s: %d %q, want %q", user, resp.StatusCode, b.String(), want)
				}
			}
		}()
	}
	wg.Wait()
}
