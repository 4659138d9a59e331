package connlimit_test

import (
	"bufio"
	"errors"
	"io"
	"net"
	"net/http"
	"testing"
	"time"

	"github.com/tether-dev/tether/internal/testutil"
	"github.com/tether-dev/tether/pkg/connlimit"
)

func listen(t *testing.T, n int) *connlimit.Listener {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	l := connlimit.New(ln, n)
	t.Cleanup(func() { _ = l.Close() })
	return l
}

// closed reports whether the server closed c (a read sees EOF or a reset, not a timeout).
func closed(c net.Conn) bool {
	_ = c.SetReadDeadline(time.Now().Add(500 * time.Millisecond))
	_, err := c.Read(make([]byte, 1))
	var ne net.Error
	return err != nil && (!errors.As(err, &ne) || !ne.Timeout())
}

// TestSlowClientsAreEvictedForNewOnes: an HTTP server behind a cap of 4 held by four
// slow-body clients still answers a new client (the oldest slow one is evicted), and never
// holds more than 4.
func TestSlowClientsAreEvictedForNewOnes(t *testing.T) {
	l := listen(t, 4)
	// Each handler says when it runs: by then l.Handler has marked its connection evictable, so
	// the slow clients become evictable in the order they were dialled (on a loaded machine
	// the handlers of two slow clients could otherwise start in either order).
	started := make(chan struct{}, 16)
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case started <- struct{}{}:
		default:
		}
		_, _ = io.Copy(io.Discard, r.Body)
		_, _ = io.WriteString(w, "ok")
	})}
	srv.ConnState, srv.ConnContext, srv.Handler = l.ConnState, l.ConnContext, l.Handler(srv.Handler)
	go func() { _ = srv.Serve(l) }()
	t.Cleanup(func() { _ = srv.Close() })
	var slow []net.Conn
	for range 4 {
		c, err := net.Dial("tcp", l.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = c.Close() })
		if _, err := io.WriteString(c, "POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n{"); err != nil {
			t.Fatal(err)
		}
		slow = append(slow, c)
		want := len(slow)
		testutil.Eventually(t, "the slow client held", func() bool { return l.Open() == want })
		select {
		case <-started:
		case <-time.After(testutil.DefaultWait):
			t.Fatalf("the handler of slow client %d never ran", want-1)
		}
	}
	for i := range 3 {
		// A new client whose request is answered and whose connection then stays open, idle.
		c, err := net.Dial("tcp", l.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = c.Close() })
		if _, err := io.WriteString(c, "POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}"); err != nil {
			t.Fatal(err)
		}
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil || resp.StatusCode != 200 {
			t.Fatalf("new client %d: %v %v", i, resp, err)
		}
		_ = resp.Body.Close()
		if !closed(slow[i]) {
			t.Errorf("slow client %d (the oldest) was not evicted for new client %d", i, i)
		}
		if l.Open() > 4 {
			t.Fatalf("%d held, cap 4", l.Open())
		}
	}
	if closed(slow[3]) {
		t.Error("the newest slow client was evicted before its turn")
	}
	if l.Evicted() < 3 {
		t.Errorf("evicted %d, want ≥ 3", l.Evicted())
	}
}

// TestUnreportedConnsThatSpokeAreKept: without an HTTP server's reports (gRPC), connections
// that sent bytes are kept and a new one is refused at the cap; a silent one is evicted.
func TestUnreportedConnsThatSpokeAreKept(t *testing.T) {
	l := listen(t, 2)
	accepted := make(chan net.Conn, 8)
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			accepted <- c
			go func() { _, _ = io.Copy(io.Discard, c) }()
		}
	}()
	dial := func(say string) net.Conn {
		c, err := net.Dial("tcp", l.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = c.Close() })
		if say != "" {
			if _, err := io.WriteString(c, say); err != nil {
				t.Fatal(err)
			}
		}
		return c
	}
	a := dial("PRI * HTTP/2.0")
	<-accepted
	b := dial("")
	<-accepted
	testutil.Eventually(t, "a's bytes read", func() bool { return l.Open() == 2 })
	c := dial("hello")
	testutil.Eventually(t, "a new connection evicts the silent one", func() bool { return l.Evicted() == 1 })
	<-accepted
	if !closed(b) || closed(a) {
		t.Errorf("silent b closed %v (want true), a closed %v (want false)", closed(b), closed(a))
	}
	testutil.Eventually(t, "c's bytes read", func() bool { return l.Open() == 2 })
	d := dial("")
	testutil.Eventually(t, "with nothing evictable the new one is refused", func() bool { return l.Refused() == 1 })
	if !closed(d) || closed(c) {
		t.Errorf("refused d closed %v, held c closed %v", closed(d), closed(c))
	}
}
