package wire_test

import (
	"net/http"
	"testing"
	"time"

	"github.com/tether-dev/tether/pkg/wire"
)

func TestRetryAfterSeconds(t *testing.T) {
	for _, tc := range []struct {
		in   time.Duration
		want int64
	}{
		{0, 1}, {-time.Second, 1}, {time.Millisecond, 1}, {time.Second, 1},
		{time.Second + time.Nanosecond, 2}, {1500 * time.Millisecond, 2}, {30 * time.Second, 30},
	} {
		if got := wire.RetryAfterSeconds(tc.in); got != tc.want {
			t.Errorf("RetryAfterSeconds(%v) = %d, want %d", tc.in, got, tc.want)
		}
	}
}

func TestLookup(t *testing.T) {
	if len(wire.Classes()) != 6 {
		t.Fatalf("Classes() = %v", wire.Classes())
	}
	for _, c := range wire.Classes() {
		r := wire.Lookup(c)
		if r.HTTPStatus < 400 || r.HTTPStatus > 599 || r.Code == "" || http.StatusText(r.HTTPStatus) == "" {
			t.Errorf("%v: %+v", c, r)
		}
		if r.Retryable != (r.HTTPStatus == 429 || r.HTTPStatus == 503) {
			t.Errorf("%v: retryable %v with status %d", c, r.Retryable, r.HTTPStatus)
		}
	}
	if r := wire.Lookup(0); r.HTTPStatus != 500 {
		t.Errorf("Lookup(0) = %+v, want the internal row", r)
	}
	if r := wire.Lookup(99); r.HTTPStatus != 500 {
		t.Errorf("Lookup(99) = %+v, want the internal row", r)
	}
}
