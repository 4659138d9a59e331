package e2e_test

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"testing"

	"github.com/tether-dev/tether/internal/e2e"
	"github.com/tether-dev/tether/internal/testutil"
	"github.com/tether-dev/tether/pkg/api/apitest"
	"github.com/tether-dev/tether/pkg/api/client"
	tetherv1 "github.com/tether-dev/tether/pkg/api/gen/tether/v1"
	"github.com/tether-dev/tether/pkg/registry"
)

const userRules = `<?xml version="1.0" encoding="UTF-8"?>
<user-centric-rules>
  <http-rules>
    <header name="X-User" return="request.X-User"><exist/></header>
  </http-rules>
</user-centric-rules>
`

// TestRingLookupNamesTheInstanceAnHTTPRequestReaches: for a converged hash service whose DCR
// rule keys HTTP requests on X-User, the SessionAPI's ring lookup (what `tether ring lookup`
// prints) names, for each of 12 users, the instance that a real HTTP request with that
// X-User then reaches through the data plane.
func TestRingLookupNamesTheInstanceAnHTTPRequestReaches(t *testing.T) {
	forEachKind(t, func(t *testing.T, kind e2e.Kind) {
		rules := filepath.Join(t.TempDir(), "rules.xml")
		if err := os.WriteFile(rules, []byte(userRules), 0o600); err != nil {
			t.Fatal(err)
		}
		svc := service("conv", registry.AffinityHash)
		svc.DCRFile = rules
		e := e2e.Start(t, kind, []registry.Service{svc}, map[string][]e2e.Instance{"conv": instances("c1", "c2", "c3")})
		api := apitest.Serve(t, e.Fixture)
		c, err := client.New(api.Addr)
		if err != nil {
			t.Fatal(err)
		}
		lookup := func(user string) string {
			out := &tetherv1.LookupRingResponse{}
			if err := c.Call(context.Background(), http.MethodGet, "/v1/services/conv/ring?key="+user, nil, out); err != nil {
				t.Fatal(err)
			}
			return out.GetInstance().GetId()
		}
		hc := newClient(t, false)
		var mismatch string
		seen := map[string]bool{}
		// The DCR file loads in the background; until then requests key on the peer address.
		testutil.Eventually(t, "every user's request to reach the instance the ring lookup names", func() bool {
			mismatch = ""
			for i := range 12 {
				user := fmt.Sprintf("user-%d", i)
				want := lookup(user)
				r := do(t, hc, "GET", e.DP.URL()+"/profile", "X-User", user)
				if r.status != 200 || r.instance != want {
					mismatch = fmt.Sprintf("%s: lookup %s, request reached %q (%d)", user, want, r.instance, r.status)
					return false
				}
				seen[want] = true
			}
			return true
		})
		if mismatch != "" {
			t.Fatal(mismatch)
		}
		if len(seen) < 2 {
			t.Errorf("12 users all on %v: the check proves little", seen)
		}
		e.WaitSlotsReleased(t)
	})
}
