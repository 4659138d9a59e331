package dns_test

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/tether-dev/tether/pkg/discovery/dns"
	"github.com/tether-dev/tether/pkg/registry"
)

// dnsmasq is a real DNS server (Debian's dnsmasq-base) on 127.0.0.1, authoritative for .test,
// answering from a hosts file with a TTL of ttl seconds and logging every query.
type dnsmasq struct {
	t     *testing.T
	dir   string
	hosts string
	port  int
	ttl   int
	args  []string
	cmd   *exec.Cmd
	log   string
}

func requireDNSMasq(t *testing.T) string {
	t.Helper()
	bin, err := exec.LookPath("dnsmasq")
	if err != nil {
		bin = "/usr/sbin/dnsmasq"
		if _, serr := os.Stat(bin); serr != nil {
			msg := "dnsmasq missing; install with: apt-get install dnsmasq-base (part of make deps)"
			if os.Getenv("CI") != "" {
				t.Fatal(msg)
			}
			t.Skip(msg)
		}
	}
	return bin
}

func startDNSMasq(t *testing.T, ttl int, hosts string, extra ...string) *dnsmasq {
	t.Helper()
	bin := requireDNSMasq(t)
	dir := t.TempDir()
	d := &dnsmasq{t: t, dir: dir, hosts: filepath.Join(dir, "hosts"), ttl: ttl, log: filepath.Join(dir, "dnsmasq.log")}
	d.setHosts(hosts)
	d.args = []string{"-k", "--conf-file=/dev/null", "--no-resolv", "--no-hosts", "--local=/test/",
		"--listen-address=127.0.0.1", "--bind-interfaces", "--addn-hosts=" + d.hosts,
		fmt.Sprintf("--local-ttl=%d", ttl), "--user=root", "--pid-file=", "--log-queries", "--log-facility=" + d.log}
	d.args = append(d.args, extra...)
	// The port is picked free for UDP, but dnsmasq binds TCP on it too, and another process may
	// take either in between: on "Address already in use" try another port.
	t.Cleanup(d.stop)
	for attempt := 0; ; attempt++ {
		d.port = freeUDPPort(t)
		if d.tryStart(bin) || attempt == 4 {
			break
		}
	}
	if d.cmd == nil {
		d.start(bin) // reports why
	}
	return d
}

// tryStart starts dnsmasq on d.port and reports whether it is answering; false (and d stopped)
// when the port was taken.
func (d *dnsmasq) tryStart(bin string) bool {
	d.t.Helper()
	d.start0(bin, true)
	return d.cmd != nil
}

func (d *dnsmasq) start(bin string) {
	d.t.Helper()
	d.start0(bin, false)
}

func (d *dnsmasq) start0(bin string, portMayBeTaken bool) {
	d.t.Helper()
	d.cmd = exec.Command(bin, append(slices.Clone(d.args), fmt.Sprintf("--port=%d", d.port))...)
	out, err := os.OpenFile(filepath.Join(d.dir, "stderr"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		d.t.Fatal(err)
	}
	d.cmd.Stdout, d.cmd.Stderr = out, out
	if err := d.cmd.Start(); err != nil {
		d.t.Fatal(err)
	}
	// Ready when it answers on its port.
	deadline := time.Now().Add(10 * time.Second)
	for {
		c, err := net.Dial("udp", d.addr())
		if err == nil {
			_ = c.SetDeadline(time.Now().Add(200 * time.Millisecond))
			// A minimal query for "test." SOA; any answer means it listens.
			q := []byte{0xbe, 0xef, 1, 0, 0, 1, 0, 0, 0, 0, 0, 0, 4, 't', 'e', 's', 't', 0, 0, 6, 0, 1}
			_, _ = c.Write(q)
			buf := make([]byte, 512)
			_, rerr := c.Read(buf)
			_ = c.Close()
			if rerr == nil {
				return
			}
		}
		b, _ := os.ReadFile(filepath.Join(d.dir, "stderr"))
		if portMayBeTaken && strings.Contains(string(b), "Address already in use") {
			d.stop()
			_ = os.Truncate(filepath.Join(d.dir, "stderr"), 0)
			return
		}
		if time.Now().After(deadline) {
			d.t.Fatalf("dnsmasq did not answer on %s: %s", d.addr(), b)
		}
		time.Sleep(20 * time.Millisecond) // polling an external process's readiness
	}
}

func (d *dnsmasq) stop() {
	if d.cmd != nil && d.cmd.Process != nil {
		_ = d.cmd.Process.Kill()
		_ = d.cmd.Wait()
		d.cmd = nil
	}
}

func (d *dnsmasq) addr() string { return fmt.Sprintf("127.0.0.1:%d", d.port) }

func (d *dnsmasq) setHosts(content string) {
	d.t.Helper()
	if err := os.WriteFile(d.hosts, []byte(content), 0o644); err != nil {
		d.t.Fatal(err)
	}
}

// reload makes dnsmasq re-read its hosts file (and clear its cache), as an operator would.
func (d *dnsmasq) reload() {
	d.t.Helper()
	if err := d.cmd.Process.Signal(syscall.SIGHUP); err != nil {
		d.t.Fatal(err)
	}
}

// queries counts the logged queries of type qtype for name.
func (d *dnsmasq) queries(qtype, name string) int {
	b, _ := os.ReadFile(d.log)
	return strings.Count(string(b), "query["+qtype+"] "+name+" from")
}

func freeUDPPort(t *testing.T) int {
	t.Helper()
	c, err := net.ListenPacket("udp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = c.Close() }()
	return c.LocalAddr().(*net.UDPAddr).Port
}

func newRegistry(t *testing.T) *registry.Registry {
	t.Helper()
	r := registry.New()
	if err := r.Apply([]registry.Service{{Name: "web", Affinity: registry.AffinityCookie, Balancing: registry.BalanceRoundRobin, SessionsPerInstance: 20}}, nil); err != nil {
		t.Fatal(err)
	}
	return r
}

func run(t *testing.T, s *dns.Source) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = s.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
}

func describe(r *registry.Registry) []string {
	var out []string
	for _, in := range r.Snapshot().Instances("web") {
		out = append(out, fmt.Sprintf("%s %s:%d w%d %s", in.ID, in.Address, in.HTTPPort, in.Weight, in.State))
	}
	return out
}

// waitFor polls until the registry's instances of web are want and returns how long it took.
func waitFor(t *testing.T, r *registry.Registry, limit time.Duration, want ...string) time.Duration {
	t.Helper()
	start := time.Now()
	for !slices.Equal(describe(r), want) {
		if time.Since(start) > limit {
			t.Fatalf("after %s: instances %q, want %q; sources %+v", limit, describe(r), want, r.Sources())
		}
		time.Sleep(5 * time.Millisecond)
	}
	return time.Since(start)
}

func status(r *registry.Registry, name string) registry.SourceStatus {
	for _, s := range r.Sources() {
		if s.Name == name {
			return s
		}
	}
	return registry.SourceStatus{}
}

// Records added and removed are followed within their TTL, the source asks no more often than
// the TTL allows, and a server that stops answering keeps the last good set (and says so).
func TestARecordsFollowedWithinTTL(t *testing.T) {
	const ttl = 1
	d := startDNSMasq(t, ttl, "198.18.5.1 web.test\n")
	r := newRegistry(t)
	src, err := dns.New(dns.Target{Service: "web", Name: "web.test", Type: dns.TypeA, HTTPPort: 8080, Server: d.addr(),
		MinRefresh: 100 * time.Millisecond, MaxRefresh: time.Minute}, r)
	if err != nil {
		t.Fatal(err)
	}
	begin := time.Now()
	run(t, src)
	waitFor(t, r, 10*time.Second, "198.18.5.1 198.18.5.1:8080 w1 active")

	// The bound: a change is seen at the latest when the cached answer's TTL runs out, plus one
	// query's round trip; the slack absorbs a loaded machine.
	bound := ttl*time.Second + 2*time.Second
	d.setHosts("198.18.5.1 web.test\n198.18.5.2 web.test\n")
	d.reload()
	if took := waitFor(t, r, 10*time.Second, "198.18.5.1 198.18.5.1:8080 w1 active", "198.18.5.2 198.18.5.2:8080 w1 active"); took > bound {
		t.Errorf("added record seen after %s, want within the TTL (%ds, bound %s)", took, ttl, bound)
	}
	d.setHosts("198.18.5.2 web.test\n")
	d.reload()
	if took := waitFor(t, r, 10*time.Second, "198.18.5.2 198.18.5.2:8080 w1 active"); took > bound {
		t.Errorf("removed record gone after %s, want within the TTL (%ds, bound %s)", took, ttl, bound)
	}
	// TTL honoured the other way: about one query per TTL, not one per MinRefresh (100ms).
	elapsed := time.Since(begin)
	if n, most := d.queries("A", "web.test"), int(elapsed/(ttl*time.Second))+2; n > most {
		t.Errorf("%d A queries in %s with a %ds TTL, want at most %d", n, elapsed, ttl, most)
	}

	// The name disappears (NXDOMAIN): a valid, empty answer.
	d.setHosts("")
	d.reload()
	waitFor(t, r, 10*time.Second)
	if st := status(r, src.Name()); !st.Synced || st.Failing {
		t.Errorf("after NXDOMAIN: %+v, want synced, not failing", st)
	}

	// The server dies: the last good set stays, the status says failing.
	d.setHosts("198.18.5.3 web.test\n")
	d.reload()
	waitFor(t, r, 10*time.Second, "198.18.5.3 198.18.5.3:8080 w1 active")
	d.stop()
	deadline := time.Now().Add(15 * time.Second)
	for !status(r, src.Name()).Failing {
		if time.Now().After(deadline) {
			t.Fatalf("a dead server was not reported: %+v", status(r, src.Name()))
		}
		time.Sleep(10 * time.Millisecond)
	}
	if got := describe(r); !slices.Equal(got, []string{"198.18.5.3 198.18.5.3:8080 w1 active"}) {
		t.Errorf("after the server died: %q, want the last good set", got)
	}
	if st := status(r, src.Name()); st.LastError == "" {
		t.Errorf("failing without an error: %+v", st)
	}
}

// SRV records: weight from the record, the lowest priority active and the others standby, the
// target's address from the additional section or an A query; a record removed is followed.
func TestSRVRecords(t *testing.T) {
	hosts := "198.18.6.1 a.web.test\n198.18.6.2 b.web.test\n198.18.6.3 c.web.test\n"
	srv := func(target string, port, prio, weight int) string {
		return fmt.Sprintf("--srv-host=_http._tcp.web.test,%s,%d,%d,%d", target, port, prio, weight)
	}
	d := startDNSMasq(t, 1, hosts, srv("a.web.test", 8080, 0, 5), srv("b.web.test", 8081, 0, 0), srv("c.web.test", 8082, 10, 1))
	r := newRegistry(t)
	src, err := dns.New(dns.Target{Service: "web", Name: "_http._tcp.web.test", Type: dns.TypeSRV, Server: d.addr(),
		MinRefresh: 100 * time.Millisecond, MaxRefresh: time.Minute}, r)
	if err != nil {
		t.Fatal(err)
	}
	run(t, src)
	waitFor(t, r, 10*time.Second,
		"a.web.test-8080 198.18.6.1:8080 w5 active",
		"b.web.test-8081 198.18.6.2:8081 w1 active",
		"c.web.test-8082 198.18.6.3:8082 w1 standby")

	// dnsmasq reads SRV records from its command line: restart it on the same port without b.
	d.stop()
	d.args = slices.DeleteFunc(d.args, func(a string) bool { return strings.Contains(a, "b.web.test,8081") })
	d.start(requireDNSMasq(t))
	waitFor(t, r, 15*time.Second,
		"a.web.test-8080 198.18.6.1:8080 w5 active",
		"c.web.test-8082 198.18.6.3:8082 w1 standby")
}
