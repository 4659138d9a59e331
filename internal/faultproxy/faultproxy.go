// Package faultproxy is a TCP fault proxy on loopback for tests: one Proxy stands between one
// client (a tether replica) and one server (redis-server), so that a fault can be put on that
// client's path alone — the others keep talking to the server. It does what the field's
// toxiproxy does for these tests, without its server and HTTP API:
//
//   - Cut: every connection is reset and new ones are refused (a partition a client notices
//     at once: connection refused / reset).
//   - Blackhole: connections stay open but nothing passes either way, and new connections are
//     accepted and held the same way (a partition a client notices only by its timeouts, as
//     across a real network when packets are dropped).
//   - Latency: every chunk of data waits d before it is forwarded (both directions).
//   - Heal: back to forwarding.
//
// A Proxy is safe for concurrent use; Close stops it (t.Cleanup does).
package faultproxy

import (
	"net"
	"sync"
	"testing"
	"time"
)

// Mode is what the proxy does with traffic.
type Mode int

// The modes.
const (
	Forward Mode = iota
	Cut
	Blackhole
)

// Proxy forwards one listener's connections to a target address.
type Proxy struct {
	// Addr is where clients connect (127.0.0.1:port).
	Addr   string
	target string
	ln     net.Listener

	mu      sync.Mutex
	mode    Mode
	latency time.Duration
	conns   map[*pair]struct{}
	changed chan struct{} // closed and replaced at every mode change
	closed  bool
	wg      sync.WaitGroup
}

type pair struct{ client, server net.Conn }

func (p *pair) close() {
	if c, ok := p.client.(*net.TCPConn); ok {
		_ = c.SetLinger(0) // a reset, as a cut link gives
	}
	_ = p.client.Close()
	_ = p.server.Close()
}

// Start runs a proxy to target on an ephemeral loopback port; t.Cleanup closes it.
func Start(t testing.TB, target string) *Proxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &Proxy{Addr: ln.Addr().String(), target: target, ln: ln, conns: map[*pair]struct{}{}, changed: make(chan struct{})}
	p.wg.Go(p.accept)
	t.Cleanup(p.Close)
	return p
}

// SetTarget changes where new connections go (a server restarted on another port).
func (p *Proxy) SetTarget(target string) {
	p.mu.Lock()
	p.target = target
	p.mu.Unlock()
}

// Cut resets every connection and refuses new ones until Heal.
func (p *Proxy) Cut() { p.set(Cut, true) }

// Blackhole stops all traffic (connections stay open, new ones are accepted and held) until
// Heal.
func (p *Proxy) Blackhole() { p.set(Blackhole, false) }

// Heal forwards again. Connections held by a blackhole carry on where they stopped.
func (p *Proxy) Heal() { p.set(Forward, false) }

// SetLatency delays every chunk of data by d (0: none).
func (p *Proxy) SetLatency(d time.Duration) {
	p.mu.Lock()
	p.latency = d
	p.mu.Unlock()
}

func (p *Proxy) set(m Mode, reset bool) {
	p.mu.Lock()
	p.mode = m
	close(p.changed)
	p.changed = make(chan struct{})
	var drop []*pair
	if reset {
		for c := range p.conns {
			drop = append(drop, c)
			delete(p.conns, c)
		}
	}
	p.mu.Unlock()
	for _, c := range drop {
		c.close()
	}
}

// Close stops the proxy and closes every connection.
func (p *Proxy) Close() {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return
	}
	p.closed = true
	p.mu.Unlock()
	_ = p.ln.Close()
	p.set(Cut, true)
	p.wg.Wait()
}

func (p *Proxy) accept() {
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.mu.Lock()
		mode, target := p.mode, p.target
		p.mu.Unlock()
		if mode == Cut {
			if tc, ok := c.(*net.TCPConn); ok {
				_ = tc.SetLinger(0)
			}
			_ = c.Close()
			continue
		}
		p.wg.Go(func() { p.serve(c, target) })
	}
}

func (p *Proxy) serve(c net.Conn, target string) {
	// In a blackhole a new connection is held until the proxy forwards again.
	for {
		p.mu.Lock()
		mode, ch, closed := p.mode, p.changed, p.closed
		p.mu.Unlock()
		if closed || mode == Cut {
			_ = c.Close()
			return
		}
		if mode == Forward {
			break
		}
		<-ch
	}
	s, err := net.DialTimeout("tcp", target, time.Second)
	if err != nil {
		_ = c.Close()
		return
	}
	pr := &pair{client: c, server: s}
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		pr.close()
		return
	}
	p.conns[pr] = struct{}{}
	p.mu.Unlock()
	var wg sync.WaitGroup
	wg.Go(func() { p.pipe(s, c) })
	wg.Go(func() { p.pipe(c, s) })
	wg.Wait()
	p.mu.Lock()
	delete(p.conns, pr)
	p.mu.Unlock()
	pr.close()
}

// pipe copies from src to dst, holding data while the proxy is a blackhole.
func (p *Proxy) pipe(dst, src net.Conn) {
	defer func() {
		_ = dst.Close()
		_ = src.Close()
	}()
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			if !p.wait() {
				return
			}
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return // io.EOF or a closed connection: the other side closes too
		}
	}
}

// wait holds a chunk while the proxy is a blackhole and for the latency; false when the
// connection must go (cut, closed).
func (p *Proxy) wait() bool {
	for {
		p.mu.Lock()
		mode, ch, lat, closed := p.mode, p.changed, p.latency, p.closed
		p.mu.Unlock()
		switch {
		case closed || mode == Cut:
			return false
		case mode == Blackhole:
			<-ch
			continue
		}
		if lat > 0 {
			time.Sleep(lat)
		}
		return true
	}
}
