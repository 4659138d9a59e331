package upstream_test

import (
	"bufio"
	"context"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/tether-dev/tether/internal/upstream"
)

func start(t *testing.T, id string) *upstream.Server {
	t.Helper()
	u, err := upstream.Start(id)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = u.Close() })
	return u
}

func TestIdentifiesItselfAndSetsCookies(t *testing.T) {
	u := start(t, "i7")
	req, _ := http.NewRequest("GET", u.URL()+"/x?y=1", nil)
	req.Header.Add("X-Upstream-Set-Cookie", "a=1")
	req.Header.Add("X-Upstream-Set-Cookie", "b=2; Path=/")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	_ = resp.Body.Close()
	if string(body) != "i7\n" || resp.Header.Get(upstream.InstanceHeader) != "i7" {
		t.Errorf("got %q / %q, want the instance id", body, resp.Header.Get(upstream.InstanceHeader))
	}
	if got := resp.Header.Values("Set-Cookie"); strings.Join(got, "|") != "a=1|b=2; Path=/" {
		t.Errorf("Set-Cookie %q", got)
	}
	if reqs := u.Requests(); len(reqs) != 1 || reqs[0].Path != "/x?y=1" || u.Served() != 1 {
		t.Errorf("recorded %+v, served %d", reqs, u.Served())
	}
	if !strings.HasPrefix(u.Addr(), "127.0.0.1:") || u.Port() == 0 || u.Host() != "127.0.0.1" {
		t.Errorf("address %q host %q port %d", u.Addr(), u.Host(), u.Port())
	}
}

func TestBlockUntilRelease(t *testing.T) {
	u := start(t, "b")
	done := make(chan int, 3)
	for range 3 {
		go func() {
			resp, err := http.Get(u.URL() + "/block")
			if err != nil {
				done <- -1
				return
			}
			_ = resp.Body.Close()
			done <- resp.StatusCode
		}()
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := u.WaitBlocked(ctx, 3); err != nil {
		t.Fatal(err)
	}
	select {
	case <-done:
		t.Fatal("a blocked request finished before Release")
	case <-time.After(20 * time.Millisecond):
	}
	u.Release()
	for range 3 {
		if st := <-done; st != 200 {
			t.Errorf("status %d", st)
		}
	}
	if u.Blocked() != 0 {
		t.Errorf("Blocked = %d after release", u.Blocked())
	}
}

func TestSSEFramings(t *testing.T) {
	u := start(t, "s")
	for _, tc := range []struct{ framing, eol string }{{"lf", "\n"}, {"crlf", "\r\n"}, {"cr", "\r"}} {
		req, _ := http.NewRequest("GET", u.URL()+"/sse", nil)
		req.Header.Set("X-Upstream-SSE-Framing", tc.framing)
		req.Header.Set("X-Upstream-SSE-Split", "3")
		req.Header.Set("X-Upstream-SSE-Param", "sessionid")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		if resp.Header.Get("Content-Type") != "text/event-stream" {
			t.Errorf("content type %q", resp.Header.Get("Content-Type"))
		}
		want := "event: endpoint" + tc.eol + "data: /messages?sessionid="
		buf := make([]byte, 0, 256)
		r := bufio.NewReader(resp.Body)
		for !strings.Contains(string(buf), want) && len(buf) < 256 {
			b, err := r.ReadByte()
			if err != nil {
				t.Fatalf("%s: %v after %q", tc.framing, err, buf)
			}
			buf = append(buf, b)
		}
		_ = resp.Body.Close()
		ids := u.SSESessions()
		if len(ids) == 0 || len(ids[len(ids)-1]) != 32 {
			t.Errorf("%s: session ids %v", tc.framing, ids)
		}
	}
}

func TestEmptyTrailersAndHealth(t *testing.T) {
	u := start(t, "e")
	resp, err := http.Get(u.URL() + "/empty")
	if err != nil {
		t.Fatal(err)
	}
	_ = resp.Body.Close()
	if resp.StatusCode != 204 {
		t.Errorf("/empty: %d", resp.StatusCode)
	}
	resp, err = http.Get(u.URL() + "/trailers")
	if err != nil {
		t.Fatal(err)
	}
	_, _ = io.ReadAll(resp.Body)
	_ = resp.Body.Close()
	if resp.Trailer.Get("X-Upstream-Trailer") != "e" {
		t.Errorf("trailer %v", resp.Trailer)
	}
	u.SetHealthy(false)
	resp, err = http.Get(u.URL() + "/healthz")
	if err != nil {
		t.Fatal(err)
	}
	_ = resp.Body.Close()
	if resp.StatusCode != 503 || u.Served() != 2 {
		t.Errorf("unhealthy /healthz %d, served %d (health checks excluded)", resp.StatusCode, u.Served())
	}
}
