// Package testutil holds the helpers every test in the module shares: Eventually (wait on a
// condition, never on a sleep), a manually advanced Clock, and small HTTP helpers for tests
// that talk to a real server on loopback. It is imported only by tests and by the
// <pkg>test fixture packages.
package testutil

import (
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tether-dev/tether/pkg/wire"
)

// DefaultWait is how long Eventually waits before it fails the test.
const DefaultWait = 30 * time.Second // generous: CI shares 2 cores, and a passing test never waits it out

// Eventually polls cond until it holds, starting at 1 ms between polls and backing off to
// 20 ms, and fails the test (t.Fatalf, so call it from the test's goroutine) if DefaultWait
// passes first. what names the condition in the failure message.
func Eventually(t testing.TB, what string, cond func() bool) {
	t.Helper()
	EventuallyWithin(t, DefaultWait, what, cond)
}

// EventuallyWithin is Eventually with its own limit d.
func EventuallyWithin(t testing.TB, d time.Duration, what string, cond func() bool) {
	t.Helper()
	if !Poll(d, cond) {
		t.Fatalf("timed out after %s waiting for %s", d, what)
	}
}

// Poll polls cond (as Eventually does) until it holds or d passes, and reports whether it held.
// Use it where the caller wants to report the failure itself.
func Poll(d time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(d)
	pause := time.Millisecond
	for !cond() {
		if time.Now().After(deadline) {
			return cond()
		}
		time.Sleep(pause)
		pause = min(2*pause, 20*time.Millisecond)
	}
	return true
}

// Clock is a manually advanced clock, safe for concurrent use. Its Now method fits every
// WithClock option in the module (func() time.Time). Use NewClock.
type Clock struct {
	mu  sync.Mutex
	now time.Time
}

// Epoch is a fixed, arbitrary start for clocks of tests that do not care which time it is.
var Epoch = time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)

// NewClock returns a clock stopped at start (Epoch if start is zero).
func NewClock(start time.Time) *Clock {
	if start.IsZero() {
		start = Epoch
	}
	return &Clock{now: start}
}

// Now returns the clock's time.
func (c *Clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

// Advance moves the clock forward by d and returns the new time.
func (c *Clock) Advance(d time.Duration) time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
	return c.now
}

// Set moves the clock to t.
func (c *Clock) Set(t time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = t
}

// Response is an HTTP answer read whole.
type Response struct {
	Status int
	Header http.Header
	Body   string
}

// Do sends a request (body "" for none; headers are name, value pairs, "Host" included) with
// http.DefaultClient and returns the whole answer; a transport error fails the test.
func Do(t testing.TB, method, url, body string, headers ...string) Response {
	t.Helper()
	r, err := Try(method, url, body, headers...)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// PostJSON posts a JSON body as tether's own API clients do (Content-Type application/json and
// wire.ClientHeader, without which pkg/api refuses a token-less write), like http.Post.
func PostJSON(url, body string) (*http.Response, error) {
	req, err := http.NewRequest(http.MethodPost, url, strings.NewReader(body))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set(wire.ClientHeader, "test")
	return http.DefaultClient.Do(req)
}

// Get is Do with GET and no body.
func Get(t testing.TB, url string, headers ...string) Response {
	t.Helper()
	return Do(t, http.MethodGet, url, "", headers...)
}

// Try is Do that returns the transport error instead of failing the test (for use from
// goroutines and inside Eventually conditions).
func Try(method, url, body string, headers ...string) (Response, error) {
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, err := http.NewRequest(method, url, rd)
	if err != nil {
		return Response{}, err
	}
	for i := 0; i+1 < len(headers); i += 2 {
		if http.CanonicalHeaderKey(headers[i]) == "Host" {
			req.Host = headers[i+1] // net/http sends req.Host, never a Host in req.Header
			continue
		}
		req.Header.Add(headers[i], headers[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return Response{}, err
	}
	defer func() { _ = resp.Body.Close() }()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return Response{}, fmt.Errorf("%s %s: reading the body: %w", method, url, err)
	}
	return Response{Status: resp.StatusCode, Header: resp.Header, Body: string(b)}, nil
}
