// Package client is a small client for a running tether's HTTP/JSON API (the SessionAPI, the
// admin endpoints and the operator endpoints). The CLI uses it; so can scripts and tests.
//
// A Client is safe for concurrent use. Requests and answers are protojson (the API's own
// encoding); an error answer becomes an *Error with the HTTP status and the API's
// errorCode/errorMessage.
package client

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	"github.com/tether-dev/tether/pkg/wire"
)

// MaxAnswer bounds how much of an answer the client reads (64 MiB).
const MaxAnswer = 64 << 20

// Client talks to one tether API listener.
type Client struct {
	base  string // "http://host:port"
	token string
	http  *http.Client
}

// Option configures a Client.
type Option func(*Client)

// WithToken sends token as "Authorization: Bearer TOKEN" on every request.
func WithToken(token string) Option { return func(c *Client) { c.token = token } }

// WithHTTPClient uses hc instead of a new http.Client (for TLS settings or timeouts).
func WithHTTPClient(hc *http.Client) Option { return func(c *Client) { c.http = hc } }

// New returns a client for addr: host:port (http is assumed) or an http(s) URL.
func New(addr string, opts ...Option) (*Client, error) {
	base := strings.TrimSuffix(addr, "/")
	if !strings.Contains(base, "://") {
		base = "http://" + base
	}
	u, err := url.Parse(base)
	if err != nil || u.Host == "" || (u.Scheme != "http" && u.Scheme != "https") {
		return nil, fmt.Errorf("address %q: want host:port or an http(s) URL", addr)
	}
	c := &Client{base: base, http: &http.Client{}}
	for _, o := range opts {
		o(c)
	}
	return c, nil
}

// Base returns the URL the client sends to, without a trailing slash.
func (c *Client) Base() string { return c.base }

// Error is an error answer of the API ({"errorCode","errorMessage"}).
type Error struct {
	Status  int
	Code    string
	Message string
}

func (e *Error) Error() string {
	return fmt.Sprintf("%s: %s (HTTP %d)", e.Code, e.Message, e.Status)
}

// Call sends body (nil for none) as protojson to path (with its query) and decodes a 2xx
// answer into out (nil to skip). Unknown fields in the answer are ignored, so an older client
// reads a newer server.
func (c *Client) Call(ctx context.Context, method, path string, body, out proto.Message) error {
	var rd io.Reader
	if body != nil {
		b, err := protojson.Marshal(body)
		if err != nil {
			return err
		}
		rd = bytes.NewReader(b)
	}
	b, err := c.Do(ctx, method, path, rd)
	if err != nil {
		return err
	}
	if out == nil {
		return nil
	}
	if err := (protojson.UnmarshalOptions{DiscardUnknown: true}).Unmarshal(b, out); err != nil {
		return fmt.Errorf("decoding the answer to %s %s: %w", method, path, err)
	}
	return nil
}

// Do sends body (nil for none; JSON when given) and returns a 2xx answer's body, or an *Error.
func (c *Client) Do(ctx context.Context, method, path string, body io.Reader) ([]byte, error) {
	req, err := http.NewRequestWithContext(ctx, method, c.base+path, body)
	if err != nil {
		return nil, err
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	req.Header.Set(wire.ClientHeader, "tether-client")
	if c.token != "" {
		req.Header.Set("Authorization", "Bearer "+c.token)
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return nil, err
	}
	defer func() { _ = resp.Body.Close() }() // the body is read below; a close error changes nothing
	b, err := io.ReadAll(io.LimitReader(resp.Body, MaxAnswer))
	if err != nil {
		return nil, err
	}
	if resp.StatusCode >= 300 {
		var e struct {
			ErrorCode    string `json:"errorCode"`
			ErrorMessage string `json:"errorMessage"`
		}
		if json.Unmarshal(b, &e) != nil || e.ErrorCode == "" {
			return nil, &Error{Status: resp.StatusCode, Code: http.StatusText(resp.StatusCode), Message: strings.TrimSpace(string(b))}
		}
		return nil, &Error{Status: resp.StatusCode, Code: e.ErrorCode, Message: e.ErrorMessage}
	}
	return b, nil
}
