package status_test

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/tether-dev/tether/internal/testutil"
	"github.com/tether-dev/tether/pkg/affinity"
	"github.com/tether-dev/tether/pkg/affinity/affinitytest"
	tetherv1 "github.com/tether-dev/tether/pkg/api/gen/tether/v1"
	"github.com/tether-dev/tether/pkg/registry"
	"github.com/tether-dev/tether/pkg/status"
)

// receiver is a real loopback webhook receiver that answers the statuses in plan, then 200.
type receiver struct {
	srv    *httptest.Server
	secret []byte

	mu   sync.Mutex
	plan []int
	got  []delivery
}

type delivery struct {
	id, event string
	valid     bool
	body      status.WebhookBody
	answered  int
}

func newReceiver(t *testing.T, secret string, plan ...int) *receiver {
	r := &receiver{secret: []byte(secret), plan: plan}
	r.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		b, _ := io.ReadAll(req.Body)
		d := delivery{id: req.Header.Get(status.HeaderDelivery), event: req.Header.Get(status.HeaderEvent),
			valid: status.Verify(r.secret, req.Header.Get(status.HeaderTimestamp), b, req.Header.Get(status.HeaderSignature))}
		if err := json.Unmarshal(b, &d.body); err != nil {
			t.Errorf("webhook body %q: %v", b, err)
		}
		r.mu.Lock()
		d.answered = http.StatusOK
		if len(r.plan) > 0 {
			d.answered, r.plan = r.plan[0], r.plan[1:]
		}
		r.got = append(r.got, d)
		r.mu.Unlock()
		w.WriteHeader(d.answered)
	}))
	t.Cleanup(r.srv.Close)
	return r
}

func (r *receiver) deliveries() []delivery {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]delivery(nil), r.got...)
}

// TestScaleEventsReachTheWebhook: a real engine opens a standby instance (scale-out); the
// webhook's first delivery is answered 500 and retried with the same delivery id; both
// carry a valid HMAC signature. Emptying the standby for scaleInAfter sends scale-in. The
// snapshot lists both events and the metrics count them.
func TestScaleEventsReachTheWebhook(t *testing.T) {
	svc := affinitytest.Service("web", registry.AffinityCookie)
	svc.SessionsPerInstance = 1
	ins := affinitytest.Instances("web", 2)
	ins[1].State = registry.StateStandby
	var events *status.Events
	f := affinitytest.New(t, []registry.Service{svc}, ins,
		affinitytest.WithEngineOptions(affinity.WithScaleOutHook(func(so affinity.ScaleOut) { events.ScaleOut(so) })))
	events = status.NewEvents(f.Clock.Now, nil)

	rcv := newReceiver(t, "hook-secret", http.StatusInternalServerError)
	hook := status.NewWebhook(rcv.srv.URL, []byte("hook-secret"), status.WithRetries(3, 5*time.Millisecond, 20*time.Millisecond))
	events.Subscribe(hook.Enqueue)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { hook.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })

	first, err := f.Engine.CreateSession(ctx, "web", affinity.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	second, err := f.Engine.CreateSession(ctx, "web", affinity.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if first.Instance != ins[0].ID || second.Instance != ins[1].ID {
		t.Fatalf("sessions on %s and %s, want %s then the standby %s", first.Instance, second.Instance, ins[0].ID, ins[1].ID)
	}
	testutil.Eventually(t, "the scale-out delivered after one retry", func() bool { return hook.Stats().Delivered == 1 })
	got := rcv.deliveries()
	if len(got) != 2 || got[0].answered != 500 || got[1].answered != 200 || got[0].id != got[1].id || got[0].id == "" {
		t.Fatalf("deliveries %+v, want a 500 then a retry of the same delivery answered 200", got)
	}
	for _, d := range got {
		if !d.valid || d.event != status.KindScaleOut || d.body.Kind != status.KindScaleOut || d.body.Service != "web" ||
			d.body.Instance != ins[1].ID || d.body.Desired != 3 {
			t.Errorf("delivery %+v, want a validly signed scale-out of web/%s with 3 desired (2 full, one more)", d, ins[1].ID)
		}
	}

	// Scale-in: the standby empties; nothing is said before scaleInAfter, once after it.
	if err := f.Engine.DeleteSession(ctx, "web", second.ID); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, "the standby's slot to be freed", func() bool { return f.Usage(t, "web")[ins[1].ID][0] == 0 })
	events.ScanScaleIn(f.Registry, f.Engine, time.Minute)
	f.Clock.Advance(59 * time.Second)
	events.ScanScaleIn(f.Registry, f.Engine, time.Minute)
	if n := len(events.Recent()); n != 1 {
		t.Fatalf("%d events before scaleInAfter, want only the scale-out", n)
	}
	f.Clock.Advance(time.Second)
	events.ScanScaleIn(f.Registry, f.Engine, time.Minute)
	events.ScanScaleIn(f.Registry, f.Engine, time.Minute) // reported once
	testutil.Eventually(t, "the scale-in delivered", func() bool { return hook.Stats().Delivered == 2 })
	last := rcv.deliveries()[2]
	if !last.valid || last.body.Kind != status.KindScaleIn || last.body.Instance != ins[1].ID || last.body.Desired != 2 {
		t.Errorf("scale-in delivery %+v", last)
	}
	rec := events.Recent()
	if len(rec) != 2 || rec[0].GetKind() != tetherv1.ScaleEventKind_SCALE_EVENT_KIND_SCALE_OUT || rec[1].GetKind() != tetherv1.ScaleEventKind_SCALE_EVENT_KIND_SCALE_IN {
		t.Errorf("recent events %v", rec)
	}
	snap := status.New(f.Registry, f.Engine, status.WithEvents(events)).Snapshot()
	if len(snap.GetEvents()) != 2 || snap.GetServices()[0].GetActualInstances() != 1 || snap.GetServices()[0].GetDesiredInstances() != 2 {
		t.Errorf("snapshot events %v, services %v", snap.GetEvents(), snap.GetServices())
	}
}

// TestWebhookDoesNotRetryA4xx: a 400 is the receiver's final word; a 429 is retried.
func TestWebhookDoesNotRetryA4xx(t *testing.T) {
	for _, tc := range []struct {
		answer, wantTries int
		delivered         uint64
	}{
		{http.StatusBadRequest, 1, 0},
		{http.StatusTooManyRequests, 2, 1},
	} {
		rcv := newReceiver(t, "s", tc.answer)
		hook := status.NewWebhook(rcv.srv.URL, []byte("s"), status.WithRetries(3, time.Millisecond, time.Millisecond))
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() { hook.Run(ctx); close(done) }()
		hook.Enqueue(status.Event{Kind: status.KindScaleOut, Service: "web", Instance: "a", Time: time.Now()})
		testutil.Eventually(t, "the delivery to finish", func() bool { st := hook.Stats(); return st.Delivered+st.Failed == 1 })
		cancel()
		<-done
		if n := len(rcv.deliveries()); n != tc.wantTries || hook.Stats().Delivered != tc.delivered {
			t.Errorf("answer %d: %d tries, %+v; want %d tries", tc.answer, n, hook.Stats(), tc.wantTries)
		}
	}
}

// TestWebhookFollowsNoRedirect is the regression test for issue 25's finding 6 (the webhook
// followed redirects and re-sent its signed body): a receiver answering 307 to another server
// gets one try, the other server nothing, and the delivery counts as failed.
func TestWebhookFollowsNoRedirect(t *testing.T) {
	elsewhere := newReceiver(t, "s", http.StatusOK)
	redirect := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, elsewhere.srv.URL, http.StatusTemporaryRedirect)
	}))
	t.Cleanup(redirect.Close)
	hook := status.NewWebhook(redirect.URL, []byte("s"), status.WithRetries(3, time.Millisecond, time.Millisecond))
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { hook.Run(ctx); close(done) }()
	hook.Enqueue(status.Event{Kind: status.KindScaleOut, Service: "web", Instance: "a", Time: time.Now()})
	testutil.Eventually(t, "the delivery to finish", func() bool { st := hook.Stats(); return st.Delivered+st.Failed == 1 })
	cancel()
	<-done
	if n := len(elsewhere.deliveries()); n != 0 {
		t.Errorf("the redirect's target received %d signed deliveries", n)
	}
	if st := hook.Stats(); st.Failed != 1 {
		t.Errorf("stats %+v, want the redirected delivery failed", st)
	}
}

func TestSignatureCoversTimestampAndBody(t *testing.T) {
	sig := status.Sign([]byte("k"), "100", []byte("{}"))
	if !status.Verify([]byte("k"), "100", []byte("{}"), sig) {
		t.Fatal("own signature does not verify")
	}
	for _, bad := range [][3]string{{"other", "100", "{}"}, {"k", "101", "{}"}, {"k", "100", "{ }"}} {
		if status.Verify([]byte(bad[0]), bad[1], []byte(bad[2]), sig) {
			t.Errorf("signature verifies for %q", bad)
		}
	}
}

// TestSourcesProtoRefused: the instances a layer's address policy refuses (#25 finding 4) are
// reported per layer in /v1/status.
func TestSourcesProtoRefused(t *testing.T) {
	r := registry.New(registry.WithAddressPolicy(registry.NewAddressPolicy(nil, nil)))
	if err := r.UpdateSource("k8s", "kubernetes", []registry.Service{{Name: "web", Affinity: registry.AffinityNone}}, []registry.Instance{
		{Service: "web", ID: "meta", Address: "169.254.169.254", HTTPPort: 80},
		{Service: "web", ID: "ok", Address: "10.0.0.7", HTTPPort: 80},
	}); err != nil {
		t.Fatal(err)
	}
	for _, s := range status.SourcesProto(r.Sources()) {
		if s.Name == "k8s" && (s.Refused != 1 || s.Instances != 2) {
			t.Errorf("k8s source: refused %d of %d instances, want 1 of 2", s.Refused, s.Instances)
		}
	}
}
