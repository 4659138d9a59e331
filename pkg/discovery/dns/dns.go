// Package dns is a discovery source that resolves one DNS name (A, AAAA or SRV records) and
// publishes the answers as one tether service's instances, re-resolving when the answer's TTL
// runs out.
//
// Mapping:
//
//	A / AAAA   one instance per address, id = the address (":" → "-"), ports from the Target
//	SRV        one instance per record, id = target-port; the target's addresses come from the
//	           answer's additional section or an A (then AAAA) query; weight = the record's
//	           weight (0 → 1, capped at 1000); records of the lowest priority are active, the
//	           others standby (tether places on them only when the active ones are full)
//
// Timing: the next query goes out when the shortest TTL among the answer's records runs out,
// clamped to [MinRefresh, MaxRefresh]; an NXDOMAIN or empty answer is a valid (empty) set,
// refreshed after its negative TTL (the SOA's minimum) within the same bounds. A failed query
// (timeout, SERVFAIL, a malformed answer) keeps the last good set published, is reported
// through Sink.SourceFailed, and is retried after MinRefresh, doubling up to MaxRefresh.
package dns

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net"
	"net/netip"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"golang.org/x/net/dns/dnsmessage"

	"github.com/tether-dev/tether/pkg/registry"
)

// Kind is the source kind reported in the registry's status.
const Kind = "dns"

// Record types.
const (
	TypeA    = "A"
	TypeAAAA = "AAAA"
	TypeSRV  = "SRV"
)

// Sink receives the source's sets; *registry.Registry is one.
type Sink interface {
	UpdateSource(name, kind string, services []registry.Service, instances []registry.Instance) error
	SourceFailed(name, kind string, err error)
}

// Target is what to resolve and which tether service it feeds.
type Target struct {
	Service string
	// Name is the DNS name (a trailing dot is added when missing).
	Name string
	// Type is TypeA, TypeAAAA or TypeSRV.
	Type string
	// HTTPPort and SIPPort are the instances' ports for A and AAAA records (SRV carries them).
	HTTPPort, SIPPort int
	// Server is the DNS server's ip:port; "" means the first nameserver of /etc/resolv.conf.
	Server string
	// MinRefresh and MaxRefresh bound the time between queries (defaults 1s and 5m).
	MinRefresh, MaxRefresh time.Duration
}

// Source resolves one Target. Create it with New and call Run.
type Source struct {
	t    Target
	sink Sink
	name string
	log  *slog.Logger
	// timeout bounds one query (over UDP, then TCP when truncated).
	timeout time.Duration
}

// Option configures a Source.
type Option func(*Source)

// WithLogger sets the logger; the default discards.
func WithLogger(l *slog.Logger) Option { return func(s *Source) { s.log = l } }

// New returns a source for t that reports to sink under the name "dns/<t.Service>".
func New(t Target, sink Sink, opts ...Option) (*Source, error) {
	switch t.Type {
	case TypeA, TypeAAAA:
		if t.HTTPPort <= 0 && t.SIPPort <= 0 {
			return nil, errors.New("dns: A and AAAA sources need a port")
		}
	case TypeSRV:
	default:
		return nil, fmt.Errorf("dns: record type %q is not A, AAAA or SRV", t.Type)
	}
	if !strings.HasSuffix(t.Name, ".") {
		t.Name += "."
	}
	if _, err := dnsmessage.NewName(t.Name); err != nil {
		return nil, fmt.Errorf("dns: name %q: %w", t.Name, err)
	}
	if t.MinRefresh <= 0 {
		t.MinRefresh = time.Second
	}
	if t.MaxRefresh < t.MinRefresh {
		t.MaxRefresh = max(5*time.Minute, t.MinRefresh)
	}
	s := &Source{t: t, sink: sink, name: Kind + "/" + t.Service, log: slog.New(slog.DiscardHandler), timeout: 2 * time.Second}
	for _, o := range opts {
		o(s)
	}
	return s, nil
}

// Name is the source's name in the registry.
func (s *Source) Name() string { return s.name }

// Run resolves until ctx ends and returns ctx's error.
func (s *Source) Run(ctx context.Context) error {
	backoff := s.t.MinRefresh
	for {
		next, err := s.refresh(ctx)
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if err != nil {
			s.log.Warn("dns query failed; keeping the last good set", "name", s.t.Name, "err", err, "retry", backoff)
			s.sink.SourceFailed(s.name, Kind, err)
			next = backoff
			backoff = min(2*backoff, s.t.MaxRefresh)
		} else {
			backoff = s.t.MinRefresh
		}
		timer := time.NewTimer(next)
		select {
		case <-ctx.Done():
			timer.Stop()
			return ctx.Err()
		case <-timer.C:
		}
	}
}

// refresh resolves once, publishes the set and returns when to ask again.
func (s *Source) refresh(ctx context.Context) (time.Duration, error) {
	server := s.t.Server
	if server == "" {
		var err error
		if server, err = systemServer("/etc/resolv.conf"); err != nil {
			return 0, err
		}
	}
	ins, ttl, err := s.resolve(ctx, server)
	if err != nil {
		return 0, err
	}
	if err := s.sink.UpdateSource(s.name, Kind, nil, ins); err != nil {
		return 0, fmt.Errorf("dns: registry refused the set: %w", err)
	}
	return min(max(ttl, s.t.MinRefresh), s.t.MaxRefresh), nil
}

func (s *Source) resolve(ctx context.Context, server string) ([]registry.Instance, time.Duration, error) {
	switch s.t.Type {
	case TypeA:
		return s.resolveAddrs(ctx, server, dnsmessage.TypeA)
	case TypeAAAA:
		return s.resolveAddrs(ctx, server, dnsmessage.TypeAAAA)
	default:
		return s.resolveSRV(ctx, server)
	}
}

// resolveAddrs resolves an A or AAAA target (qt): an instance per address, on the target's
// ports.
func (s *Source) resolveAddrs(ctx context.Context, server string, qt dnsmessage.Type) ([]registry.Instance, time.Duration, error) {
	ans, err := s.query(ctx, server, s.t.Name, qt)
	if err != nil {
		return nil, 0, err
	}
	var out []registry.Instance
	for _, a := range ans.addrs(s.t.Name) {
		out = append(out, registry.Instance{
			Service: s.t.Service, ID: addrID(a), Address: a.String(),
			HTTPPort: s.t.HTTPPort, SIPPort: s.t.SIPPort, Weight: 1, Health: registry.HealthUnknown,
		})
	}
	return sortByID(out), ans.ttl, nil
}

// resolveSRV resolves an SRV target: an instance per record whose target has an address,
// active at the lowest priority and standby at the others.
func (s *Source) resolveSRV(ctx context.Context, server string) ([]registry.Instance, time.Duration, error) {
	ans, err := s.query(ctx, server, s.t.Name, dnsmessage.TypeSRV)
	if err != nil {
		return nil, 0, err
	}
	ttl := ans.ttl
	lowest := uint16(math.MaxUint16)
	for _, r := range ans.srv {
		lowest = min(lowest, r.Priority)
	}
	var out []registry.Instance
	for _, r := range ans.srv {
		target := r.Target.String()
		addrs, addrTTL, err := s.targetAddrs(ctx, server, ans, target)
		if err != nil {
			return nil, 0, err
		}
		ttl = min(ttl, addrTTL)
		if len(addrs) == 0 {
			continue // a target without addresses cannot be routed to
		}
		state := registry.StateActive
		if r.Priority != lowest {
			state = registry.StateStandby
		}
		out = append(out, registry.Instance{
			Service: s.t.Service, ID: strings.TrimSuffix(target, ".") + "-" + strconv.Itoa(int(r.Port)),
			Address: addrs[0].String(), HTTPPort: int(r.Port), Weight: uint32(min(max(r.Weight, 1), 1000)),
			State: state, Health: registry.HealthUnknown,
		})
	}
	return sortByID(out), ttl, nil
}

// targetAddrs returns an SRV target's addresses: those the SRV answer carries, else those of
// an A query, else of an AAAA query, with the TTL of the query that found them (the answer's
// own TTL, at most, when it carried them).
func (s *Source) targetAddrs(ctx context.Context, server string, ans *answer, target string) ([]netip.Addr, time.Duration, error) {
	if addrs := ans.addrs(target); len(addrs) > 0 {
		return addrs, ans.ttl, nil
	}
	for _, qt := range []dnsmessage.Type{dnsmessage.TypeA, dnsmessage.TypeAAAA} {
		sub, err := s.query(ctx, server, target, qt)
		if err != nil {
			return nil, 0, fmt.Errorf("dns: SRV target %s: %w", target, err)
		}
		if addrs := sub.addrs(target); len(addrs) > 0 {
			return addrs, sub.ttl, nil
		}
	}
	return nil, ans.ttl, nil
}

type answer struct {
	a   map[string][]netip.Addr // owner name (lower case) → addresses, from answers and additionals
	srv []dnsmessage.SRVResource
	ttl time.Duration
}

func (a *answer) addrs(name string) []netip.Addr { return a.a[strings.ToLower(name)] }

// query asks server one question over UDP (TCP when the answer is truncated).
func (s *Source) query(ctx context.Context, server, name string, qt dnsmessage.Type) (*answer, error) {
	n, err := dnsmessage.NewName(name)
	if err != nil {
		return nil, err
	}
	var idb [2]byte
	if _, err := rand.Read(idb[:]); err != nil {
		return nil, err
	}
	id := binary.BigEndian.Uint16(idb[:])
	q := dnsmessage.Message{
		Header:    dnsmessage.Header{ID: id, RecursionDesired: true},
		Questions: []dnsmessage.Question{{Name: n, Type: qt, Class: dnsmessage.ClassINET}},
	}
	packed, err := q.Pack()
	if err != nil {
		return nil, err
	}
	resp, err := s.exchange(ctx, "udp", server, packed, id)
	if err == nil && resp.Truncated {
		resp, err = s.exchange(ctx, "tcp", server, packed, id)
	}
	if err != nil {
		return nil, fmt.Errorf("dns: %s %s at %s: %w", qt, name, server, err)
	}
	switch resp.RCode {
	case dnsmessage.RCodeSuccess, dnsmessage.RCodeNameError:
	default:
		return nil, fmt.Errorf("dns: %s %s at %s: %s", qt, name, server, resp.RCode)
	}
	return readAnswer(resp, qt), nil
}

// readAnswer collects the addresses and SRV records of a response to a question of type qt,
// and its TTL: the least of the answers' and addresses' TTLs, or for no answer the negative
// TTL (the SOA's minimum, RFC 2308; 0 without one).
func readAnswer(resp *dnsmessage.Message, qt dnsmessage.Type) *answer {
	ans := &answer{a: map[string][]netip.Addr{}, ttl: time.Duration(math.MaxInt64)}
	sawAnswer := false
	for _, rr := range append(slices.Clone(resp.Answers), resp.Additionals...) {
		owner := strings.ToLower(rr.Header.Name.String())
		isAnswer := rr.Header.Type == qt
		switch b := rr.Body.(type) {
		case *dnsmessage.AResource:
			ans.a[owner] = append(ans.a[owner], netip.AddrFrom4(b.A))
		case *dnsmessage.AAAAResource:
			ans.a[owner] = append(ans.a[owner], netip.AddrFrom16(b.AAAA))
		case *dnsmessage.SRVResource:
			ans.srv = append(ans.srv, *b)
		}
		if isAnswer || rr.Header.Type == dnsmessage.TypeA || rr.Header.Type == dnsmessage.TypeAAAA {
			sawAnswer = sawAnswer || isAnswer
			ans.ttl = min(ans.ttl, time.Duration(rr.Header.TTL)*time.Second)
		}
	}
	if !sawAnswer {
		ans.ttl = 0
		for _, rr := range resp.Authorities {
			if soa, ok := rr.Body.(*dnsmessage.SOAResource); ok {
				ans.ttl = time.Duration(min(soa.MinTTL, rr.Header.TTL)) * time.Second
			}
		}
	}
	return ans
}

func (s *Source) exchange(ctx context.Context, network, server string, q []byte, id uint16) (*dnsmessage.Message, error) {
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	var d net.Dialer
	conn, err := d.DialContext(ctx, network, server)
	if err != nil {
		return nil, err
	}
	defer func() { _ = conn.Close() }()
	if dl, ok := ctx.Deadline(); ok {
		_ = conn.SetDeadline(dl)
	}
	if network == "tcp" {
		framed := binary.BigEndian.AppendUint16(nil, uint16(len(q)))
		if _, err := conn.Write(append(framed, q...)); err != nil {
			return nil, err
		}
		var l [2]byte
		if _, err := readFull(conn, l[:]); err != nil {
			return nil, err
		}
		buf := make([]byte, binary.BigEndian.Uint16(l[:]))
		if _, err := readFull(conn, buf); err != nil {
			return nil, err
		}
		return parse(buf, id)
	}
	if _, err := conn.Write(q); err != nil {
		return nil, err
	}
	buf := make([]byte, 65535)
	for {
		n, err := conn.Read(buf)
		if err != nil {
			return nil, err
		}
		m, err := parse(buf[:n], id)
		if errors.Is(err, errWrongID) {
			continue // a stray or spoofed datagram: keep waiting for ours
		}
		return m, err
	}
}

var errWrongID = errors.New("answer id does not match the query")

func parse(b []byte, id uint16) (*dnsmessage.Message, error) {
	var m dnsmessage.Message
	if err := m.Unpack(b); err != nil {
		return nil, fmt.Errorf("malformed answer: %w", err)
	}
	if m.ID != id || !m.Response {
		return nil, errWrongID
	}
	return &m, nil
}

func readFull(c net.Conn, b []byte) (int, error) {
	n := 0
	for n < len(b) {
		k, err := c.Read(b[n:])
		n += k
		if err != nil {
			return n, err
		}
	}
	return n, nil
}

// systemServer returns the first nameserver of a resolv.conf file as ip:53.
func systemServer(path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", fmt.Errorf("dns: no server configured and %w", err)
	}
	defer func() { _ = f.Close() }()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) >= 2 && fields[0] == "nameserver" {
			if a, err := netip.ParseAddr(fields[1]); err == nil {
				return netip.AddrPortFrom(a, 53).String(), nil
			}
		}
	}
	return "", fmt.Errorf("dns: no nameserver in %s", path)
}

func addrID(a netip.Addr) string { return strings.NewReplacer(":", "-", "%", "-").Replace(a.String()) }

func sortByID(ins []registry.Instance) []registry.Instance {
	slices.SortFunc(ins, func(a, b registry.Instance) int { return strings.Compare(a.ID, b.ID) })
	return ins
}
