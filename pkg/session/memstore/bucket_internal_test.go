package memstore

import (
	"crypto/rand"
	"encoding/hex"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/tether-dev/tether/internal/testutil"
	"github.com/tether-dev/tether/pkg/session"
)

// checkBuckets fails unless every memdb object is a bucket of two or more records sorted by
// key under its bucket key, or a record of its own, together holding st.Len() records.
func checkBuckets(t *testing.T, st *Store, when string) {
	t.Helper()
	it, err := st.db.Txn(false).Get(tableSessions, indexID)
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for raw := it.Next(); raw != nil; raw = it.Next() {
		switch o := raw.(type) {
		case *record:
			n++
		case *bucket:
			if len(o.recs) < 2 {
				t.Errorf("%s: bucket %q of %d records", when, o.key, len(o.recs))
			}
			for i, r := range o.recs {
				if !r.bucketed() || r.bucketKey() != o.key {
					t.Errorf("%s: record %q in bucket %q", when, r.id(), o.key)
				}
				if i > 0 && o.recs[i-1].pk >= r.pk {
					t.Errorf("%s: bucket %q out of order at %q", when, o.key, r.id())
				}
			}
			n += len(o.recs)
		default:
			t.Fatalf("%s: memdb object of type %T", when, raw)
		}
	}
	if n != st.Len() {
		t.Errorf("%s: memdb holds %d records, Len %d", when, n, st.Len())
	}
}

func randomBytes(t *testing.T) []byte {
	b := make([]byte, 16)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return b
}

// TestBucketsKeepEveryRecordInOrder: generated ids crowded into a few buckets (and raw ids
// sorting between them) stay sorted, complete and listed in id order on every page size
// through creates, updates, ends, a restore (one transaction filling each bucket in place),
// reaping and purging.
func TestBucketsKeepEveryRecordInOrder(t *testing.T) {
	ctx := t.Context()
	clock := testutil.NewClock(time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC))
	st := New(WithClock(clock.Now), WithRetention(time.Hour))
	var ids []string
	for _, p := range []string{"0000", "0001", "00010", "ffff", "8"} {
		for i := range 60 {
			id := (p + hex.EncodeToString(randomBytes(t)))[:session.IDLen]
			if i%10 == 9 {
				id = id[:20] + "-raw" // verbatim, next to the bucket's ids
			}
			ids = append(ids, id)
		}
	}
	slices.Sort(ids)
	ids = slices.Compact(ids)
	for i, id := range ids {
		s := session.Session{ID: id, Service: []string{"web", "w"}[i%2], Instance: "a", Kind: session.KindCookie, TTL: time.Hour}
		if i%3 == 0 {
			s.IdleTimeout = time.Minute
		}
		if err := st.Create(ctx, s); err != nil {
			t.Fatal(err)
		}
	}
	listed := func(st *Store, limit int) []string {
		t.Helper()
		var out []string
		tok := ""
		for {
			page, next, err := st.List(ctx, session.Filter{}, tok, limit)
			if err != nil {
				t.Fatal(err)
			}
			for _, s := range page {
				out = append(out, s.Service+"/"+s.ID)
			}
			if next == "" {
				return out
			}
			tok = next
		}
	}
	check := func(st *Store, when string) {
		t.Helper()
		checkBuckets(t, st, when)
		want := listed(st, session.MaxListLimit)
		if !slices.IsSortedFunc(want, strings.Compare) || len(want) != st.Len() {
			t.Errorf("%s: one page lists %d records (Len %d), sorted %v", when, len(want), st.Len(), slices.IsSorted(want))
		}
		for _, limit := range []int{1, 7, 59} {
			if got := listed(st, limit); !slices.Equal(got, want) {
				t.Errorf("%s: pages of %d list %d records, one page %d", when, limit, len(got), len(want))
			}
		}
		for _, k := range want {
			svc, id, _ := strings.Cut(k, "/")
			if _, err := st.Get(ctx, svc, id); err != nil {
				t.Errorf("%s: Get(%q, %q): %v", when, svc, id, err)
			}
			if r, err := first(st.db.Txn(false), svc, id); err != nil || r == nil || r.id() != id {
				t.Errorf("%s: first(%q, %q) = %v, %v", when, svc, id, r, err)
			}
		}
	}
	check(st, "created")
	for i, id := range ids {
		svc := []string{"web", "w"}[i%2]
		switch i % 4 {
		case 0:
			if _, err := st.End(ctx, svc, id, session.StatusTerminated, clock.Now()); err != nil {
				t.Fatal(err)
			}
		case 1:
			if _, err := st.Update(ctx, svc, id, func(s *session.Session) error { s.Instance = "b"; return nil }); err != nil {
				t.Fatal(err)
			}
		}
	}
	check(st, "ended and updated")
	path := filepath.Join(t.TempDir(), "s.snap")
	if err := st.SaveSnapshot(path); err != nil {
		t.Fatal(err)
	}
	restored := New(WithClock(clock.Now), WithRetention(time.Hour))
	if _, err := restored.RestoreSnapshot(path); err != nil {
		t.Fatal(err)
	}
	check(restored, "restored")
	if !slices.Equal(listed(st, 50), listed(restored, 50)) {
		t.Errorf("restored store lists other records")
	}
	clock.Advance(2 * time.Minute)
	if ended, _, err := restored.Reap(ctx); err != nil || ended == 0 {
		t.Fatalf("Reap ended %d, %v", ended, err)
	}
	check(restored, "reaped")
	clock.Advance(2 * time.Hour)
	if _, purged, err := restored.Reap(ctx); err != nil || purged == 0 {
		t.Fatalf("Reap purged %d, %v", purged, err)
	}
	check(restored, "purged")
	if restored.Len() != 0 {
		t.Errorf("after every session lapsed and was purged, Len = %d", restored.Len())
	}
}
