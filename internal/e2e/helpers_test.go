package e2e_test

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/cookiejar"
	"strings"
	"testing"
	"time"

	"github.com/tether-dev/tether/internal/e2e"
	"github.com/tether-dev/tether/internal/upstream"
	"github.com/tether-dev/tether/pkg/affinity/affinitytest"
	"github.com/tether-dev/tether/pkg/registry"
)

// forEachKind runs body once per data plane kind, as subtests.
func forEachKind(t *testing.T, body func(t *testing.T, kind e2e.Kind)) {
	t.Helper()
	for _, k := range e2e.Kinds() {
		t.Run(string(k), func(t *testing.T) { body(t, k) })
	}
}

// newClient returns an HTTP client that opens a fresh connection per request (so routing is
// driven by what the request carries, never by connection reuse), with a cookie jar when jar.
func newClient(t *testing.T, jar bool) *http.Client {
	t.Helper()
	c := &http.Client{
		Transport: &http.Transport{DisableKeepAlives: true, MaxConnsPerHost: 0},
		Timeout:   30 * time.Second,
	}
	if jar {
		j, err := cookiejar.New(nil)
		if err != nil {
			t.Fatal(err)
		}
		c.Jar = j
	}
	t.Cleanup(c.CloseIdleConnections)
	return c
}

// result is what a test needs from one response.
type result struct {
	status   int
	instance string
	header   http.Header
	body     string
}

func do(t *testing.T, c *http.Client, method, url string, hdr ...string) result {
	t.Helper()
	r, err := doCtx(context.Background(), c, method, url, hdr...)
	if err != nil {
		t.Fatalf("%s %s: %v", method, url, err)
	}
	return r
}

func doCtx(ctx context.Context, c *http.Client, method, url string, hdr ...string) (result, error) {
	req, err := http.NewRequestWithContext(ctx, method, url, nil)
	if err != nil {
		return result{}, err
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Add(hdr[i], hdr[i+1])
	}
	resp, err := c.Do(req)
	if err != nil {
		return result{}, err
	}
	defer func() { _ = resp.Body.Close() }()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return result{}, err
	}
	return result{status: resp.StatusCode, instance: resp.Header.Get(upstream.InstanceHeader), header: resp.Header, body: string(b)}, nil
}

// setCookie returns the value of cookie name among a response's Set-Cookie headers.
func setCookie(h http.Header, name string) string {
	for _, c := range (&http.Response{Header: h}).Cookies() {
		if c.Name == name {
			return c.Value
		}
	}
	return ""
}

// errorBody decodes tether's JSON rejection body.
func errorBody(t *testing.T, r result) (code string) {
	t.Helper()
	var b struct {
		ErrorCode    string `json:"errorCode"`
		ErrorMessage string `json:"errorMessage"`
	}
	if err := json.Unmarshal([]byte(r.body), &b); err != nil {
		t.Fatalf("body %q is not tether's JSON error: %v", r.body, err)
	}
	if !strings.HasPrefix(r.header.Get("Content-Type"), "application/json") || b.ErrorMessage == "" {
		t.Errorf("rejection %d: content-type %q, message %q", r.status, r.header.Get("Content-Type"), b.ErrorMessage)
	}
	return b.ErrorCode
}

func instances(ids ...string) []e2e.Instance {
	out := make([]e2e.Instance, len(ids))
	for i, id := range ids {
		out[i] = e2e.Instance{ID: id}
	}
	return out
}

func service(name string, mode registry.AffinityMode) registry.Service {
	return affinitytest.Service(name, mode)
}
