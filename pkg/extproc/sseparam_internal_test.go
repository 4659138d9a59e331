package extproc

import (
	"context"
	"testing"

	"github.com/tether-dev/tether/pkg/affinity/affinitytest"
	"github.com/tether-dev/tether/pkg/registry"
)

// TestSSESessionParamFromService: the endpoint parser reads exactly the query parameter the
// service configures, taken from the real engine's decision, even when the URI also carries
// another parameter that one of the default names would match first.
func TestSSESessionParamFromService(t *testing.T) {
	for _, param := range []string{"sessionId", "session_id", "sessionid"} {
		t.Run(param, func(t *testing.T) {
			svc := affinitytest.Service("mcp", registry.AffinityMCPSSE)
			svc.SSE.SessionParam = param
			f := affinitytest.New(t, []registry.Service{svc}, affinitytest.Instances("mcp", 2))
			d, err := f.Engine.Decide(context.Background(), affinitytest.HTTP("mcp", "GET", "/sse"))
			if err != nil {
				t.Fatal(err)
			}
			defer d.End()
			if !d.WantsResponseBody() {
				t.Fatal("the SSE GET must ask for its response body")
			}
			// Every default name is present; only the configured one carries the real id.
			data := map[string]string{
				"sessionId":  "/messages?session_id=decoy-2&sessionid=decoy-3&sessionId=real",
				"session_id": "/messages?sessionId=decoy-1&sessionid=decoy-3&session_id=real",
				"sessionid":  "/messages?sessionId=decoy-1&session_id=decoy-2&sessionid=real",
			}[param]
			gotParam, id := sessionIDFromEndpoint(data, d)
			if gotParam != param || id != "real" {
				t.Errorf("parsed (%q, %q), want (%q, %q)", gotParam, id, param, "real")
			}
		})
	}
}
