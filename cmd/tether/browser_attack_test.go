package main

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"testing"
	"time"

	"github.com/tether-dev/tether/pkg/api/client"
	tetherv1 "github.com/tether-dev/tether/pkg/api/gen/tether/v1"
)

// TestBrowserCannotDriveTheAPI is the regression test for issue 25's finding 1: the attacks of
// pkg/ui/web/attack-test.mjs, in Debian's chromium through playwright-core, against a real
// token-less tether on loopback (the quickstart's setup). A page on another origin sends
// no-cors text/plain POSTs to drain i0 and register evil-1; a DNS-rebinding page (Host:
// attacker.example:PORT, same-origin with the API) reads /v1/status and its stream and sets
// i1 to standby. After: every request is refused (403) and nothing changed; the dashboard's own
// calls keep working (TestDashboardInBrowser).
func TestBrowserCannotDriveTheAPI(t *testing.T) {
	browserTool(t, "/usr/bin/chromium", "Debian package chromium")
	browserTool(t, "../../pkg/ui/web/node_modules/playwright-core", "npm ci in pkg/ui/web")
	node, err := exec.LookPath("node")
	if err != nil {
		t.Fatal("node not found")
	}
	info := startServe(t, testConfig(upstreamPort(t), upstreamPort(t)))
	c, err := client.New(info.apiAddr)
	if err != nil {
		t.Fatal(err)
	}
	waitHealthy(t, c)

	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, node, "attack-test.mjs")
	cmd.Dir = "../../pkg/ui/web"
	cmd.Env = append(os.Environ(), "API_URL=http://"+info.apiAddr, "DRAIN_ID=i0", "STANDBY_ID=i1")
	cmd.Stderr = os.Stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("attack script: %v\n%s", err, out)
	}
	t.Logf("browser saw: %s", out)
	var seen struct {
		CSRF struct {
			Sent []string `json:"sent"`
		} `json:"csrf"`
		Rebinding struct {
			NavigationStatus int  `json:"navigationStatus"`
			StatusCode       int  `json:"statusCode"`
			ReadServices     bool `json:"readServices"`
			PutStatus        int  `json:"putStatus"`
			StreamStatus     int  `json:"streamStatus"`
		} `json:"rebinding"`
	}
	if err := json.Unmarshal(out, &seen); err != nil {
		t.Fatalf("attack script output: %v\n%s", err, out)
	}
	if len(seen.CSRF.Sent) != 2 || seen.CSRF.Sent[0] != "drain" || seen.CSRF.Sent[1] != "register" {
		t.Fatalf("the cross-origin page did not send both requests: %v", seen.CSRF.Sent)
	}

	// What the attacks changed, seen through the API.
	for id, want := range map[string]tetherv1.InstanceState{"i0": tetherv1.InstanceState_INSTANCE_STATE_ACTIVE, "i1": tetherv1.InstanceState_INSTANCE_STATE_ACTIVE} {
		in := &tetherv1.Instance{}
		if err := c.Call(context.Background(), "GET", "/v1/services/web/instances/"+id, nil, in); err != nil {
			t.Fatal(err)
		}
		if in.GetState() != want {
			t.Errorf("instance %s is %v after the attacks, want %v", id, in.GetState(), want)
		}
	}
	list := &tetherv1.ListInstancesResponse{}
	if err := c.Call(context.Background(), "GET", "/v1/services/web/instances", nil, list); err != nil {
		t.Fatal(err)
	}
	for _, in := range list.GetInstances() {
		if in.GetId() == "evil-1" {
			t.Errorf("the cross-origin page registered instance evil-1 (%s:%d)", in.GetAddress(), in.GetHttpPort())
		}
	}
	rb := seen.Rebinding
	if rb.ReadServices {
		t.Errorf("the rebinding page read /v1/status (HTTP %d)", rb.StatusCode)
	}
	for what, code := range map[string]int{"navigation to /v1/status": rb.NavigationStatus, "fetch /v1/status": rb.StatusCode,
		"PUT state": rb.PutStatus, "status stream": rb.StreamStatus} {
		if code != 403 {
			t.Errorf("rebinding page's %s: HTTP %d, want 403", what, code)
		}
	}
}
