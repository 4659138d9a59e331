// Package connlimit bounds the connections a listener holds, so that one listener's flood
// cannot take the process's file descriptors from the others (ext_proc, xDS, the API, SIP
// decide, outbound Redis and health checks), and watches the descriptors the process uses.
//
// A Listener admits at most Max open connections. When a connection arrives at the cap, the
// connection that has been evictable longest is closed to make room: one that has sent no
// complete request yet, is idle between requests, or is still sending a request body (an
// HTTP server reports these through ConnState and Handler); on a listener whose server
// reports nothing (gRPC), one that has not sent a byte. With nothing evictable the new
// connection is closed at once and counted as refused.
// Either way an accepted connection costs a descriptor only while it is held, so a slow
// flood keeps at most Max descriptors and a new client (a health probe, the dashboard) still
// gets in: it evicts the flood's oldest connection instead of waiting behind it.
package connlimit

import (
	"context"
	"io"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"
)

// Listener is a net.Listener that holds at most Max connections (see the package doc). It is
// safe for concurrent use; ConnState, ConnContext and Handler are its hooks into an
// http.Server (Serve them all or none).
type Listener struct {
	net.Listener
	max int
	now func() time.Time

	mu    sync.Mutex
	conns map[*conn]struct{}

	refused, evicted atomic.Uint64
}

// New wraps l so it holds at most n connections (n < 1 is treated as 1).
func New(l net.Listener, n int) *Listener {
	return &Listener{Listener: l, max: max(1, n), now: time.Now, conns: map[*conn]struct{}{}}
}

// Max is the cap.
func (l *Listener) Max() int { return l.max }

// Open is the number of connections held now.
func (l *Listener) Open() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.conns)
}

// Refused is how many connections were closed on arrival because the cap was reached with
// nothing evictable.
func (l *Listener) Refused() uint64 { return l.refused.Load() }

// Evicted is how many held connections were closed to make room for a new one.
func (l *Listener) Evicted() uint64 { return l.evicted.Load() }

// Accept waits for the next connection that fits under the cap.
func (l *Listener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		if wc := l.admit(c); wc != nil {
			return wc, nil
		}
	}
}

// admit registers c, evicting the longest-evictable connection at the cap; it returns nil
// (having closed c) when nothing can make room.
func (l *Listener) admit(c net.Conn) *conn {
	now := l.now()
	wc := &conn{Conn: c, l: l}
	wc.state.Store(stateUnreported)
	wc.evictableSince.Store(now.UnixNano()) // a new connection has sent nothing yet
	l.mu.Lock()
	var victim *conn
	if len(l.conns) >= l.max {
		oldest := int64(0)
		for o := range l.conns {
			if s := o.evictableAt(); s != 0 && (victim == nil || s < oldest) {
				victim, oldest = o, s
			}
		}
		if victim == nil {
			l.mu.Unlock()
			l.refused.Add(1)
			_ = c.Close()
			return nil
		}
		delete(l.conns, victim)
	}
	l.conns[wc] = struct{}{}
	l.mu.Unlock()
	if victim != nil {
		l.evicted.Add(1)
		_ = victim.Conn.Close()
	}
	return wc
}

func (l *Listener) forget(c *conn) {
	l.mu.Lock()
	delete(l.conns, c)
	l.mu.Unlock()
}

// stateUnreported is a conn's state until an http.Server reports one through ConnState.
const stateUnreported = -1

// conn is a held connection. evictableSince is the time (Unix ns) it became evictable, 0 while
// it is serving: set when it is new, idle or has a request body still arriving.
type conn struct {
	net.Conn
	l              *Listener
	closed         atomic.Bool
	spoke          atomic.Bool  // it has sent at least one byte
	state          atomic.Int32 // http.ConnState, or stateUnreported
	unreadBodies   atomic.Int32 // requests whose body has not arrived whole
	evictableSince atomic.Int64
}

func (c *conn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	if n > 0 && !c.spoke.Load() {
		c.spoke.Store(true)
	}
	return n, err
}

func (c *conn) evictableAt() int64 {
	switch st := c.state.Load(); http.ConnState(st) {
	case stateUnreported:
		if !c.spoke.Load() {
			return c.evictableSince.Load()
		}
	case http.StateNew, http.StateIdle:
		return c.evictableSince.Load()
	case http.StateActive:
		if c.unreadBodies.Load() > 0 {
			return c.evictableSince.Load()
		}
	}
	return 0
}

func (c *conn) markEvictable(on bool) {
	if on {
		c.evictableSince.CompareAndSwap(0, c.l.now().UnixNano())
	} else {
		c.evictableSince.Store(0)
	}
}

func (c *conn) Close() error {
	if c.closed.CompareAndSwap(false, true) {
		c.l.forget(c)
	}
	return c.Conn.Close()
}

// ConnState is the http.Server.ConnState hook (chain it with any other).
func (l *Listener) ConnState(nc net.Conn, s http.ConnState) {
	c, ok := nc.(*conn)
	if !ok {
		c, ok = underlying(nc)
	}
	if !ok {
		return
	}
	c.state.Store(int32(s))
	switch s {
	case http.StateIdle, http.StateNew:
		c.markEvictable(true)
	case http.StateActive:
		c.markEvictable(c.unreadBodies.Load() > 0)
	case http.StateClosed, http.StateHijacked:
		c.markEvictable(false)
		if c.closed.CompareAndSwap(false, true) {
			l.forget(c)
		}
	}
}

// underlying finds the held connection under a wrapper (a *tls.Conn).
func underlying(nc net.Conn) (*conn, bool) {
	type netConner interface{ NetConn() net.Conn }
	for range 4 {
		w, ok := nc.(netConner)
		if !ok {
			return nil, false
		}
		nc = w.NetConn()
		if c, ok := nc.(*conn); ok {
			return c, true
		}
	}
	return nil, false
}

type connKey struct{}

// ConnContext is the http.Server.ConnContext hook: it lets Handler find a request's
// connection.
func (l *Listener) ConnContext(ctx context.Context, nc net.Conn) context.Context {
	c, ok := nc.(*conn)
	if !ok {
		c, ok = underlying(nc)
	}
	if !ok {
		return ctx
	}
	return context.WithValue(ctx, connKey{}, c)
}

// Handler marks a request's connection evictable while its body is still arriving (a
// slow-body client holds a connection as surely as one that never sends its headers).
func (l *Listener) Handler(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c, _ := r.Context().Value(connKey{}).(*conn)
		if c == nil || r.Body == nil || r.Body == http.NoBody || r.ContentLength == 0 {
			next.ServeHTTP(w, r)
			return
		}
		b := &body{ReadCloser: r.Body, c: c}
		c.unreadBodies.Add(1)
		c.markEvictable(true)
		defer b.done()
		r.Body = b
		next.ServeHTTP(w, r)
	})
}

// body tracks one request body until it has arrived whole (EOF), is closed or the handler
// returns.
type body struct {
	io.ReadCloser
	c    *conn
	once sync.Once
}

func (b *body) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if err != nil {
		b.done()
	}
	return n, err
}

func (b *body) Close() error {
	b.done()
	return b.ReadCloser.Close()
}

func (b *body) done() {
	b.once.Do(func() {
		if b.c.unreadBodies.Add(-1) == 0 {
			b.c.markEvictable(false)
		}
	})
}
