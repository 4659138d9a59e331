package kubetest

import (
	"crypto/rand"
	"encoding/binary"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"sync"
	"testing"

	"golang.org/x/sys/unix"
)

// Host is a test host for EndpointSlice addresses, which the API server refuses on loopback: a
// network namespace this test made, joined to the test's own namespace by a veth pair with one
// address on each end, both in 198.18.0.0/15 (reserved for benchmarking tests, RFC 2544). The
// host's address is reachable from the test process (the route is the veth's connected /30) and
// from nowhere else; nothing outside this machine is ever addressed.
//
// Servers run "on" the host by creating their listening sockets inside its namespace (Do): a
// socket stays in the namespace it was made in, so the test's own goroutines serve it and count
// what reaches it.
type Host struct {
	// Name is the namespace's name (ip netns).
	Name string
	// Addr is the host's address inside its namespace; Peer is the test side of the veth.
	Addr, Peer netip.Addr
}

var hostSeq struct {
	mu   sync.Mutex
	base uint32 // random per process, so concurrent test processes rarely collide
	n    uint32
}

// NewHost makes a network namespace with a veth pair and addresses for tb and removes both when
// tb ends. It needs root (CAP_NET_ADMIN and CAP_SYS_ADMIN) and the ip command (iproute2): it
// skips tb in -short runs and otherwise fails when either is missing — under CI as well as
// elsewhere, since a test that asks for a host means to send it traffic.
func NewHost(tb testing.TB) *Host {
	tb.Helper()
	if testing.Short() {
		tb.Skip("kubetest: network-namespace hosts are not made in -short runs")
	}
	if _, err := exec.LookPath("ip"); err != nil {
		tb.Fatalf("kubetest: the ip command (Debian iproute2, installed by .ci/deps.sh) is needed for test hosts: %v", err)
	}
	if os.Geteuid() != 0 {
		tb.Fatal("kubetest: test hosts in network namespaces need root (run the tests as root, as CI does)")
	}
	for attempt := 0; ; attempt++ {
		h, err := newHost(tb)
		if err == nil {
			return h
		}
		if attempt == 3 {
			tb.Fatalf("kubetest: test host: %v", err)
		}
	}
}

func newHost(tb testing.TB) (*Host, error) {
	tb.Helper()
	hostSeq.mu.Lock()
	if hostSeq.base == 0 {
		var b [4]byte
		_, _ = rand.Read(b[:])
		hostSeq.base = binary.BigEndian.Uint32(b[:])
	}
	hostSeq.n++
	slot := (hostSeq.base + hostSeq.n) % (1 << 15) // 2^15 /30 blocks in a /15
	hostSeq.mu.Unlock()
	var b [4]byte
	_, _ = rand.Read(b[:])
	tag := fmt.Sprintf("%08x", binary.BigEndian.Uint32(b[:]))
	name := "tt" + tag
	// 198.18.0.0/15, block slot: .1 is the test side, .2 the host.
	base := uint32(198)<<24 | uint32(18)<<16 | slot<<2
	peer := netip.AddrFrom4([4]byte{byte(base >> 24), byte(base >> 16), byte(base >> 8), byte(base) + 1})
	addr := netip.AddrFrom4([4]byte{byte(base >> 24), byte(base >> 16), byte(base >> 8), byte(base) + 2})
	outer, inner := "tt"+tag+"h", "tt"+tag+"n"
	cleanup := func() {
		_ = run("ip", "link", "del", outer) // removes its peer too
		_ = run("ip", "netns", "del", name)
	}
	for _, args := range [][]string{
		{"netns", "add", name},
		{"link", "add", outer, "type", "veth", "peer", "name", inner},
		{"link", "set", inner, "netns", name},
		{"addr", "add", peer.String() + "/30", "dev", outer},
		{"link", "set", outer, "up"},
		{"-n", name, "addr", "add", addr.String() + "/30", "dev", inner},
		{"-n", name, "link", "set", inner, "up"},
		{"-n", name, "link", "set", "lo", "up"},
	} {
		if err := run("ip", args...); err != nil {
			cleanup()
			return nil, err
		}
	}
	tb.Cleanup(cleanup)
	return &Host{Name: name, Addr: addr, Peer: peer}, nil
}

func run(bin string, args ...string) error {
	out, err := exec.Command(bin, args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("%s %s: %w: %s", bin, strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return nil
}

// Do runs fn on an OS thread that has entered the host's network namespace, and returns its
// error. Sockets fn creates (net.Listen on h.Addr) live in the namespace for good; fn must not
// start goroutines that expect to be in it. The thread is returned to the test's namespace
// afterwards, or retired if it cannot be.
func (h *Host) Do(fn func() error) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		orig, err := os.Open(fmt.Sprintf("/proc/self/task/%d/ns/net", unix.Gettid()))
		if err != nil {
			runtime.UnlockOSThread()
			errc <- err
			return
		}
		defer func() { _ = orig.Close() }()
		target, err := os.Open("/var/run/netns/" + h.Name)
		if err != nil {
			runtime.UnlockOSThread()
			errc <- err
			return
		}
		defer func() { _ = target.Close() }()
		if err := unix.Setns(int(target.Fd()), unix.CLONE_NEWNET); err != nil {
			runtime.UnlockOSThread()
			errc <- fmt.Errorf("setns %s: %w", h.Name, err)
			return
		}
		ferr := fn()
		if err := unix.Setns(int(orig.Fd()), unix.CLONE_NEWNET); err == nil {
			runtime.UnlockOSThread()
		} // else: the goroutine ends locked and the runtime retires the thread
		errc <- ferr
	}()
	return <-errc
}
