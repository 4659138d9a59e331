package health_test

import (
	"context"
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tether-dev/tether/internal/testutil"
	"github.com/tether-dev/tether/pkg/health"
	"github.com/tether-dev/tether/pkg/registry"
)

// leaseTable is an in-process lease (what redisstore.Store.HoldLease is in Redis): one
// holder at a time until its TTL lapses without renewal.
type leaseTable struct {
	mu     sync.Mutex
	holder string
	until  time.Time
}

// lease is one replica's handle on the table; while down is set its calls fail as if the
// store were unreachable.
type lease struct {
	t    *leaseTable
	me   string
	down atomic.Bool
}

func (l *lease) Hold(_ context.Context, ttl time.Duration) (bool, error) {
	if l.down.Load() {
		return false, errors.New("store unreachable")
	}
	l.t.mu.Lock()
	defer l.t.mu.Unlock()
	now := time.Now()
	if l.t.holder == l.me || l.t.holder == "" || !now.Before(l.t.until) {
		l.t.holder, l.t.until = l.me, now.Add(ttl)
		return true, nil
	}
	return false, nil
}

func (l *lease) Release(context.Context) error {
	if l.down.Load() {
		return errors.New("store unreachable")
	}
	l.t.mu.Lock()
	defer l.t.mu.Unlock()
	if l.t.holder == l.me {
		l.t.holder = ""
	}
	return nil
}

type tagged struct {
	name string
	rt   http.RoundTripper
}

func (tt tagged) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("X-Checker", tt.name)
	return tt.rt.RoundTrip(r)
}

type leased struct {
	c      *health.Checker
	lease  *lease
	cancel context.CancelFunc
	done   chan struct{}
}

// TestLeaseElectsOneChecker: of two checkers sharing a lease only the holder probes (counted
// at the upstream); when the holder cannot renew, it stops probing before its lease can lapse
// and the other probes within TTL + TTL/10 + interval; after a TTL without the store, the cut-off
// one checks on its own until the store answers; a holder that stops gracefully hands the lease
// over at once; two elected checkers never check at once.
func TestLeaseElectsOneChecker(t *testing.T) {
	var mu sync.Mutex
	by := map[string]int{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		by[r.Header.Get("X-Checker")]++
		mu.Unlock()
	}))
	t.Cleanup(srv.Close)
	counts := func() map[string]int {
		mu.Lock()
		defer mu.Unlock()
		out := map[string]int{}
		for k, v := range by {
			out[k] = v
		}
		return out
	}
	const interval, ttl = 20 * time.Millisecond, 600 * time.Millisecond
	svc := registry.Service{Name: "web", HealthCheck: registry.HealthCheck{Path: "/healthz", Interval: interval, Timeout: time.Second,
		HealthyThreshold: 1, UnhealthyThreshold: 1}}
	in := registry.Instance{Service: "web", ID: "a", Address: "127.0.0.1", HTTPPort: srv.Listener.Addr().(*net.TCPAddr).Port}
	table := &leaseTable{}
	var checkers []*leased
	for _, name := range []string{"x", "y"} {
		reg := registry.New()
		if err := reg.Apply([]registry.Service{svc}, []registry.Instance{in}); err != nil {
			t.Fatal(err)
		}
		l := &lease{t: table, me: name}
		c := health.New(reg, health.WithLease(l, ttl), health.WithTransport(tagged{name, &http.Transport{}}))
		ctx, cancel := context.WithCancel(context.Background())
		lc := &leased{c: c, lease: l, cancel: cancel, done: make(chan struct{})}
		go func() { defer close(lc.done); _ = c.Run(ctx) }()
		t.Cleanup(func() { cancel(); <-lc.done })
		checkers = append(checkers, lc)
	}
	var both atomic.Bool
	sctx, stop := context.WithCancel(context.Background())
	sampled := make(chan struct{})
	go func() {
		defer close(sampled)
		tick := time.NewTicker(time.Millisecond) // a sampler: it only watches
		defer tick.Stop()
		for {
			select {
			case <-sctx.Done():
				return
			case <-tick.C:
			}
			elected := func(c *health.Checker) bool { return c.Leading() && !c.Local() }
			if elected(checkers[0].c) && elected(checkers[1].c) {
				both.Store(true)
			}
		}
	}()
	t.Cleanup(func() { stop(); <-sampled })

	testutil.Eventually(t, "10 checks", func() bool { c := counts(); return c["x"]+c["y"] >= 10 })
	lead, other := checkers[0], checkers[1]
	if !lead.c.Leading() {
		lead, other = other, lead
	}
	if c := counts(); len(c) != 1 || c[lead.lease.me] == 0 {
		t.Fatalf("checks by checker: %v, want all by the holder %s", c, lead.lease.me)
	}

	// The holder cannot renew: it stops before its lease lapses; the other takes over after.
	lead.lease.down.Store(true)
	lost := time.Now()
	testutil.Eventually(t, "the other checker probes", func() bool { return counts()[other.lease.me] > 0 })
	if took, bound := time.Since(lost), ttl+ttl/10+interval; took > bound+500*time.Millisecond {
		t.Errorf("takeover after the holder lost Redis took %v, want ≤ %v", took, bound)
	}

	// Unable to reach the lease store for a TTL, it checks on its own (health must not freeze).
	frozen := counts()[lead.lease.me]
	testutil.Eventually(t, "the checker without the store checks on its own", func() bool {
		return lead.c.Local() && counts()[lead.lease.me] > frozen
	})

	// The store answers again: it stops checking on its own (the other holds the lease). The
	// holder then stops gracefully and releases the lease: the first one takes over at its next
	// try, not when the lease would have lapsed.
	lead.lease.down.Store(false)
	testutil.Eventually(t, "the first checker stops checking on its own", func() bool { return !lead.c.Leading() })
	stopped := time.Now()
	other.cancel()
	<-other.done
	testutil.Eventually(t, "the first checker holds the lease", func() bool { return lead.c.Leading() && !lead.c.Local() })
	if took := time.Since(stopped); took >= ttl {
		t.Errorf("handover after a graceful stop took %v, want well under the TTL %v", took, ttl)
	}
	if both.Load() {
		t.Error("both checkers probed at once")
	}
}
