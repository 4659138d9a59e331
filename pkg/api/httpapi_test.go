package api_test

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/tether-dev/tether/pkg/api"
	tetherv1 "github.com/tether-dev/tether/pkg/api/gen/tether/v1"
	"github.com/tether-dev/tether/pkg/registry"
	"github.com/tether-dev/tether/pkg/wire"
)

// reply is a finished HTTP response: what the tests read of it, the body returned beside it.
type reply struct {
	StatusCode int
	Header     http.Header
	Proto      string
	ProtoMajor int
}

// send makes one request and returns the response with its whole body (already closed).
func send(t *testing.T, method, url, body string) (reply, string) {
	t.Helper()
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set(wire.ClientHeader, "test")
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = resp.Body.Close() }()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return reply{StatusCode: resp.StatusCode, Header: resp.Header, Proto: resp.Proto, ProtoMajor: resp.ProtoMajor}, string(b)
}

func TestHTTPDetails(t *testing.T) {
	srv := startWorld(t)
	tests := []struct {
		name, method, path, body string
		status                   int
		contains                 string
	}{
		{"created session with location", "POST", "/v1/services/web/sessions", `{"ttl":"60s","attributes":{"k":"v"}}`, 201, `"ttl": "60s"`},
		{"friendly status filter", "GET", "/v1/services/web/sessions?status=active&limit=5", "", 200, `"sessions"`},
		{"enum status filter", "GET", "/v1/services/web/sessions?status=SESSION_STATUS_EXPIRED", "", 200, `"nextPageToken": ""`},
		{"bad status filter", "GET", "/v1/services/web/sessions?status=sleeping", "", 400, `"errorCode":"InvalidArgument"`},
		{"bad limit", "GET", "/v1/services/web/sessions?limit=ten", "", 400, `"errorCode":"InvalidArgument"`},
		{"malformed body", "POST", "/v1/services/web/sessions", `{"ttl":`, 400, `malformed JSON body`},
		{"unknown field", "POST", "/v1/services/web/sessions", `{"color":"red"}`, 400, `malformed JSON body`},
		{"body names another service", "POST", "/v1/services/web/sessions", `{"service":"hdr"}`, 400, `path names`},
		{"unknown endpoint", "GET", "/v2/things", "", 404, `"errorCode":"NotFound"`},
		{"state by word", "PUT", "/v1/services/web/instances/i2/state", `{"state":"standby"}`, 200, `"INSTANCE_STATE_STANDBY"`},
		{"state by enum name", "PUT", "/v1/services/web/instances/i2/state", `{"state":"INSTANCE_STATE_ACTIVE"}`, 200, `"INSTANCE_STATE_ACTIVE"`},
		{"bad state", "PUT", "/v1/services/web/instances/i2/state", `{"state":"asleep"}`, 400, `must be active, standby or draining`},
		{"get one instance", "GET", "/v1/services/web/instances/i1", "", 200, `"sessionCapacity": 20`},
		{"get unknown instance", "GET", "/v1/services/web/instances/i7", "", 404, `"errorCode":"NotFound"`},
		{"drain without body", "POST", "/v1/services/hdr/instances/i1/drain", "", 200, `"drained": true`},
		{"service details", "GET", "/v1/services/tiny", "", 200, `"sessionsPerInstance": 1`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			resp, body := send(t, tc.method, srv.URL+tc.path, tc.body)
			if resp.StatusCode != tc.status || !strings.Contains(body, tc.contains) {
				t.Errorf("%s %s = %d %s; want %d containing %s", tc.method, tc.path, resp.StatusCode, body, tc.status, tc.contains)
			}
			if resp.StatusCode == 201 && !strings.HasPrefix(resp.Header.Get("Location"), "/v1/services/web/sessions/") {
				t.Errorf("201 without a Location: %v", resp.Header)
			}
		})
	}

	t.Run("no capacity is 503 with Retry-After", func(t *testing.T) {
		if resp, body := send(t, "POST", srv.URL+"/v1/services/tiny/sessions", ""); resp.StatusCode != 201 {
			t.Fatalf("first session: %d %s", resp.StatusCode, body)
		}
		resp, body := send(t, "POST", srv.URL+"/v1/services/tiny/sessions", "")
		if resp.StatusCode != 503 || resp.Header.Get("Retry-After") != "1" || !strings.Contains(body, `"errorCode":"NoCapacity"`) || !strings.Contains(body, `"status":"Unavailable"`) {
			t.Errorf("full service: %d %s Retry-After %q; want 503 NoCapacity (status Unavailable) with Retry-After 1", resp.StatusCode, body, resp.Header.Get("Retry-After"))
		}
	})
}

// TestOneListener checks that one listener serves gRPC (h2c, grpc-go with insecure
// credentials) and HTTP/1.1 JSON side by side, on the same server state.
func TestOneListener(t *testing.T) {
	srv := startWorld(t)
	conn := srv.Dial(t)
	gc := tetherv1.NewSessionServiceClient(conn)
	created, err := gc.CreateSession(context.Background(), &tetherv1.CreateSessionRequest{Service: "hdr", SessionId: "both-ways"})
	if err != nil {
		t.Fatalf("gRPC create: %v", err)
	}
	resp, body := send(t, "GET", srv.URL+"/v1/services/hdr/sessions/both-ways", "")
	if resp.StatusCode != 200 || resp.ProtoMajor != 1 || !strings.Contains(body, `"instance": "`+created.GetSession().GetInstance()+`"`) {
		t.Errorf("HTTP/1.1 get of the gRPC-created session = %s %d %s", resp.Proto, resp.StatusCode, body)
	}
	resp, _ = send(t, "GET", srv.URL+"/healthz", "")
	if resp.StatusCode != 200 {
		t.Errorf("healthz = %d", resp.StatusCode)
	}
}

func TestWithoutEngine(t *testing.T) {
	reg := registry.New()
	if err := reg.Apply(world()); err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewServer(api.NewAdminHandler(reg))
	defer hs.Close()
	resp, body := send(t, "POST", hs.URL+"/v1/services/web/sessions", "")
	if resp.StatusCode != 503 || !strings.Contains(body, `"errorCode":"Unavailable"`) {
		t.Errorf("create without engine = %d %s, want 503 Unavailable", resp.StatusCode, body)
	}
	resp, body = send(t, "POST", hs.URL+"/v1/services/web/instances/i1/drain", `{"timeout":"10s"}`)
	if resp.StatusCode != 200 || !strings.Contains(body, `"drained": false`) || !strings.Contains(body, "INSTANCE_STATE_DRAINING") {
		t.Errorf("drain without engine = %d %s, want the state set and drained false", resp.StatusCode, body)
	}
}
