package envoyharness

import (
	"errors"
	"testing"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"github.com/google/go-cmp/cmp"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

func hvo(key, raw string, appendFlag *bool) *corev3.HeaderValueOption {
	o := &corev3.HeaderValueOption{Header: &corev3.HeaderValue{Key: key, RawValue: []byte(raw)}}
	if appendFlag != nil {
		o.Append = wrapperspb.Bool(*appendFlag) //nolint:staticcheck // the legacy field the harness must honour
	}
	return o
}

func ptr(b bool) *bool { return &b }

func entries(kv ...string) []headerEntry {
	var out []headerEntry
	for i := 0; i+1 < len(kv); i += 2 {
		out = append(out, headerEntry{kv[i], kv[i+1]})
	}
	return out
}

func TestApplyMutationFollowsEnvoyRules(t *testing.T) {
	base := func() *headerMap {
		return &headerMap{entries: entries(":authority", "a.example", ":path", "/", ":method", "GET", ":scheme", "http",
			"set-cookie", "up=1", "x-keep", "k")}
	}
	tests := []struct {
		name        string
		m           *extprocv3.HeaderMutation
		want        []headerEntry
		wantIgnored int
		wantErr     bool
		sem         Semantics
	}{
		{
			name: "append defaults to false: overwrite",
			m:    &extprocv3.HeaderMutation{SetHeaders: []*corev3.HeaderValueOption{hvo("set-cookie", "t=2", nil)}},
			want: entries(":authority", "a.example", ":path", "/", ":method", "GET", ":scheme", "http", "set-cookie", "t=2", "x-keep", "k"),
		},
		{
			name: "legacy append true adds beside existing",
			m:    &extprocv3.HeaderMutation{SetHeaders: []*corev3.HeaderValueOption{hvo("Set-Cookie", "t=2", ptr(true))}},
			want: entries(":authority", "a.example", ":path", "/", ":method", "GET", ":scheme", "http", "set-cookie", "up=1", "x-keep", "k", "set-cookie", "t=2"),
		},
		{
			name: "routing and x-envoy headers cannot be set; :path can",
			m: &extprocv3.HeaderMutation{SetHeaders: []*corev3.HeaderValueOption{
				hvo(":authority", "evil", nil), hvo("host", "evil", nil), hvo(":method", "POST", nil),
				hvo(":scheme", "https", nil), hvo("x-envoy-original-dst-host", "1.2.3.4:5", nil), hvo(":path", "/x", nil),
			}},
			want:        entries(":authority", "a.example", ":path", "/x", ":method", "GET", ":scheme", "http", "set-cookie", "up=1", "x-keep", "k"),
			wantIgnored: 5,
		},
		{
			name:        "pseudo headers and host cannot be removed",
			m:           &extprocv3.HeaderMutation{RemoveHeaders: []string{":path", "host", ":authority", "x-keep"}},
			want:        entries(":authority", "a.example", ":path", "/", ":method", "GET", ":scheme", "http", "set-cookie", "up=1"),
			wantIgnored: 3,
		},
		{
			name: "value without raw_value sets an empty header (send_header_raw_value)",
			m: &extprocv3.HeaderMutation{SetHeaders: []*corev3.HeaderValueOption{
				{Header: &corev3.HeaderValue{Key: "x-new", Value: "ignored"}}}},
			want: entries(":authority", "a.example", ":path", "/", ":method", "GET", ":scheme", "http", "set-cookie", "up=1", "x-keep", "k", "x-new", ""),
		},
		{
			name: "value and raw_value together are an error",
			m: &extprocv3.HeaderMutation{SetHeaders: []*corev3.HeaderValueOption{
				{Header: &corev3.HeaderValue{Key: "x-new", Value: "a", RawValue: []byte("b")}}}},
			wantErr: true,
		},
		{
			name:    "CR LF in a value is an error",
			m:       &extprocv3.HeaderMutation{SetHeaders: []*corev3.HeaderValueOption{hvo("x-new", "a\r\nx-evil: 1", nil)}},
			wantErr: true,
		},
		{
			name:    "invalid header name is an error",
			m:       &extprocv3.HeaderMutation{SetHeaders: []*corev3.HeaderValueOption{hvo("bad name", "v", nil)}},
			wantErr: true,
		},
		{
			name: "append actions",
			m: &extprocv3.HeaderMutation{SetHeaders: []*corev3.HeaderValueOption{
				{Header: &corev3.HeaderValue{Key: "x-keep", RawValue: []byte("no")}, AppendAction: corev3.HeaderValueOption_ADD_IF_ABSENT},
				{Header: &corev3.HeaderValue{Key: "x-absent", RawValue: []byte("no")}, AppendAction: corev3.HeaderValueOption_OVERWRITE_IF_EXISTS},
				{Header: &corev3.HeaderValue{Key: "x-add", RawValue: []byte("yes")}, AppendAction: corev3.HeaderValueOption_ADD_IF_ABSENT},
				{Header: &corev3.HeaderValue{Key: "set-cookie", RawValue: []byte("o=1")}, AppendAction: corev3.HeaderValueOption_OVERWRITE_IF_EXISTS_OR_ADD},
			}},
			want: entries(":authority", "a.example", ":path", "/", ":method", "GET", ":scheme", "http", "set-cookie", "o=1", "x-keep", "k", "x-add", "yes"),
		},
		{
			name: "A93: the default action appends and the legacy append false is ignored",
			sem:  GRPCSemantics,
			m: &extprocv3.HeaderMutation{SetHeaders: []*corev3.HeaderValueOption{
				hvo("x-keep", "forged-too", ptr(false)), hvo("set-cookie", "t=2", nil)}},
			want: entries(":authority", "a.example", ":path", "/", ":method", "GET", ":scheme", "http", "set-cookie", "up=1", "x-keep", "k",
				"x-keep", "forged-too", "set-cookie", "t=2"),
		},
		{
			name: "A93: OVERWRITE_IF_EXISTS_OR_ADD replaces",
			sem:  GRPCSemantics,
			m: &extprocv3.HeaderMutation{SetHeaders: []*corev3.HeaderValueOption{
				{Header: &corev3.HeaderValue{Key: "x-keep", RawValue: []byte("mine")}, AppendAction: corev3.HeaderValueOption_OVERWRITE_IF_EXISTS_OR_ADD}}},
			want: entries(":authority", "a.example", ":path", "/", ":method", "GET", ":scheme", "http", "set-cookie", "up=1", "x-keep", "mine"),
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			h := base()
			ignored, err := applyMutation(tc.m, h, tc.sem)
			if tc.wantErr {
				if !errors.Is(err, errMutation) {
					t.Fatalf("err = %v, want errMutation", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if ignored != tc.wantIgnored {
				t.Errorf("ignored = %d, want %d", ignored, tc.wantIgnored)
			}
			if diff := cmp.Diff(tc.want, h.entries, cmp.AllowUnexported(headerEntry{})); diff != "" {
				t.Errorf("headers (-want +got):\n%s", diff)
			}
		})
	}
}

func TestMatchRoute(t *testing.T) {
	vhosts := []VirtualHost{
		{Name: "any", Domains: []string{"*"}, Routes: []Route{{Name: "root", PathPrefix: "/", Cluster: "web"}}},
		{Name: "api", Domains: []string{"api.example"}, Routes: []Route{
			{Name: "mcp", PathPrefix: "/mcp", Cluster: "mcp"}, {Name: "api-root", PathPrefix: "/", Cluster: "web"}}},
		{Name: "wild", Domains: []string{"*.corp.example"}, Routes: []Route{{Name: "corp", PathPrefix: "/", Cluster: "corp"}}},
	}
	tests := []struct{ host, path, want string }{
		{"api.example", "/mcp/x", "mcp"},
		{"API.example:8080", "/mcp", "mcp"},
		{"api.example", "/other", "api-root"},
		{"x.corp.example", "/", "corp"},
		{"corp.example", "/", "root"},
		{"elsewhere", "/mcp", "root"},
	}
	for _, tc := range tests {
		r := matchRoute(vhosts, tc.host, tc.path)
		if r == nil || r.Name != tc.want {
			t.Errorf("matchRoute(%q, %q) = %v, want %s", tc.host, tc.path, r, tc.want)
		}
	}
	if r := matchRoute([]VirtualHost{{Domains: []string{"only.example"}, Routes: []Route{{PathPrefix: "/"}}}}, "other", "/"); r != nil {
		t.Errorf("no virtual host should match, got %v", r)
	}
}

func TestOverrideHostPick(t *testing.T) {
	eps := []Endpoint{{Address: "127.0.0.1:1", Healthy: true}, {Address: "127.0.0.1:2", Healthy: true},
		{Address: "127.0.0.1:3", Healthy: false}, {Address: "[2001:DB8:0::1]:80", Healthy: false}}
	md := func(v *structpb.Value) map[string]*structpb.Struct {
		return map[string]*structpb.Struct{"envoy.lb": {Fields: map[string]*structpb.Value{"x-dest": v}}}
	}
	hdr := func(v string) *headerMap {
		h := &headerMap{}
		if v != "" {
			h.add("x-dest", v)
		}
		return h
	}
	tests := []struct {
		name         string
		md           map[string]*structpb.Struct
		hdr          *headerMap
		want         string
		wantFallback bool
	}{
		{"metadata first", md(structpb.NewStringValue("127.0.0.1:2")), hdr("127.0.0.1:1"), "127.0.0.1:2", false},
		{"header when no metadata", nil, hdr("127.0.0.1:1"), "127.0.0.1:1", false},
		{"unhealthy host still used (health not checked)", nil, hdr("127.0.0.1:3"), "127.0.0.1:3", false},
		{"list: first entry in EDS", md(structpb.NewStringValue("10.0.0.9:1, 127.0.0.1:2")), hdr(""), "127.0.0.1:2", false},
		{"metadata not in EDS falls to header", md(structpb.NewStringValue("10.0.0.9:1")), hdr("127.0.0.1:1"), "127.0.0.1:1", false},
		{"non-string metadata ignored", md(structpb.NewNumberValue(1)), hdr(""), "", true},
		{"nothing in EDS: fallback", nil, hdr("10.0.0.9:1"), "", true},
		// Envoy keys its host map by the canonical address (inet_ntop) and looks the entry up
		// as written (load_balancer.cc, OverrideHostLoadBalancer::findHost).
		{"EDS IPv6 written long: found by its canonical form", nil, hdr("[2001:db8::1]:80"), "[2001:db8::1]:80", false},
		{"non-canonical entry never matches", nil, hdr("[2001:DB8:0::1]:80"), "", true},
		{"IPv4 with leading zero never matches", nil, hdr("127.0.0.01:1"), "", true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			o := &overrideHost{metadataNS: "envoy.lb", metadataKey: "x-dest", header: "x-dest"}
			got, fb := o.pick("c", eps, tc.md, tc.hdr)
			if fb != tc.wantFallback {
				t.Fatalf("fallback = %v, want %v", fb, tc.wantFallback)
			}
			if !fb && got != tc.want {
				t.Errorf("picked %q, want %q", got, tc.want)
			}
			if fb && got != "127.0.0.1:1" && got != "127.0.0.1:2" {
				t.Errorf("fallback picked %q, want a healthy host", got)
			}
		})
	}
	// The fallback is round robin over healthy hosts.
	o := &overrideHost{metadataNS: "envoy.lb", metadataKey: "x-dest", header: "x-dest"}
	seen := map[string]int{}
	for range 10 {
		a, _ := o.pick("c", eps, nil, &headerMap{})
		seen[a]++
	}
	if diff := cmp.Diff(map[string]int{"127.0.0.1:1": 5, "127.0.0.1:2": 5}, seen); diff != "" {
		t.Errorf("fallback spread (-want +got):\n%s", diff)
	}
	if a, fb := o.pick("empty", nil, nil, &headerMap{}); a != "" || !fb {
		t.Errorf("empty cluster: %q %v, want no host", a, fb)
	}
}
