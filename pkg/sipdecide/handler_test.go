package sipdecide_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/tether-dev/tether/pkg/affinity"
	"github.com/tether-dev/tether/pkg/dcr/dcrtest"
	"github.com/tether-dev/tether/pkg/registry"
	"github.com/tether-dev/tether/pkg/sipdecide"
	"github.com/tether-dev/tether/pkg/wire"
)

// stubDecision is the narrow fake used only to test the handler's mapping of engine answers;
// the behaviour of real decisions is covered by the integration tests over the real engine.
type stubDecision struct {
	inst  registry.Instance
	ended *atomic.Int32
}

func (d stubDecision) Instance() registry.Instance                       { return d.inst }
func (stubDecision) SessionID() string                                   { return "" }
func (stubDecision) NewSession() bool                                    { return false }
func (stubDecision) OnResponse(affinity.Response) []affinity.HeaderValue { return nil }
func (stubDecision) OnExpire(affinity.Expirer)                           {}
func (stubDecision) WantsResponseBody() bool                             { return false }
func (stubDecision) LearnSession(string) error                           { return nil }
func (d stubDecision) End()                                              { d.ended.Add(1) }
func (d stubDecision) HandOff(context.Context) error                     { d.End(); return nil }

type stubDecider struct {
	inst  registry.Instance
	err   error
	ended atomic.Int32
	got   chan affinity.Request
	// parsed receives the parsed message's method and Call-ID ("" without one), read during
	// Decide: the handler releases the message when it has answered.
	parsed chan string
}

func (s *stubDecider) Decide(_ context.Context, req affinity.Request) (affinity.Decision, error) {
	if s.got != nil {
		// The handler reuses the body's buffer and the parsed message once Decide returns (see
		// Decider).
		req.SIPMessage = bytes.Clone(req.SIPMessage)
		if s.parsed != nil {
			parsed := ""
			if req.SIP != nil {
				parsed = req.SIP.Method() + " " + req.SIP.CallID()
			}
			s.parsed <- parsed
		}
		req.SIP = nil
		s.got <- req
	}
	if s.err != nil {
		return nil, s.err
	}
	return stubDecision{inst: s.inst, ended: &s.ended}, nil
}

func post(t *testing.T, h http.Handler, target string, body string, hdr map[string]string) *httptest.ResponseRecorder {
	t.Helper()
	var r io.Reader
	if body != "" {
		r = strings.NewReader(body)
	}
	req := httptest.NewRequest(http.MethodPost, target, r)
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	return rec
}

func readAll(t *testing.T, r *http.Response) string {
	t.Helper()
	b, err := io.ReadAll(r.Body)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func TestHandlerAnswer(t *testing.T) {
	tests := []struct {
		name string
		inst registry.Instance
		opts []sipdecide.Option
		want string
	}{
		{"ipv4", registry.Instance{ID: "a", Address: "10.0.0.1", SIPPort: 5070}, nil, "sip:10.0.0.1:5070"},
		{"ipv6", registry.Instance{ID: "b", Address: "2001:db8::1", SIPPort: 5060}, nil, "sip:[2001:db8::1]:5060"},
		{"transport", registry.Instance{ID: "c", Address: "127.0.0.1", SIPPort: 5080}, []sipdecide.Option{sipdecide.WithTransport("tcp")}, "sip:127.0.0.1:5080;transport=tcp"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d := &stubDecider{inst: tt.inst, got: make(chan affinity.Request, 1), parsed: make(chan string, 1)}
			h := sipdecide.NewHandler(d, tt.opts...)
			raw := string(dcrtest.SIP(dcrtest.Request{}))
			rec := post(t, h, "/v1/sip/voice/decide", raw, map[string]string{wire.SIPSourceHeader: "192.0.2.7:5060"})
			if rec.Code != http.StatusOK {
				t.Fatalf("status %d: %s", rec.Code, rec.Body)
			}
			if got := rec.Body.String(); got != tt.want {
				t.Errorf("body = %q, want %q", got, tt.want)
			}
			if got := rec.Header().Get(wire.SIPInstanceHeader); got != tt.inst.ID {
				t.Errorf("%s = %q", wire.SIPInstanceHeader, got)
			}
			if n := d.ended.Load(); n != 1 {
				t.Errorf("End called %d times, want 1", n)
			}
			got := <-d.got
			want := affinity.Request{Service: "voice", Protocol: affinity.ProtocolSIP, Peer: "192.0.2.7:5060", SIPMessage: []byte(raw)}
			if diff := cmp.Diff(want, got); diff != "" {
				t.Errorf("request (-want +got):\n%s", diff)
			}
			// The message the engine gets is parsed once, here.
			if p := <-d.parsed; p != "INVITE call-1@example.com" {
				t.Errorf("parsed message %q, want the INVITE of call-1@example.com", p)
			}
		})
	}
}

func TestHandlerServiceHeaderAndFields(t *testing.T) {
	d := &stubDecider{inst: registry.Instance{ID: "a", Address: "127.0.0.1", SIPPort: 5070}, got: make(chan affinity.Request, 1)}
	h := sipdecide.NewHandler(d)
	target := "/v1/sip/decide?method=INVITE&ruri=sip%3Abob%40example.com&from=%3Csip%3Aalice%40example.com%3E%3Btag%3Dt1&to=%3Csip%3Abob%40example.com%3E&callid=c-1&pai=%3Ctel%3A%2B1%3E"
	rec := post(t, h, target, "", map[string]string{wire.SIPServiceHeader: "voice"})
	if rec.Code != http.StatusOK {
		t.Fatalf("status %d: %s", rec.Code, rec.Body)
	}
	want := affinity.Request{
		Service: "voice", Protocol: affinity.ProtocolSIP, Method: "INVITE", Path: "sip:bob@example.com",
		Headers: map[string][]string{
			"from": {"<sip:alice@example.com>;tag=t1"}, "to": {"<sip:bob@example.com>"},
			"call-id": {"c-1"}, "p-asserted-identity": {"<tel:+1>"},
		},
	}
	if diff := cmp.Diff(want, <-d.got); diff != "" {
		t.Errorf("request (-want +got):\n%s", diff)
	}
}

func TestHandlerErrors(t *testing.T) {
	inst := registry.Instance{ID: "a", Address: "127.0.0.1", SIPPort: 5070}
	raw := string(dcrtest.SIP(dcrtest.Request{}))
	tests := []struct {
		name       string
		method     string
		target     string
		body       string
		hdr        map[string]string
		err        error
		inst       registry.Instance
		wantStatus int
		wantCode   string
		wantRetry  string
		wantEnded  int32
	}{
		{name: "no capacity", err: &affinity.Reject{Class: affinity.ClassNoCapacity, Code: "NoCapacity", Message: "none", RetryAfter: 2 * time.Second},
			wantStatus: 503, wantCode: "NoCapacity", wantRetry: "2"},
		{name: "no capacity without hint", err: &affinity.Reject{Class: affinity.ClassNoCapacity, Code: "NoCapacity", Message: "none"},
			wantStatus: 503, wantCode: "NoCapacity", wantRetry: "1"},
		{name: "too many requests", err: &affinity.Reject{Class: affinity.ClassTooManyRequests, Code: "ResourceExhausted", RetryAfter: 1500 * time.Millisecond},
			wantStatus: 429, wantCode: "ResourceExhausted", wantRetry: "2"},
		{name: "unknown service", err: &affinity.Reject{Class: affinity.ClassNoService, Code: "ServiceNotFound"},
			wantStatus: 404, wantCode: "ServiceNotFound"},
		{name: "bad message", err: fmtWrap(&affinity.Reject{Class: affinity.ClassBadRequest, Code: "InvalidSIPMessage"}),
			wantStatus: 400, wantCode: "InvalidSIPMessage"},
		{name: "internal error", err: errors.New("boom"), wantStatus: 500, wantCode: "InternalServerError"},
		{name: "instance without SIP port", inst: registry.Instance{ID: "h", Address: "127.0.0.1", HTTPPort: 80},
			wantStatus: 503, wantCode: "NoSIPEndpoint", wantRetry: "1", wantEnded: 1},
		{name: "GET", method: http.MethodGet, wantStatus: 405, wantCode: "MethodNotAllowed"},
		{name: "bad path", target: "/v1/sip/a/b/decide", wantStatus: 404, wantCode: "NotFound"},
		{name: "other path", target: "/v1/other", wantStatus: 404, wantCode: "NotFound"},
		{name: "no service", target: "/v1/sip/decide", wantStatus: 404, wantCode: "ServiceNotFound"},
		{name: "empty body without fields", body: "-", wantStatus: 400, wantCode: "MissingFields"},
		{name: "fields without from or callid", target: "/v1/sip/voice/decide?method=INVITE&ruri=sip:a@b", body: "-", wantStatus: 400, wantCode: "MissingFields"},
		{name: "too large", body: strings.Repeat("x", sipdecide.MaxMessageSize+1), wantStatus: 413, wantCode: "MessageTooLarge"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if tt.inst.ID == "" {
				tt.inst = inst
			}
			d := &stubDecider{inst: tt.inst, err: tt.err}
			h := sipdecide.NewHandler(d)
			method, target, body := tt.method, tt.target, tt.body
			if method == "" {
				method = http.MethodPost
			}
			if target == "" {
				target = "/v1/sip/voice/decide"
			}
			switch body {
			case "":
				body = raw
			case "-":
				body = ""
			}
			req := httptest.NewRequest(method, target, strings.NewReader(body))
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, req)
			resp := rec.Result()
			text := readAll(t, resp)
			if resp.StatusCode != tt.wantStatus {
				t.Errorf("status = %d, want %d (%s)", resp.StatusCode, tt.wantStatus, text)
			}
			var eb wire.ErrorBody
			if err := json.Unmarshal([]byte(text), &eb); err != nil || eb.ErrorCode != tt.wantCode {
				t.Errorf("body = %q (%v), want errorCode %q", text, err, tt.wantCode)
			}
			if ct := resp.Header.Get("Content-Type"); ct != "application/json" {
				t.Errorf("Content-Type = %q, want application/json", ct)
			}
			if got := resp.Header.Get("Retry-After"); got != tt.wantRetry {
				t.Errorf("Retry-After = %q, want %q", got, tt.wantRetry)
			}
			if n := d.ended.Load(); n != tt.wantEnded {
				t.Errorf("End called %d times, want %d", n, tt.wantEnded)
			}
		})
	}
}

func fmtWrap(err error) error { return errors.Join(errors.New("wrapped"), err) }

func TestStatusOf(t *testing.T) {
	for c, want := range map[affinity.Class]int{
		affinity.ClassBadRequest: 400, affinity.ClassNotFound: 404, affinity.ClassConflict: 409,
		affinity.ClassTooManyRequests: 429, affinity.ClassNoCapacity: 503, affinity.ClassNoService: 404,
		affinity.Class(0): 500,
	} {
		if got := sipdecide.StatusOf(c); got != want {
			t.Errorf("StatusOf(%d) = %d, want %d", c, got, want)
		}
	}
}
