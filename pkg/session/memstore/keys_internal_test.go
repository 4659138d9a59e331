package memstore

import (
	"strings"
	"testing"
)

// TestHexSeek: a generated-id range scan after a cursor starts at the first generated id
// greater than the cursor, or at the cursor's own 32-character prefix, which the scan skips
// (never past a generated id it must return).
func TestHexSeek(t *testing.T) {
	z, f := strings.Repeat("0", 32), strings.Repeat("f", 32)
	for _, c := range []struct{ after, first string }{
		{"", z},
		{"0", z},
		{"-", z},
		{z, z},       // the cursor itself: scan skips it (> after)
		{z + "-", z}, // a generated id followed by more: that id, which the scan skips

		{z[:31], z},
		{z[:31] + "-", z},
		{"0a", "0a" + z[:30]},
		{"0a-", "0a" + z[:30]},
		{"0a:", "0aa" + z[:29]},
		{"0aA", "0aa" + z[:29]},
		{"0ag", "0b" + z[:30]},
		{"09g", "0a" + z[:30]},
		{"0fg", "10" + z[:30]},
		{"g", ""},
		{f[:5] + "g", ""},
		{f, f},
		{f + "0", f},
		{"A", "a" + z[:31]},
	} {
		b, ok := hexSeek(c.after)
		got := ""
		if ok {
			got = idOfKey(string(append([]byte{tagHex}, b[:]...)))
		}
		if got != c.first {
			t.Errorf("hexSeek(%q) = %q, %v; want %q", c.after, got, ok, c.first)
		}
	}
}

// TestIDKeyOrder: the id parts of keys compare like the ids, across forms.
func TestIDKeyOrder(t *testing.T) {
	ids := []string{"", "-", "0", strings.Repeat("0", 32), strings.Repeat("0", 32) + "-",
		strings.Repeat("0", 31) + "1", "0123456789abcdef0123456789abcdef", "0123456789ABCDEF0123456789ABCDEF",
		"9", "a", strings.Repeat("f", 32), strings.Repeat("f", 33), "g", "\xff"}
	for _, a := range ids {
		ka := string(appendIDKey(nil, a))
		if got := idOfKey(ka); got != a {
			t.Errorf("idOfKey(appendIDKey(%q)) = %q", a, got)
		}
		for _, b := range ids {
			kb := string(appendIDKey(nil, b))
			if got, want := compareIDKeys(ka, kb), strings.Compare(a, b); got != want {
				t.Errorf("compareIDKeys(%q, %q) = %d, want %d", a, b, got, want)
			}
			if got, want := compareIDTo(ka, b), strings.Compare(a, b); got != want {
				t.Errorf("compareIDTo(%q, %q) = %d, want %d", a, b, got, want)
			}
		}
	}
}
