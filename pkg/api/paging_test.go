package api_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	tetherv1 "github.com/tether-dev/tether/pkg/api/gen/tether/v1"
	"github.com/tether-dev/tether/pkg/session"
)

// TestListPaging10k walks 10 000 sessions page by page over each transport while other
// sessions are created and deleted between pages, and checks that every one of the 10 000 is returned exactly
// once, in id order.
func TestListPaging10k(t *testing.T) {
	const n = 10_000
	srv := startWorld(t)
	ctx := context.Background()
	now := srv.Clock.Now()
	want := make(map[string]bool, n)
	for i := range n {
		id, err := session.NewID()
		if err != nil {
			t.Fatal(err)
		}
		s := session.Session{ID: id, Service: "web", Instance: fmt.Sprintf("i%d", i%2+1), Kind: session.KindCookie,
			Created: now, TTL: 6 * time.Hour}
		if err := srv.Store.Create(ctx, s); err != nil {
			t.Fatal(err)
		}
		want[id] = true
	}
	forEachTransport(t, func(t *testing.T, tr transport) {
		c := tr.new(t, srv, "")

		// Churn between pages: sessions created and deleted through the API during the walk
		// (new ids land before and after the cursor).
		var churned []string
		churn := func() {
			for range 5 {
				s, err := c.CreateSession(ctx, &tetherv1.CreateSessionRequest{Service: "web"})
				if err != nil {
					t.Fatalf("churn create: %v", err)
				}
				churned = append(churned, s.GetId())
			}
			for len(churned) > 5 { // keep 5 alive: the service has 40 session slots
				if err := c.DeleteSession(ctx, "web", churned[0]); err != nil {
					t.Fatalf("churn delete: %v", err)
				}
				churned = churned[1:]
			}
		}
		seen := map[string]int{}
		last, token, pages := "", "", 0
		for {
			page, err := c.ListSessions(ctx, &tetherv1.ListSessionsRequest{Service: "web", PageSize: 1000, PageToken: token})
			if err != nil {
				t.Fatalf("page %d: %v", pages, err)
			}
			pages++
			if len(page.GetSessions()) > 1000 {
				t.Fatalf("page %d has %d sessions, above the page size", pages, len(page.GetSessions()))
			}
			for _, s := range page.GetSessions() {
				if s.GetId() <= last {
					t.Fatalf("page %d: id %s after %s: not in id order", pages, s.GetId(), last)
				}
				last = s.GetId()
				seen[s.GetId()]++
			}
			if token = page.GetNextPageToken(); token == "" {
				break
			}
			churn()
		}
		for _, id := range churned {
			if err := c.DeleteSession(ctx, "web", id); err != nil {
				t.Fatalf("churn delete: %v", err)
			}
		}
		lost, dup := 0, 0
		for id := range want {
			switch seen[id] {
			case 0:
				lost++
			case 1:
			default:
				dup++
			}
		}
		if lost != 0 || dup != 0 {
			t.Errorf("walk over %d pages: %d sessions lost, %d duplicated", pages, lost, dup)
		}
		if pages < n/1000 {
			t.Errorf("only %d pages for %d sessions", pages, n)
		}

		// The instance and status filters apply on a page: 1000 Active sessions of i1 and more
		// to come.
		page, err := c.ListSessions(ctx, &tetherv1.ListSessionsRequest{Service: "web", Instance: "i1", PageSize: 1000,
			Status: tetherv1.SessionStatus_SESSION_STATUS_ACTIVE})
		if err != nil {
			t.Fatal(err)
		}
		if len(page.GetSessions()) != 1000 || page.GetNextPageToken() == "" {
			t.Errorf("filtered page: %d sessions, next %q; want 1000 and a next page", len(page.GetSessions()), page.GetNextPageToken())
		}
		for _, s := range page.GetSessions() {
			if s.GetInstance() != "i1" || s.GetStatus() != tetherv1.SessionStatus_SESSION_STATUS_ACTIVE {
				t.Fatalf("filtered list returned %v", s)
			}
		}
		// The id filter finds one.
		var anyID string
		for id := range want {
			anyID = id
			break
		}
		one, err := c.ListSessions(ctx, &tetherv1.ListSessionsRequest{Service: "web", SessionId: anyID})
		if err != nil || len(one.GetSessions()) != 1 || one.GetSessions()[0].GetId() != anyID {
			t.Errorf("id filter: %v, %v; want the one session %s", one, err, anyID)
		}
	})
}
