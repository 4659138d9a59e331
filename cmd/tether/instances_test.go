package main

import (
	"strings"
	"testing"

	tetherv1 "github.com/tether-dev/tether/pkg/api/gen/tether/v1"
)

func TestInstancesCLI(t *testing.T) {
	srv := cliServer(t)
	if code, _, stderr := cli(t, srv, "sessions", "create", "-s", "web"); code != 0 {
		t.Fatalf("create: %s", stderr)
	}

	code, out, stderr := cli(t, srv, "instances", "list", "-s", "web")
	want := "" +
		"ID  ADDRESS    HTTP  SIP   WEIGHT  ZONE  STATE   HEALTH   SESSIONS  REQUESTS\n" +
		"i1  127.0.0.1  8001  5061  1       -     active  unknown  1/20      0/200\n" +
		"i2  127.0.0.1  8002  5062  1       -     active  unknown  0/20      0/200\n"
	if code != 0 || out != want {
		t.Errorf("list table: exit %d %q\n%s\nwant\n%s", code, stderr, out, want)
	}
	code, out, _ = cli(t, srv, "instances", "list", "-s", "web", "-o", "json")
	list := decodeJSON[tetherv1.ListInstancesResponse](t, out)
	if code != 0 || len(list.GetInstances()) != 2 || list.GetInstances()[0].GetSessions() != 1 || list.GetInstances()[0].GetSessionCapacity() != 20 {
		t.Errorf("list json: exit %d %v", code, list)
	}

	code, out, stderr = cli(t, srv, "instances", "state", "-s", "web", "i2", "standby")
	if code != 0 || !strings.Contains(out, "i2  127.0.0.1  8002  5062  1       -     standby") {
		t.Errorf("state standby: exit %d %q\n%s", code, stderr, out)
	}
	code, out, _ = cli(t, srv, "instances", "state", "-s", "web", "i2", "active", "-o", "json")
	if in := decodeJSON[tetherv1.Instance](t, out); code != 0 || in.GetState() != tetherv1.InstanceState_INSTANCE_STATE_ACTIVE {
		t.Errorf("state active json: exit %d %v", code, in)
	}

	code, out, stderr = cli(t, srv, "instances", "health", "-s", "web", "i2", "unhealthy")
	if code != 0 || !strings.Contains(out, "i2  127.0.0.1  8002  5062  1       -     active  unhealthy") {
		t.Errorf("health unhealthy: exit %d %q\n%s", code, stderr, out)
	}
	code, out, _ = cli(t, srv, "instances", "health", "-s", "web", "i2", "unknown", "-o", "json")
	if in := decodeJSON[tetherv1.Instance](t, out); code != 0 || in.GetHealth() != tetherv1.InstanceHealth_INSTANCE_HEALTH_UNKNOWN {
		t.Errorf("health unknown json: exit %d %v", code, in)
	}

	// i2 holds nothing: drained at once.
	code, out, stderr = cli(t, srv, "instances", "drain", "-s", "web", "i2")
	if code != 0 || !strings.Contains(out, "instance i2 of service web is drained\n") || !strings.Contains(out, " draining ") {
		t.Errorf("drain empty: exit %d %q\n%s", code, stderr, out)
	}
	// i1 holds a session: not drained within the timeout, exit 1 saying what is left.
	code, out, stderr = cli(t, srv, "instances", "drain", "-s", "web", "i1", "--timeout", "100ms", "-o", "json")
	resp := decodeJSON[tetherv1.DrainInstanceResponse](t, out)
	if code != 1 || resp.GetDrained() || resp.GetInstance().GetSessions() != 1 ||
		!strings.Contains(stderr, "instance i1 of service web is draining but not drained after 100ms (1 sessions, 0 requests left)") {
		t.Errorf("drain busy: exit %d %q %v", code, stderr, resp)
	}
	// --timeout 0 only sets the state.
	if code, _, stderr := cli(t, srv, "instances", "drain", "-s", "web", "i1", "--timeout", "0"); code != 0 {
		t.Errorf("drain --timeout 0: exit %d %q", code, stderr)
	}

	for _, tc := range []struct {
		args       []string
		wantCode   int
		wantStderr string
	}{
		{[]string{"instances", "state", "-s", "web", "i1", "asleep"}, 2, `state "asleep": want active, standby or draining`},
		{[]string{"instances", "state", "-s", "web", "i9", "active"}, 1, "NotFound"},
		{[]string{"instances", "health", "-s", "web", "i1", "sickly"}, 2, `health "sickly": want healthy, unhealthy or unknown`},
		{[]string{"instances", "list", "-s", "nope"}, 1, `unknown service "nope" (tether status lists the services)`},
		{[]string{"instances", "drain", "-s", "web"}, 2, "usage: tether instances drain -s SERVICE ID"},
		{[]string{"instances", "drain", "-s", "web", "i1", "--timeout", "-1s"}, 1, "negative"},
		{[]string{"instances", "help"}, 0, ""},
	} {
		code, _, stderr := cli(t, srv, tc.args...)
		if code != tc.wantCode || !strings.Contains(stderr, tc.wantStderr) {
			t.Errorf("%q: exit %d %q; want %d with %q", tc.args, code, stderr, tc.wantCode, tc.wantStderr)
		}
	}
}
