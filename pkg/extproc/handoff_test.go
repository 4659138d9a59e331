package extproc_test

import (
	"context"
	"errors"
	"io"
	"testing"

	"github.com/tether-dev/tether/internal/testutil"
	"github.com/tether-dev/tether/pkg/affinity"
	"github.com/tether-dev/tether/pkg/affinity/affinitytest"
	"github.com/tether-dev/tether/pkg/extproc"
	"github.com/tether-dev/tether/pkg/registry"
)

// TestHandOffOnlyWhatTetherHasAnswered: HandOff ends with OK the side streams of exchanges
// whose response headers tether answered; an exchange still before its response headers, and
// an MCP SSE GET whose session id tether has not learned yet, go on — each is handed off the
// moment it becomes ready, after its answer went out. The Decision ends with the stream.
func TestHandOffOnlyWhatTetherHasAnswered(t *testing.T) {
	ck := affinitytest.Service("ck", registry.AffinityCookie)
	ck.Match = registry.Match{PathPrefix: "/ck"}
	sse := affinitytest.Service("mcp", registry.AffinityMCPSSE)
	sse.Match = registry.Match{PathPrefix: "/sse"}
	e := newEnv(t, []registry.Service{ck, sse}, append(affinitytest.Instances("ck", 2), affinitytest.Instances("mcp", 2)...))

	// Answered at its response headers: ready.
	done, _ := e.open(t, "ck")
	chosen := destination(roundTrip(t, done, reqHeaders("GET", "/ck/a", true)))
	roundTrip(t, done, respHeaders("200", chosen, false))
	// Not yet at its response headers.
	early, _ := e.open(t, "ck")
	earlyDest := destination(roundTrip(t, early, reqHeaders("GET", "/ck/b", true)))
	// An SSE GET whose endpoint event has not come yet.
	get, _ := e.open(t, "mcp")
	sseDest := destination(roundTrip(t, get, reqHeaders("GET", "/sse", true)))
	roundTrip(t, get, respHeaders("200", sseDest, false, "content-type", "text/event-stream"))
	testutil.Eventually(t, "one exchange ready", func() bool { return e.srv.Stats().HandoffReady == 1 })

	e.srv.Drain()
	e.srv.HandOff()
	if _, err := done.Recv(); !errors.Is(err, io.EOF) {
		t.Fatalf("answered exchange: %v, want its stream ended with OK", err)
	}
	if s := e.srv.Stats(); s.HandedOff != 1 || s.OpenStreams != 2 {
		t.Fatalf("stats %+v: want 1 handed off, the 2 others open", s)
	}

	// The early exchange is answered normally (its cookie goes out), then handed off.
	resp := roundTrip(t, early, respHeaders("200", earlyDest, false))
	if _, _, ok := setHeader(resp.GetResponseHeaders().GetResponse().GetHeaderMutation(), "set-cookie"); !ok {
		t.Fatalf("answer after HandOff lacks the Set-Cookie: %v", resp)
	}
	if _, err := early.Recv(); !errors.Is(err, io.EOF) {
		t.Fatalf("early exchange after its answer: %v, want OK", err)
	}

	// The SSE GET keeps its stream until the session id is learned.
	r := roundTrip(t, get, respBody(": ok\n\n", false))
	if r.GetResponseBody() == nil {
		t.Fatalf("chunk before the endpoint event: %v", r)
	}
	roundTrip(t, get, respBody("event: endpoint\ndata: /messages?sessionId=6ba7b8109dad11d180b400c04fd430c8\n\n", false))
	if _, err := get.Recv(); !errors.Is(err, io.EOF) {
		t.Fatalf("SSE GET after its session id: %v, want OK", err)
	}
	if s := e.srv.Stats(); s.SessionsLearned != 1 || s.HandedOff != 3 {
		t.Fatalf("stats %+v: want the session learned and 3 exchanges handed off", s)
	}
	e.counter.waitAllEnded(t)
}

// refusingEngine's decisions refuse HandOff, as a decision on shared slots does when its slot
// cannot stay counted after the exchange (a service without maxLifetime, a lapsed lease).
type refusingEngine struct{ inner extproc.Engine }

func (r refusingEngine) Decide(ctx context.Context, req affinity.Request) (affinity.Decision, error) {
	d, err := r.inner.Decide(ctx, req)
	if err != nil {
		return nil, err
	}
	return refusingDecision{d}, nil
}

type refusingDecision struct{ affinity.Decision }

func (refusingDecision) HandOff(context.Context) error { return errors.New("no bound") }

// TestHandOffRefusedKeepsTheExchange: an exchange whose Decision refuses the handoff is not
// handed off: its stream goes on being answered after HandOff (counted in HandoffRefused),
// it is not tried again, and its Decision ends when the stream does.
func TestHandOffRefusedKeepsTheExchange(t *testing.T) {
	ck := affinitytest.Service("ck", registry.AffinityCookie)
	ck.Match = registry.Match{PathPrefix: "/ck"}
	f := affinitytest.New(t, []registry.Service{ck}, affinitytest.Instances("ck", 2))
	e := newEnvWith(t, f, refusingEngine{f.Engine})
	st, _ := e.open(t, "ck")
	chosen := destination(roundTrip(t, st, reqHeaders("GET", "/ck/a", true)))
	roundTrip(t, st, respHeaders("200", chosen, false))
	testutil.Eventually(t, "the exchange ready", func() bool { return e.srv.Stats().HandoffReady == 1 })

	e.srv.Drain()
	e.srv.HandOff()
	testutil.Eventually(t, "the handoff refused", func() bool { return e.srv.Stats().HandoffRefused == 1 })
	if r := roundTrip(t, st, respBody("data: more\n\n", false)); r.GetResponseBody() == nil {
		t.Fatalf("a body chunk after the refused handoff: %v, want it answered", r)
	}
	if s := e.srv.Stats(); s.HandedOff != 0 || s.OpenStreams != 1 || s.HandoffRefused != 1 {
		t.Fatalf("stats %+v: want nothing handed off, the stream open, 1 refused", s)
	}
	if got := requestsInFlight(t, f, "ck"); got != 1 {
		t.Errorf("request slots in flight after the refusal: %d, want the exchange's 1", got)
	}
	if err := st.CloseSend(); err != nil {
		t.Fatal(err)
	}
	if _, err := st.Recv(); !errors.Is(err, io.EOF) {
		t.Fatalf("after the half-close: %v, want OK", err)
	}
	e.counter.waitAllEnded(t)
	if got := requestsInFlight(t, f, "ck"); got != 0 {
		t.Errorf("request slots in flight after the stream ended: %d", got)
	}
}
