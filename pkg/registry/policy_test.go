package registry_test

import (
	"errors"
	"net/netip"
	"strings"
	"testing"

	"github.com/tether-dev/tether/pkg/registry"
)

// testPolicy is the policy of a config listing 127.0.0.1/32 and 10.0.0.0/8 with the default
// listeners and the generated bootstrap's default Envoy admin address.
func testPolicy(allowed ...string) *registry.AddressPolicy {
	var pfx []netip.Prefix
	for _, a := range allowed {
		pfx = append(pfx, netip.MustParsePrefix(a))
	}
	return registry.NewAddressPolicy(pfx, registry.ReservedPorts(map[string]string{
		"envoy.adminAddress": "127.0.0.1:9901",
		"listeners.api":      "127.0.0.1:9000",
		"listeners.extProc":  "0.0.0.0:9002",
	}))
}

func TestAddressPolicy(t *testing.T) {
	listed := testPolicy("127.0.0.1/32", "10.0.0.0/8", "fd00::/8")
	open := testPolicy()
	everything := testPolicy("0.0.0.0/0", "::/0")
	for _, tc := range []struct {
		addr string
		port int
		// want* say which policy allows it: listed, open (nothing listed), everything (/0).
		listed, open, everything bool
		why                      string
	}{
		// The addresses of #25 finding 4.
		{"127.0.0.1", 9901, false, false, false, "envoy.adminAddress"},
		{"169.254.169.254", 80, false, false, false, "cloud metadata"},
		{"224.0.0.1", 80, false, false, false, "multicast"},
		{"255.255.255.255", 80, false, false, false, "broadcast"},
		{"fe80::1", 80, false, false, false, "link-local"},
		{"::ffff:169.254.169.254", 80, false, false, false, "cloud metadata address (IPv4-mapped)"},
		{"::ffff:0.0.0.0", 80, false, false, false, "unspecified"},
		// Other forms of the metadata addresses.
		{"100.100.100.200", 80, false, false, false, "cloud metadata"},
		{"fd00:ec2::254", 80, false, false, false, "cloud metadata"},
		{"::ffff:100.100.100.200", 80, false, false, false, "cloud metadata"},
		{"64:ff9b::a9fe:a9fe", 80, false, false, false, "NAT64 of 169.254.169.254"},
		{"64:ff9b::6464:64c8", 80, false, false, false, "NAT64 of 100.100.100.200"},
		{"64:ff9b::7f00:1", 80, false, false, false, "NAT64 of 127.0.0.1"},
		{"2002:a9fe:a9fe::1", 80, false, false, false, "6to4 of 169.254.169.254"},
		{"::a9fe:a9fe", 80, false, false, false, "IPv4-compatible"},
		{"ff02::1", 80, false, false, false, "multicast"},
		{"0.0.0.0", 80, false, false, false, "unspecified"},
		{"::", 80, false, false, false, "unspecified"},
		{"0.1.2.3", 80, false, false, false, "this network"},
		{"240.0.0.1", 80, false, false, false, "reserved"},
		// Tether's own listeners: on loopback, on their own host, and everywhere for 0.0.0.0.
		{"127.0.0.1", 9000, false, false, false, "listeners.api"},
		{"10.1.2.3", 9000, true, true, true, ""},
		{"10.1.2.3", 9002, false, false, false, "listeners.extProc"},
		{"::ffff:127.0.0.1", 9901, false, false, false, "envoy.adminAddress"},
		// Loopback and link-local only when a prefix inside their range is listed.
		{"127.0.0.1", 8080, true, false, false, "loopback"},
		{"::ffff:127.0.0.1", 8080, true, false, false, ""},
		{"127.0.0.2", 8080, false, false, false, "loopback"},
		{"::1", 8080, false, false, false, "loopback"},
		{"169.254.1.1", 8080, false, false, false, "link-local"},
		// Ordinary addresses: inside the list, or anywhere when nothing is listed.
		{"10.0.0.5", 8080, true, true, true, ""},
		{"fd12::5", 8080, true, true, true, ""},
		{"192.168.1.5", 8080, false, true, true, "outside registry.allowedNetworks"},
		{"203.0.113.7", 8080, false, true, true, "outside registry.allowedNetworks"},
		{"64:ff9b::cb00:7107", 8080, false, true, true, "outside"},
	} {
		for _, p := range []struct {
			name   string
			policy *registry.AddressPolicy
			want   bool
		}{{"listed", listed, tc.listed}, {"open", open, tc.open}, {"everything", everything, tc.everything}} {
			in := registry.Instance{Service: "web", ID: "x", Address: tc.addr, HTTPPort: tc.port}
			err := p.policy.CheckInstance(in)
			if (err == nil) != p.want {
				t.Errorf("%s policy: %s port %d: err = %v, want allowed %v", p.name, tc.addr, tc.port, err, p.want)
				continue
			}
			if err != nil {
				if !errors.Is(err, registry.ErrRefusedAddress) || !errors.Is(err, registry.ErrInvalid) {
					t.Errorf("%s policy: %s: %v is not ErrRefusedAddress and ErrInvalid", p.name, tc.addr, err)
				}
				if p.name == "listed" && !strings.Contains(err.Error(), tc.why) {
					t.Errorf("%s policy: %s: error %q does not say %q", p.name, tc.addr, err, tc.why)
				}
			}
		}
	}
	var none *registry.AddressPolicy
	if err := none.CheckInstance(registry.Instance{Address: "169.254.169.254", HTTPPort: 80}); err != nil {
		t.Errorf("nil policy refuses: %v", err)
	}
}

// TestAddressPolicyEveryLayer is #25 finding 4 against the registry: the finding's addresses
// are refused through the admin API's Register and the config file's Apply with an error, and
// are not published when a discovery source or the shared (Redis) admin layer carries them,
// counted as Refused instead; a new policy on reload republishes what it now allows.
func TestAddressPolicyEveryLayer(t *testing.T) {
	finding := []struct {
		addr string
		port int
	}{
		{"127.0.0.1", 9901}, {"169.254.169.254", 80}, {"224.0.0.1", 80}, {"255.255.255.255", 80},
		{"fe80::1", 80}, {"::ffff:169.254.169.254", 80}, {"::ffff:0.0.0.0", 80},
	}
	bad := func(service string) []registry.Instance {
		var out []registry.Instance
		for i, f := range finding {
			out = append(out, registry.Instance{Service: service, ID: "bad" + string(rune('a'+i)), Address: f.addr, HTTPPort: f.port})
		}
		return out
	}
	good := registry.Instance{Service: "web", ID: "good", Address: "127.0.0.1", HTTPPort: 8080}

	r := registry.New(registry.WithAddressPolicy(testPolicy("127.0.0.1/32")))
	if err := r.Apply([]registry.Service{svc("web")}, []registry.Instance{good}); err != nil {
		t.Fatal(err)
	}
	for _, in := range bad("web") {
		if err := r.Register(in); !errors.Is(err, registry.ErrRefusedAddress) {
			t.Errorf("Register %s:%d = %v, want ErrRefusedAddress", in.Address, in.HTTPPort, err)
		}
		if err := r.Apply([]registry.Service{svc("web")}, []registry.Instance{good, in}); !errors.Is(err, registry.ErrRefusedAddress) {
			t.Errorf("Apply with %s:%d = %v, want ErrRefusedAddress", in.Address, in.HTTPPort, err)
		}
	}
	if err := r.UpdateSource("k8s", "kubernetes", nil, bad("web")); err != nil {
		t.Fatal(err)
	}
	if got := status(t, r, "k8s").Refused; got != len(finding) {
		t.Errorf("discovery source: Refused = %d, want %d", got, len(finding))
	}
	r.ApplyAdmin(registry.AdminLayer{Instances: bad("web")})
	if got := status(t, r, registry.LayerAPI).Refused; got != len(finding) {
		t.Errorf("shared admin layer: Refused = %d, want %d", got, len(finding))
	}
	published := func() []string {
		var ids []string
		for _, in := range r.Snapshot().Instances("web") {
			ids = append(ids, in.Address+"/"+in.ID)
		}
		return ids
	}
	if got := published(); len(got) != 1 || got[0] != "127.0.0.1/good" {
		t.Errorf("published %v, want only 127.0.0.1/good", got)
	}

	// A reload that lists link-local networks publishes fe80::1 (a link-local address, now
	// listed) and nothing else of the finding; one that no longer lists loopback unpublishes good.
	r.SetAddressPolicy(testPolicy("127.0.0.1/32", "fe80::/64"))
	if got := published(); len(got) != 2 { // good, and fe80::1 (the api layer's bade shadows k8s's)
		t.Errorf("after listing fe80::/64: published %v, want good and fe80::1", got)
	}
	r.SetAddressPolicy(testPolicy("10.0.0.0/8"))
	if got := published(); len(got) != 0 {
		t.Errorf("after unlisting loopback: published %v, want none", got)
	}
	if got := status(t, r, registry.LayerConfig).Refused; got != 1 {
		t.Errorf("config layer: Refused = %d, want 1", got)
	}
}
