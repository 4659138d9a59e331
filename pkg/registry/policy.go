package registry

import (
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"
)

// ErrRefusedAddress reports an instance address (or address and port) the AddressPolicy
// refuses. It wraps ErrInvalid: the admin API answers 400.
var ErrRefusedAddress = fmt.Errorf("instance address refused: %w", ErrInvalid)

// ReservedPort is a port no instance may use where it would reach a listener of tether's own or
// the admin interface of the Envoy tether bootstraps: on a loopback address, on Host itself,
// and — when Host is not valid (the listener binds every interface, or names a host) — on
// every address.
type ReservedPort struct {
	// What names the listener in errors, e.g. "listeners.api" or "envoy.adminAddress".
	What string
	Host netip.Addr
	Port int
}

// AddressPolicy decides which addresses instances may have, whatever layer declares them
// (config file, admin API, discovery sources, the shared admin layer in Redis). An
// AddressPolicy is immutable and safe for concurrent use; the zero value (or nil) allows
// every address and port.
//
// Always refused, whatever Allowed lists:
//   - cloud metadata and host-agent addresses (metadataAddrs: 169.254.169.254, 169.254.170.2,
//     100.100.100.200, 168.63.129.16, fd00:ec2::254), also written IPv4-mapped
//     (::ffff:169.254.169.254), IPv4-compatible (::169.254.169.254), NAT64 (64:ff9b::/96,
//     64:ff9b:1::/48) or 6to4 (2002::/16);
//   - multicast (224.0.0.0/4, ff00::/8), the limited broadcast and reserved 240.0.0.0/4,
//     the unspecified addresses and 0.0.0.0/8;
//   - IPv6 zones;
//   - the Reserved ports (see ReservedPort).
//
// Loopback (127.0.0.0/8, ::1) and link-local (169.254.0.0/16, fe80::/10) addresses are allowed
// only when Allowed lists a prefix inside those ranges (127.0.0.1/32, 127.0.0.0/8, ::1/128,
// 169.254.10.0/24 …): 0.0.0.0/0 or ::/0 does not let them in. The embedded IPv4 address of a
// NAT64 or 6to4 address may not be loopback or link-local at all.
//
// Every other address is allowed when Allowed is empty, and only inside one of its prefixes
// otherwise.
type AddressPolicy struct {
	allowed  []netip.Prefix
	reserved []ReservedPort
	active   bool
}

// NewAddressPolicy returns the policy allowing the given prefixes (empty: every address the
// policy does not always refuse, loopback and link-local excepted) and refusing the reserved
// ports. IPv4-mapped prefixes are read as IPv4 ones.
func NewAddressPolicy(allowed []netip.Prefix, reserved []ReservedPort) *AddressPolicy {
	p := &AddressPolicy{active: true, reserved: slices.Clone(reserved)}
	for _, a := range allowed {
		if a.Addr().Is4In6() && a.Bits() >= 96 {
			a = netip.PrefixFrom(a.Addr().Unmap(), a.Bits()-96)
		}
		p.allowed = append(p.allowed, a.Masked())
	}
	for i := range p.reserved {
		p.reserved[i].Host = p.reserved[i].Host.Unmap()
	}
	return p
}

// metadataAddrs are the cloud instance-metadata and host-agent endpoints: AWS, GCP, Azure,
// OpenStack and Oracle (169.254.169.254), AWS ECS task credentials (169.254.170.2), Alibaba
// (100.100.100.200), Azure WireServer (168.63.129.16) and AWS's IPv6 IMDS (fd00:ec2::254).
var metadataAddrs = []netip.Addr{
	netip.MustParseAddr("169.254.169.254"),
	netip.MustParseAddr("169.254.170.2"),
	netip.MustParseAddr("100.100.100.200"),
	netip.MustParseAddr("168.63.129.16"),
	netip.MustParseAddr("fd00:ec2::254"),
}

var (
	thisNetwork  = netip.MustParsePrefix("0.0.0.0/8")
	reserved4    = netip.MustParsePrefix("240.0.0.0/4") // holds 255.255.255.255
	loopback4    = netip.MustParsePrefix("127.0.0.0/8")
	loopback6    = netip.MustParsePrefix("::1/128")
	linkLocal4   = netip.MustParsePrefix("169.254.0.0/16")
	linkLocal6   = netip.MustParsePrefix("fe80::/10")
	nat64        = netip.MustParsePrefix("64:ff9b::/96")
	nat64Local   = netip.MustParsePrefix("64:ff9b:1::/48")
	sixToFour    = netip.MustParsePrefix("2002::/16")
	v4Compatible = netip.MustParsePrefix("::/96")
)

// CheckInstance returns nil if in's address and ports are allowed, else an error wrapping
// ErrRefusedAddress that says why.
func (p *AddressPolicy) CheckInstance(in Instance) error {
	a, err := netip.ParseAddr(strings.Trim(in.Address, "[]"))
	if err != nil {
		if p == nil || !p.active {
			return nil
		}
		return fmt.Errorf("%q is not an IP address: %w", in.Address, ErrRefusedAddress)
	}
	if err := p.CheckAddr(a); err != nil {
		return err
	}
	for _, port := range []int{in.HTTPPort, in.SIPPort} {
		if err := p.checkPort(a, port); err != nil {
			return err
		}
	}
	return nil
}

// CheckAddrPort is CheckAddr and the reserved ports: what a health check may dial.
func (p *AddressPolicy) CheckAddrPort(ap netip.AddrPort) error {
	if err := p.CheckAddr(ap.Addr()); err != nil {
		return err
	}
	return p.checkPort(ap.Addr(), int(ap.Port()))
}

func (p *AddressPolicy) checkPort(a netip.Addr, port int) error {
	if p == nil || port <= 0 {
		return nil
	}
	a = a.Unmap()
	for _, r := range p.reserved {
		if r.Port != port {
			continue
		}
		if !r.Host.IsValid() || r.Host.IsUnspecified() || a == r.Host || a.IsLoopback() {
			return fmt.Errorf("%s: port %d is %s's: %w", a, port, r.What, ErrRefusedAddress)
		}
	}
	return nil
}

// CheckAddr returns nil if instances may have address a (any port), else an error wrapping
// ErrRefusedAddress that says why.
func (p *AddressPolicy) CheckAddr(a netip.Addr) error {
	if p == nil || !p.active {
		return nil
	}
	if why := p.refusal(a); why != "" {
		return fmt.Errorf("%s is %s: %w", a, why, ErrRefusedAddress)
	}
	return nil
}

// refusal says why instances may not have address a, or "".
func (p *AddressPolicy) refusal(a netip.Addr) string {
	if a.Zone() != "" {
		return "zoned (IPv6 zones are not supported)"
	}
	form := ""
	ip := a
	switch {
	case a.Is4In6():
		ip, form = a.Unmap(), " (IPv4-mapped)"
	case a.Is6() && v4Compatible.Contains(a) && !a.IsUnspecified() && !a.IsLoopback():
		return "an IPv4-compatible address (deprecated, embeds " + embedded(a, 12).String() + ")"
	}
	if why := alwaysRefused(ip); why != "" {
		return why + form + ", refused whatever registry.allowedNetworks lists"
	}
	if why := embeddedRefusal(ip); why != "" {
		return why
	}
	if why, scoped := p.scopeRefusal(ip, form); scoped {
		return why
	}
	if len(p.allowed) == 0 || slices.ContainsFunc(p.allowed, func(al netip.Prefix) bool { return al.Contains(ip) }) {
		return ""
	}
	return "outside registry.allowedNetworks " + p.allowedString()
}

// embeddings are the IPv6 prefixes that embed an IPv4 address, and the byte offset of it.
var embeddings = [...]struct {
	pfx netip.Prefix
	off int
	why string
}{{nat64, 12, "NAT64"}, {nat64Local, 12, "NAT64"}, {sixToFour, 2, "6to4"}}

// allowedOnlyWhenListed are the scopes an instance may be in only when registry.allowedNetworks
// lists a prefix at least as narrow that holds its address.
var allowedOnlyWhenListed = [...]struct {
	pfx netip.Prefix
	why string
}{{loopback4, "loopback"}, {loopback6, "loopback"}, {linkLocal4, "link-local"}, {linkLocal6, "link-local"}}

// scopeRefusal reports whether ip is in one of allowedOnlyWhenListed and if so, why it is
// refused ("": it is listed). form says how the address was written.
func (p *AddressPolicy) scopeRefusal(ip netip.Addr, form string) (why string, scoped bool) {
	for _, scope := range allowedOnlyWhenListed {
		if !scope.pfx.Contains(ip) {
			continue
		}
		for _, al := range p.allowed {
			if al.Contains(ip) && al.Bits() >= scope.pfx.Bits() {
				return "", true
			}
		}
		return fmt.Sprintf("%s%s: allowed only when registry.allowedNetworks lists it (e.g. %s)", scope.why, form, netip.PrefixFrom(ip, ip.BitLen())), true
	}
	return "", false
}

// embeddedRefusal says why the IPv4 address ip embeds (NAT64, 6to4) refuses it, or "".
func embeddedRefusal(ip netip.Addr) string {
	for _, t := range embeddings {
		if !t.pfx.Contains(ip) {
			continue
		}
		v4 := embedded(ip, t.off)
		if why := alwaysRefused(v4); why != "" {
			return fmt.Sprintf("%s of %s, %s, refused whatever registry.allowedNetworks lists", t.why, v4, why)
		}
		if v4.IsLoopback() || v4.IsLinkLocalUnicast() {
			return fmt.Sprintf("%s of %s, a loopback or link-local address", t.why, v4)
		}
	}
	return ""
}

func (p *AddressPolicy) allowedString() string {
	s := make([]string, len(p.allowed))
	for i, a := range p.allowed {
		s[i] = a.String()
	}
	return "[" + strings.Join(s, ", ") + "]"
}

// alwaysRefused says why no instance may have the (unmapped) address ip, or "".
func alwaysRefused(ip netip.Addr) string {
	switch {
	case slices.Contains(metadataAddrs, ip):
		return "a cloud metadata address"
	case ip.IsUnspecified():
		return "the unspecified address"
	case thisNetwork.Contains(ip):
		return "in 0.0.0.0/8 (this network)"
	case ip == netip.AddrFrom4([4]byte{255, 255, 255, 255}):
		return "the broadcast address"
	case ip.IsMulticast():
		return "multicast"
	case reserved4.Contains(ip):
		return "reserved (240.0.0.0/4)"
	}
	return ""
}

// embedded returns the IPv4 address in bytes off..off+3 of the IPv6 address a.
func embedded(a netip.Addr, off int) netip.Addr {
	b := a.As16()
	return netip.AddrFrom4([4]byte(b[off : off+4]))
}

// ReservedPorts returns the reserved ports of listener addresses (host:port, as in the
// config); empty addresses, port 0 and unparsable ones are skipped. A host that is empty, a
// name, or unspecified reserves the port on every address.
func ReservedPorts(listeners map[string]string) []ReservedPort {
	var out []ReservedPort
	for what, hp := range listeners {
		i := strings.LastIndexByte(hp, ':')
		if hp == "" || i < 0 {
			continue
		}
		port, err := strconv.Atoi(hp[i+1:])
		if err != nil || port <= 0 || port > 65535 {
			continue
		}
		host, _ := netip.ParseAddr(strings.Trim(hp[:i], "[]"))
		out = append(out, ReservedPort{What: what, Host: host, Port: port})
	}
	slices.SortFunc(out, func(a, b ReservedPort) int { return strings.Compare(a.What, b.What) })
	return out
}
