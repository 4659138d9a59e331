package memstore_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/tether-dev/tether/pkg/session"
	"github.com/tether-dev/tether/pkg/session/sessiontest"
)

// TestAttributesAreBounded is the regression test for the attributes finding of issue 14 (one
// session's attributes took 560 KB): Create and Update refuse more than MaxAttributes
// attributes, more than MaxAttributeBytes of keys and values, and empty keys, with
// ErrInvalid, and change nothing; the limits themselves are accepted.
func TestAttributesAreBounded(t *testing.T) {
	ctx := context.Background()
	many := func(n int) map[string]string {
		m := map[string]string{}
		for i := range n {
			m[fmt.Sprint("k", i)] = "v"
		}
		return m
	}
	atBytes := func(n int) map[string]string { return map[string]string{"k": strings.Repeat("v", n-1)} }
	for _, tc := range []struct {
		name  string
		attrs map[string]string
		ok    bool
	}{
		{"at the count limit", many(session.MaxAttributes), true},
		{"one attribute too many", many(session.MaxAttributes + 1), false},
		{"at the byte limit", atBytes(session.MaxAttributeBytes), true},
		{"one byte too many", atBytes(session.MaxAttributeBytes + 1), false},
		{"560 KB", atBytes(560 << 10), false},
		{"empty key", map[string]string{"": "v"}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			st, _ := sessiontest.NewMemStore(t)
			s := sessiontest.Session("web", "s1", "a")
			s.Attributes = tc.attrs
			err := st.Create(ctx, s)
			if tc.ok != (err == nil) || !tc.ok && !errors.Is(err, session.ErrInvalid) {
				t.Fatalf("Create = %v; want ok %v (else ErrInvalid)", err, tc.ok)
			}
			if !tc.ok {
				if _, err := st.Get(ctx, "web", "s1"); !errors.Is(err, session.ErrNotFound) {
					t.Fatalf("a refused Create stored the session: %v", err)
				}
			}
			plain := sessiontest.Session("web", "s2", "a")
			sessiontest.MustCreate(t, st, plain)
			_, err = st.Update(ctx, "web", "s2", func(s *session.Session) error { s.Attributes = tc.attrs; return nil })
			if tc.ok != (err == nil) || !tc.ok && !errors.Is(err, session.ErrInvalid) {
				t.Fatalf("Update = %v; want ok %v (else ErrInvalid)", err, tc.ok)
			}
			if got := sessiontest.MustGet(t, st, "web", "s2"); !tc.ok && len(got.Attributes) != 0 {
				t.Errorf("a refused Update changed the attributes to %d entries", len(got.Attributes))
			}
		})
	}
}
