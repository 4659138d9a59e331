package testutil_test

import (
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tether-dev/tether/internal/testutil"
)

func TestEventuallyWaitsForTheCondition(t *testing.T) {
	var n atomic.Int32
	go func() {
		for range 5 {
			n.Add(1)
		}
	}()
	testutil.Eventually(t, "five increments", func() bool { return n.Load() == 5 })
}

func TestPollGivesUp(t *testing.T) {
	start := time.Now()
	if testutil.Poll(30*time.Millisecond, func() bool { return false }) {
		t.Fatal("Poll reported a condition that never held")
	}
	if time.Since(start) < 30*time.Millisecond {
		t.Error("Poll gave up before its limit")
	}
}

func TestClock(t *testing.T) {
	c := testutil.NewClock(time.Time{})
	if !c.Now().Equal(testutil.Epoch) {
		t.Fatalf("zero start: %v, want Epoch", c.Now())
	}
	if got := c.Advance(time.Minute); !got.Equal(testutil.Epoch.Add(time.Minute)) || !c.Now().Equal(got) {
		t.Fatalf("Advance: %v", got)
	}
	at := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	c.Set(at)
	if !c.Now().Equal(at) {
		t.Fatalf("Set: %v", c.Now())
	}
}

func TestDo(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("X-Echo", r.Header.Get("X-In"))
		w.WriteHeader(http.StatusTeapot)
		_, _ = w.Write([]byte(r.Method))
	}))
	defer srv.Close()
	r := testutil.Do(t, http.MethodPost, srv.URL, "x", "X-In", "v")
	if r.Status != http.StatusTeapot || r.Body != "POST" || r.Header.Get("X-Echo") != "v" {
		t.Fatalf("got %+v", r)
	}
	if _, err := testutil.Try(http.MethodGet, "http://127.0.0.1:1/", ""); err == nil {
		t.Error("Try to a closed port succeeded")
	}
}
