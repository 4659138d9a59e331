package api_test

import (
	"context"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/testing/protocmp"

	"github.com/tether-dev/tether/pkg/affinity/affinitytest"
	"github.com/tether-dev/tether/pkg/api/apitest"
	tetherv1 "github.com/tether-dev/tether/pkg/api/gen/tether/v1"
	"github.com/tether-dev/tether/pkg/registry"
)

const (
	active   = tetherv1.InstanceState_INSTANCE_STATE_ACTIVE
	standby  = tetherv1.InstanceState_INSTANCE_STATE_STANDBY
	draining = tetherv1.InstanceState_INSTANCE_STATE_DRAINING
	unknownH = tetherv1.InstanceHealth_INSTANCE_HEALTH_UNKNOWN
)

func TestInstances(t *testing.T) {
	forEachTransport(t, func(t *testing.T, tr transport) {
		srv := startWorld(t)
		c := tr.new(t, srv, "")
		ctx := context.Background()

		var onI1 []string
		for range 3 {
			s, err := c.CreateSession(ctx, &tetherv1.CreateSessionRequest{Service: "web"})
			if err != nil {
				t.Fatal(err)
			}
			if s.GetInstance() == "i1" {
				onI1 = append(onI1, s.GetId())
			}
		}
		list, err := c.ListInstances(ctx, "web")
		if err != nil {
			t.Fatalf("list: %v", err)
		}
		want := &tetherv1.ListInstancesResponse{Instances: []*tetherv1.Instance{
			{Service: "web", Id: "i1", Address: "127.0.0.1", HttpPort: 8001, SipPort: 5061, Weight: 1, State: active, Health: unknownH,
				Sessions: int32(len(onI1)), SessionCapacity: 20, RequestCapacity: 200},
			{Service: "web", Id: "i2", Address: "127.0.0.1", HttpPort: 8002, SipPort: 5062, Weight: 1, State: active, Health: unknownH,
				Sessions: int32(3 - len(onI1)), SessionCapacity: 20, RequestCapacity: 200},
		}}
		// The scale-out gauge: instances holding sessions (none is full).
		for _, in := range want.GetInstances() {
			if in.GetSessions() > 0 {
				want.DesiredInstances++
			}
		}
		if diff := cmp.Diff(want, list, protocmp.Transform()); diff != "" {
			t.Errorf("instances (-want +got):\n%s", diff)
		}
		// A request in flight counts.
		d, err := srv.Engine.Decide(ctx, httpReq("web"))
		if err != nil {
			t.Fatal(err)
		}
		list, err = c.ListInstances(ctx, "web")
		if err != nil {
			t.Fatal(err)
		}
		inflight := 0
		for _, in := range list.GetInstances() {
			inflight += int(in.GetRequests())
		}
		d.End()
		if inflight != 1 {
			t.Errorf("requests in flight = %d, want 1", inflight)
		}

		// Register.
		reg, err := c.RegisterInstance(ctx, "web", &tetherv1.Instance{Id: "i3", Address: "::1", HttpPort: 8003, Zone: "z2"})
		if err != nil {
			t.Fatalf("register: %v", err)
		}
		wantI3 := &tetherv1.Instance{Service: "web", Id: "i3", Address: "::1", HttpPort: 8003, Weight: 1, Zone: "z2", State: active,
			Health: unknownH, SessionCapacity: 20, RequestCapacity: 200}
		if diff := cmp.Diff(wantI3, reg, protocmp.Transform()); diff != "" {
			t.Errorf("registered (-want +got):\n%s", diff)
		}
		if _, ok := srv.Registry.Snapshot().Instance(registry.Key{Service: "web", ID: "i3"}); !ok {
			t.Errorf("i3 is not in the registry")
		}
		for _, tc := range []struct {
			name string
			svc  string
			in   *tetherv1.Instance
			code codes.Code
		}{
			{"duplicate", "web", &tetherv1.Instance{Id: "i3", Address: "127.0.0.1", HttpPort: 9000}, codes.AlreadyExists},
			{"unknown service", "nope", &tetherv1.Instance{Id: "x", Address: "127.0.0.1", HttpPort: 9000}, codes.NotFound},
			{"host name address", "web", &tetherv1.Instance{Id: "x", Address: "app.example", HttpPort: 9000}, codes.InvalidArgument},
			// Issue 14: the API registered 0.0.0.0, which config validation refuses.
			{"unspecified IPv4 address", "web", &tetherv1.Instance{Id: "x", Address: "0.0.0.0", HttpPort: 9000}, codes.InvalidArgument},
			{"unspecified IPv6 address", "web", &tetherv1.Instance{Id: "x", Address: "::", HttpPort: 9000}, codes.InvalidArgument},
			{"no port", "web", &tetherv1.Instance{Id: "x", Address: "127.0.0.1"}, codes.InvalidArgument},
			{"port out of range", "web", &tetherv1.Instance{Id: "x", Address: "127.0.0.1", HttpPort: 70000}, codes.InvalidArgument},
			{"malformed id", "web", &tetherv1.Instance{Id: "-x", Address: "127.0.0.1", HttpPort: 9000}, codes.InvalidArgument},
			{"weight above 1000", "web", &tetherv1.Instance{Id: "x", Address: "127.0.0.1", HttpPort: 9000, Weight: 1001}, codes.InvalidArgument},
			{"other service in body", "web", &tetherv1.Instance{Service: "hdr", Id: "x", Address: "127.0.0.1", HttpPort: 9000}, codes.InvalidArgument},
		} {
			_, err := c.RegisterInstance(ctx, tc.svc, tc.in)
			wantCode(t, "register "+tc.name, err, tc.code, "")
		}

		// State.
		got, err := c.SetInstanceState(ctx, "web", "i3", standby)
		if err != nil || got.GetState() != standby {
			t.Errorf("set standby: %v, %v", got, err)
		}
		_, err = c.SetInstanceState(ctx, "web", "i3", tetherv1.InstanceState_INSTANCE_STATE_UNSPECIFIED)
		wantCode(t, "set unspecified state", err, codes.InvalidArgument, "")
		_, err = c.SetInstanceState(ctx, "web", "i9", active)
		wantCode(t, "set state of unknown instance", err, codes.NotFound, "")
		_, err = c.SetInstanceState(ctx, "nope", "i1", active)
		wantCode(t, "set state in unknown service", err, codes.NotFound, "")

		// Deregister.
		if err := c.DeregisterInstance(ctx, "web", "i3"); err != nil {
			t.Fatalf("deregister: %v", err)
		}
		wantCode(t, "deregister twice", c.DeregisterInstance(ctx, "web", "i3"), codes.NotFound, "")
		list, err = c.ListInstances(ctx, "web")
		if err != nil || len(list.GetInstances()) != 2 {
			t.Errorf("after deregister: %v, %v; want i1 and i2", list, err)
		}
		_, err = c.ListInstances(ctx, "nope")
		wantCode(t, "list unknown service", err, codes.NotFound, "")
	})
}

func TestDrainInstance(t *testing.T) {
	forEachTransport(t, func(t *testing.T, tr transport) {
		srv := startWorld(t)
		c := tr.new(t, srv, "")
		ctx := context.Background()

		// i2 holds one session; i1 none.
		if err := srv.Registry.SetState(registry.Key{Service: "hdr", ID: "i1"}, registry.StateStandby); err != nil {
			t.Fatal(err)
		}
		s, err := c.CreateSession(ctx, &tetherv1.CreateSessionRequest{Service: "hdr", SessionId: "held"})
		if err != nil || s.GetInstance() != "i2" {
			t.Fatalf("create on i2: %v, %v", s, err)
		}
		if _, err := c.SetInstanceState(ctx, "hdr", "i1", active); err != nil {
			t.Fatal(err)
		}

		// An empty instance drains at once, even without a timeout.
		r, err := c.DrainInstance(ctx, "hdr", "i1", 0)
		if err != nil || !r.GetDrained() || r.GetInstance().GetState() != draining {
			t.Fatalf("drain empty i1: %v, %v; want drained and draining", r, err)
		}
		if _, err := c.SetInstanceState(ctx, "hdr", "i1", active); err != nil {
			t.Fatal(err)
		}

		// A busy instance does not drain within a short timeout; the answer says what is left.
		r, err = c.DrainInstance(ctx, "hdr", "i2", 150*time.Millisecond)
		if err != nil {
			t.Fatalf("drain busy i2: %v", err)
		}
		if r.GetDrained() || r.GetInstance().GetSessions() != 1 || r.GetInstance().GetState() != draining {
			t.Errorf("drain busy i2 = %v; want not drained, 1 session left, state draining", r)
		}
		// New sessions avoid the draining instance at once.
		n, err := c.CreateSession(ctx, &tetherv1.CreateSessionRequest{Service: "hdr"})
		if err != nil || n.GetInstance() != "i1" {
			t.Errorf("new session went to %q (%v), want i1 (i2 is draining)", n.GetInstance(), err)
		}

		// Drain-and-wait returns as soon as the last session goes.
		type result struct {
			r   *tetherv1.DrainInstanceResponse
			err error
		}
		done := make(chan result, 1)
		go func() {
			r, err := c.DrainInstance(ctx, "hdr", "i2", 30*time.Second)
			done <- result{r, err}
		}()
		time.Sleep(100 * time.Millisecond) // let the drain start waiting
		select {
		case res := <-done:
			t.Fatalf("drain returned while a session was left: %v, %v", res.r, res.err)
		default:
		}
		if err := c.DeleteSession(ctx, "hdr", "held"); err != nil {
			t.Fatal(err)
		}
		select {
		case res := <-done:
			if res.err != nil || !res.r.GetDrained() || res.r.GetInstance().GetSessions() != 0 {
				t.Errorf("drain after delete = %v, %v; want drained with 0 sessions", res.r, res.err)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("drain did not return after the last session ended")
		}

		_, err = c.DrainInstance(ctx, "hdr", "i9", time.Second)
		wantCode(t, "drain unknown instance", err, codes.NotFound, "")
		_, err = c.DrainInstance(ctx, "hdr", "i1", 25*time.Hour)
		wantCode(t, "drain timeout above the bound", err, codes.InvalidArgument, "")
	})
}

// TestDesiredInstancesGauge: the scale-out gauge in ListInstances follows the seed's rule
// (instances holding sessions, plus one when every instance in use is full) as sessions open
// the standby instance, over both transports.
func TestDesiredInstancesGauge(t *testing.T) {
	forEachTransport(t, func(t *testing.T, tr transport) {
		svc := affinitytest.Service("fn", registry.AffinityHeader)
		svc.SessionsPerInstance = 2
		ins := affinitytest.Instances("fn", 2)
		ins[1].State = registry.StateStandby
		srv := apitest.Start(t, []registry.Service{svc}, ins)
		c := tr.new(t, srv, "")
		ctx := context.Background()
		// sessions created so far → desired instances
		want := []int32{1, 2, 2, 3}
		for i, w := range want {
			if _, err := c.CreateSession(ctx, &tetherv1.CreateSessionRequest{Service: "fn"}); err != nil {
				t.Fatalf("create %d: %v", i+1, err)
			}
			list, err := c.ListInstances(ctx, "fn")
			if err != nil {
				t.Fatal(err)
			}
			if got := list.GetDesiredInstances(); got != w {
				t.Errorf("after %d sessions: desired instances %d, want %d", i+1, got, w)
			}
		}
	})
}

func TestSetInstanceHealth(t *testing.T) {
	const (
		healthy   = tetherv1.InstanceHealth_INSTANCE_HEALTH_HEALTHY
		unhealthy = tetherv1.InstanceHealth_INSTANCE_HEALTH_UNHEALTHY
	)
	forEachTransport(t, func(t *testing.T, tr transport) {
		svcs, ins := world()
		checked := affinitytest.Service("checked", registry.AffinityCookie)
		checked.HealthCheck = registry.HealthCheck{Path: "/healthz", Interval: time.Hour, Timeout: time.Second, HealthyThreshold: 1, UnhealthyThreshold: 1}
		svcs = append(svcs, checked)
		ins = append(ins, affinitytest.Instances("checked", 1)...)
		srv := apitest.Start(t, svcs, ins)
		c := tr.new(t, srv, "")
		ctx := context.Background()

		got, err := c.SetInstanceHealth(ctx, "web", "i1", unhealthy)
		if err != nil || got.GetHealth() != unhealthy {
			t.Fatalf("set unhealthy: %v, %v", got, err)
		}
		// An unhealthy instance takes no new session.
		for range 6 {
			s, err := c.CreateSession(ctx, &tetherv1.CreateSessionRequest{Service: "web"})
			if err != nil {
				t.Fatalf("create: %v", err)
			}
			if s.GetInstance() == "i1" {
				t.Fatalf("a new session went to the instance set unhealthy")
			}
		}
		for _, h := range []tetherv1.InstanceHealth{healthy, unknownH} {
			if got, err := c.SetInstanceHealth(ctx, "web", "i1", h); err != nil || got.GetHealth() != h {
				t.Errorf("set %v: %v, %v", h, got, err)
			}
		}

		_, err = c.SetInstanceHealth(ctx, "web", "i1", tetherv1.InstanceHealth_INSTANCE_HEALTH_UNSPECIFIED)
		wantCode(t, "set unspecified health", err, codes.InvalidArgument, "")
		_, err = c.SetInstanceHealth(ctx, "web", "i9", unhealthy)
		wantCode(t, "set health of unknown instance", err, codes.NotFound, "")
		_, err = c.SetInstanceHealth(ctx, "nope", "i1", unhealthy)
		wantCode(t, "set health in unknown service", err, codes.NotFound, "")
		_, err = c.SetInstanceHealth(ctx, "checked", "i1", unhealthy)
		wantCode(t, "set health where tether checks it", err, codes.FailedPrecondition, "")
	})
}
