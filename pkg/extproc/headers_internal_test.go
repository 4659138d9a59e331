package extproc

import (
	"testing"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	"github.com/google/go-cmp/cmp"
)

func TestHeaderMapOf(t *testing.T) {
	hdrs := []*corev3.HeaderValue{
		{Key: ":method", RawValue: []byte("GET")},
		{Key: ":path", RawValue: []byte("/a?b")},
		{Key: "cookie", RawValue: []byte("a=1")},
		{Key: "X-Mixed", Value: "legacy value"},
		{Key: "cookie", RawValue: []byte("b=2")},
		{Key: "empty", RawValue: nil},
		{Key: "cookie", RawValue: []byte("c=3")},
	}
	pseudo := map[string]string{}
	got := headerMapOf(hdrs, func(k, v string) { pseudo[k] = v })
	want := map[string][]string{
		"cookie":  {"a=1", "b=2", "c=3"},
		"x-mixed": {"legacy value"},
		"empty":   {""},
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("headers (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff(map[string]string{":method": "GET", ":path": "/a?b"}, pseudo); diff != "" {
		t.Errorf("pseudo headers (-want +got):\n%s", diff)
	}
	// Appending to one value list must not clobber another's backing array.
	got["empty"] = append(got["empty"], "x")
	if got["cookie"][0] != "a=1" || got["x-mixed"][0] != "legacy value" {
		t.Errorf("shared backing array clobbered: %v", got)
	}
}

func TestEnvoyHeaders(t *testing.T) {
	h := &corev3.HeaderMap{Headers: []*corev3.HeaderValue{
		{Key: ":path", RawValue: []byte("/a?b")},
		{Key: "cookie", RawValue: []byte("a=1")},
		{Key: "X-Mixed", Value: "legacy value"},
		{Key: "cookie", RawValue: []byte("b=2")},
		{Key: "empty", RawValue: nil},
	}}
	src := (*envoyHeaders)(h)
	type lookup struct {
		name string
		i    int
	}
	for _, tc := range []struct {
		lookup
		want string
		ok   bool
	}{
		{lookup{"cookie", 0}, "a=1", true},
		{lookup{"cookie", 1}, "b=2", true},
		{lookup{"cookie", 2}, "", false},
		{lookup{"x-mixed", 0}, "legacy value", true},
		{lookup{"empty", 0}, "", true},
		{lookup{"absent", 0}, "", false},
		{lookup{":path", 0}, "", false}, // pseudo headers are not headers
	} {
		if got, ok := src.HeaderValue(tc.name, tc.i); got != tc.want || ok != tc.ok {
			t.Errorf("HeaderValue(%q, %d) = %q, %v; want %q, %v", tc.name, tc.i, got, ok, tc.want, tc.ok)
		}
	}
	want := map[string][]string{"cookie": {"a=1", "b=2"}, "x-mixed": {"legacy value"}, "empty": {""}}
	if diff := cmp.Diff(want, src.HeaderMap()); diff != "" {
		t.Errorf("HeaderMap (-want +got):\n%s", diff)
	}
	if v, ok := (*envoyHeaders)(nil).HeaderValue("cookie", 0); ok || v != "" {
		t.Errorf("nil list: %q, %v", v, ok)
	}
}
