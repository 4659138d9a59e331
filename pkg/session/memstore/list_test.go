package memstore_test

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/tether-dev/tether/pkg/session"
	"github.com/tether-dev/tether/pkg/session/memstore"
	"github.com/tether-dev/tether/pkg/session/sessiontest"
)

// TestListPagingUnderChurn walks 10k sessions page by page while other goroutines keep
// creating, ending and purging sessions all over the key space: every session that exists
// throughout the walk is returned exactly once, and the walk never goes backwards.
func TestListPagingUnderChurn(t *testing.T) {
	const base = 10_000
	ctx := t.Context()
	st, clock := sessiontest.NewMemStore(t, memstore.WithRetention(time.Millisecond))
	newID := func() string {
		id, err := session.NewID()
		if err != nil {
			t.Fatal(err)
		}
		return id
	}
	baseIDs := map[string]string{} // id → instance
	for i := range base {
		id, inst := newID(), fmt.Sprint("i", i%3)
		s := sessiontest.Session("web", id, inst)
		s.IdleTimeout = 0
		sessiontest.MustCreate(t, st, s)
		baseIDs[id] = inst
	}

	stop := make(chan struct{})
	var wg sync.WaitGroup
	for w := range 2 {
		wg.Go(func() {
			r := rand.New(rand.NewPCG(uint64(w), 3))
			var mine []string
			for {
				select {
				case <-stop:
					return
				default:
				}
				id := newID()
				// Most churn lands inside the walked service, some before and after it.
				svc := []string{"api", "web", "web", "web", "zzz"}[r.IntN(5)]
				s := sessiontest.Session(svc, id, fmt.Sprint("i", r.IntN(3)))
				s.IdleTimeout = 0
				if err := st.Create(ctx, s); err != nil {
					t.Errorf("Create: %v", err)
					return
				}
				mine = append(mine, s.Service+"\x00"+id)
				if len(mine) > 50 {
					k := r.IntN(len(mine))
					svc, old := splitKey(mine[k])
					mine = append(mine[:k], mine[k+1:]...)
					if _, err := st.End(ctx, svc, old, session.StatusTerminated, clock.Now()); err != nil {
						t.Errorf("End: %v", err)
						return
					}
				}
				clock.Advance(time.Millisecond)
				if _, _, err := st.Reap(ctx); err != nil { // purges the ended ones
					t.Errorf("Reap: %v", err)
					return
				}
			}
		})
	}

	for _, tc := range []struct {
		name string
		f    session.Filter
		want func(id, inst string) bool
	}{
		{"all", session.Filter{}, func(string, string) bool { return true }},
		{"service", session.Filter{Service: "web"}, func(string, string) bool { return true }},
		{"active", session.Filter{Status: session.StatusActive}, func(string, string) bool { return true }},
		{"instance", session.Filter{Service: "web", Instance: "i1", Status: session.StatusActive},
			func(_, inst string) bool { return inst == "i1" }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			seen := map[string]int{}
			var prevSvc, prevID string
			tok, pages := "", 0
			for {
				page, next, err := st.List(ctx, tc.f, tok, 97)
				if err != nil {
					t.Fatalf("List page %d: %v", pages, err)
				}
				pages++
				for _, s := range page {
					if s.Service < prevSvc || s.Service == prevSvc && s.ID <= prevID {
						t.Fatalf("page %d: %s/%s after %s/%s: order broken", pages, s.Service, s.ID, prevSvc, prevID)
					}
					prevSvc, prevID = s.Service, s.ID
					seen[s.Service+"/"+s.ID]++
				}
				if next == "" {
					break
				}
				tok = next
			}
			want := 0
			for id, inst := range baseIDs {
				if !tc.want(id, inst) {
					continue
				}
				want++
				if seen["web/"+id] != 1 {
					t.Errorf("base session %s seen %d times", id, seen["web/"+id])
				}
			}
			t.Logf("%d pages, %d sessions seen, %d base sessions expected", pages, len(seen), want)
		})
	}
	close(stop)
	wg.Wait()
}

func splitKey(k string) (service, id string) {
	for i := range len(k) {
		if k[i] == 0 {
			return k[:i], k[i+1:]
		}
	}
	return k, ""
}

func TestListLimitAndTokens(t *testing.T) {
	ctx := t.Context()
	st, _ := sessiontest.NewMemStore(t)
	for i := range session.MaxListLimit + 5 {
		sessiontest.MustCreate(t, st, sessiontest.Session("web", fmt.Sprintf("s%05d", i), "a"))
	}
	for _, tc := range []struct {
		limit, want int
	}{{0, session.DefaultListLimit}, {-1, session.DefaultListLimit}, {7, 7}, {session.MaxListLimit + 1, session.MaxListLimit}} {
		page, next, err := st.List(ctx, session.Filter{}, "", tc.limit)
		if err != nil || len(page) != tc.want || next == "" {
			t.Errorf("List(limit %d) = %d sessions, next %q, %v; want %d and a next token", tc.limit, len(page), next, err, tc.want)
		}
	}
	// A token from one filter is a position usable with another.
	_, next, err := st.List(ctx, session.Filter{Service: "web"}, "", 10)
	if err != nil {
		t.Fatal(err)
	}
	page, _, err := st.List(ctx, session.Filter{}, next, 1)
	if err != nil || len(page) != 1 || page[0].ID != "s00010" {
		t.Errorf("List after the 10th session = %+v, %v; want s00010", page, err)
	}
	for _, bad := range []string{"x", "AAAA", "AWFiYwA", "AgB3ZWIAcwA"} { // junk, short, one name, wrong version
		if _, _, err := st.List(ctx, session.Filter{}, bad, 1); !errors.Is(err, session.ErrInvalidPageToken) {
			t.Errorf("List(token %q): %v, want ErrInvalidPageToken", bad, err)
		}
	}
}
