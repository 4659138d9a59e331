package memstore_test

import (
	"cmp"
	"context"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/tether-dev/tether/pkg/session"
	"github.com/tether-dev/tether/pkg/session/memstore"
	"github.com/tether-dev/tether/pkg/session/sessiontest"
)

// mixedIDs returns generated-looking ids (32 lower-case hex characters, which the store keeps
// as 16 bytes) interleaved with every kind of id that sorts right next to them but is kept
// verbatim: shorter or longer hex, upper case, hex followed by a non-hex byte below '0',
// between '9' and 'a' and above 'f', and bytes far from hex at all.
func mixedIDs(t *testing.T) []string {
	t.Helper()
	z := strings.Repeat("0", 32)
	f := strings.Repeat("f", 32)
	ids := []string{
		z, f, "0", "f", "g", "-", "~", "\x01", "\xff", "A",
		z[:31], z + "0", z[:31] + "1", z[:31] + "-", z + "-",
		f[:31], f + "0", f + "g", f[:31] + "g", f[:16] + "g",
		"0123456789abcdef0123456789abcdef", "0123456789abcdef0123456789abcdeg",
		"0123456789abcdef0123456789abcdeF", "0123456789abcdef0123456789abcdf",
		"0123456789abcdef0123456789abcdee", "0123456789abcdef0123456789abcd9f",
		"0123456789abcdef0123456789abcd", "0123456789ABCDEF0123456789ABCDEF",
		"9fffffffffffffffffffffffffffffff", "9fffffffffffffffffffffffffffffff-", "9g", "9:", "9`", "9a",
		"a0000000000000000000000000000000", "a", "a-", "a:", "0a", "0a-", "0ag",
		"mcp-3f2a", "550e8400-e29b-41d4-a716-446655440000",
	}
	for range 40 {
		id := sessiontest.RandomHex(t, 16)
		ids = append(ids, id, id[:20], id+"x", id[:20]+"Z", id[:31]+"~")
	}
	slices.Sort(ids)
	return slices.Compact(ids)
}

// TestMixedIDsKeepIDOrder: however an id is kept in the index, List (every page size, with
// and without a service), ActiveByInstance, snapshots, Get, Touch and End see ids in plain
// byte order and each id exactly once.
func TestMixedIDsKeepIDOrder(t *testing.T) {
	ctx := t.Context()
	st, clock := sessiontest.NewMemStore(t)
	ids := mixedIDs(t)
	services := []string{"web", "a", "web2", "w"}
	type key struct{ Service, ID string }
	var want []key
	for i, id := range ids {
		for j, svc := range services {
			if (i+j)%4 == 3 {
				continue // services hold different subsets
			}
			s := sessiontest.Session(svc, id, []string{"i1", "i2"}[(i+j)%2])
			if err := st.Create(ctx, s); err != nil {
				t.Fatalf("Create(%q, %q): %v", svc, id, err)
			}
			want = append(want, key{svc, id})
		}
	}
	slices.SortFunc(want, func(a, b key) int { return cmp.Or(cmp.Compare(a.Service, b.Service), cmp.Compare(a.ID, b.ID)) })

	walk := func(st *memstore.Store, f session.Filter, limit int) []key {
		t.Helper()
		var got []key
		tok := ""
		for range len(want) + 1 {
			page, next, err := st.List(ctx, f, tok, limit)
			if err != nil {
				t.Fatalf("List(%+v, limit %d): %v", f, limit, err)
			}
			for _, s := range page {
				got = append(got, key{s.Service, s.ID})
			}
			if next == "" {
				return got
			}
			tok = next
		}
		t.Fatalf("List(%+v, limit %d) does not end", f, limit)
		return nil
	}
	for _, limit := range []int{1, 2, 3, 7, 1000} {
		Diff(t, "every session, page size "+strings.Repeat("*", limit%8), want, walk(st, session.Filter{}, limit))
		for _, svc := range services {
			var wantSvc []key
			for _, k := range want {
				if k.Service == svc {
					wantSvc = append(wantSvc, k)
				}
			}
			Diff(t, "sessions of "+svc, wantSvc, walk(st, session.Filter{Service: svc}, limit))
		}
	}

	var wantI1 []string
	for _, k := range want {
		if k.Service == "web" {
			if s, err := st.Get(ctx, "web", k.ID); err != nil || s.ID != k.ID || s.Service != "web" {
				t.Fatalf("Get(web, %q) = %q, %v", k.ID, s.ID, err)
			} else if s.Instance == "i1" {
				wantI1 = append(wantI1, k.ID)
			}
		}
	}
	byInst, err := st.ActiveByInstance(ctx, "web", "i1")
	if err != nil {
		t.Fatal(err)
	}
	var gotI1 []string
	for _, s := range byInst {
		gotI1 = append(gotI1, s.ID)
	}
	Diff(t, "ActiveByInstance(web, i1)", wantI1, gotI1)

	// A touch reaches the session under each form of id; an end ends exactly that one.
	clock.Advance(time.Minute)
	for _, id := range ids[:10] {
		st.Touch(ctx, "web", id, clock.Now())
	}
	for _, id := range ids[:10] {
		if s, err := st.Get(ctx, "web", id); err == nil && !s.LastSeen.Equal(clock.Now()) {
			t.Errorf("Get(web, %q).LastSeen = %v after a touch at %v", id, s.LastSeen, clock.Now())
		}
	}

	path := filepath.Join(t.TempDir(), "s.snap")
	if err := st.SaveSnapshot(path); err != nil {
		t.Fatal(err)
	}
	restored, _ := sessiontest.NewMemStore(t)
	if n, err := restored.RestoreSnapshot(path); err != nil || n != len(want) {
		t.Fatalf("RestoreSnapshot = %d, %v; want %d", n, err, len(want))
	}
	Diff(t, "every session after a snapshot round trip", want, walk(restored, session.Filter{}, 5))

	for _, k := range want[:len(want)/2] {
		if _, err := st.End(ctx, k.Service, k.ID, session.StatusTerminated, clock.Now()); err != nil {
			t.Fatalf("End(%q, %q): %v", k.Service, k.ID, err)
		}
	}
	ended, err := walkStatus(st, session.StatusTerminated)
	if err != nil {
		t.Fatal(err)
	}
	Diff(t, "ended sessions", len(want)/2, ended)
}

func walkStatus(st *memstore.Store, status session.Status) (int, error) {
	n, tok := 0, ""
	for {
		page, next, err := st.List(context.Background(), session.Filter{Status: status}, tok, 13)
		if err != nil {
			return 0, err
		}
		n += len(page)
		if next == "" {
			return n, nil
		}
		tok = next
	}
}
