package api_test

import (
	"context"
	"encoding/json"
	"errors"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/testing/protocmp"

	"github.com/tether-dev/tether/internal/testutil"
	"github.com/tether-dev/tether/pkg/api"
	tetherv1 "github.com/tether-dev/tether/pkg/api/gen/tether/v1"
	"github.com/tether-dev/tether/pkg/registry"
)

func adminRegistry(t *testing.T) *registry.Registry {
	t.Helper()
	reg := registry.New()
	svcs := []registry.Service{
		{Name: "web", Affinity: registry.AffinityCookie, Balancing: registry.BalanceRoundRobin,
			SessionsPerInstance: 20, RequestSlotsPerInstance: 200, SessionTTL: 6 * time.Hour, IdleTimeout: 30 * time.Minute,
			Match: registry.Match{PathPrefix: "/"}, Cookie: registry.Cookie{Name: "tether-session", Path: "/", HTTPOnly: true, SameSite: "Lax"}},
		{Name: "api", Affinity: registry.AffinityHeader, Balancing: registry.BalanceLeastRequest, HeaderField: "x-tether-session",
			SessionsPerInstance: 5, RequestSlotsPerInstance: 10, SessionTTL: time.Hour},
	}
	ins := []registry.Instance{
		{Service: "web", ID: "b", Address: "127.0.0.1", HTTPPort: 8082, Weight: 1, State: registry.StateStandby},
		{Service: "web", ID: "a", Address: "127.0.0.1", HTTPPort: 8081, Weight: 2, State: registry.StateActive, Zone: "z1"},
	}
	if err := reg.Apply(svcs, ins); err != nil {
		t.Fatal(err)
	}
	return reg
}

func get(t *testing.T, url string) (int, string) {
	t.Helper()
	r := testutil.Get(t, url)
	return r.Status, r.Body
}

func TestAdminHealthAndReadiness(t *testing.T) {
	empty := httptest.NewServer(api.NewAdminHandler(registry.New()))
	defer empty.Close()
	if code, body := get(t, empty.URL+"/healthz"); code != 200 || body != "ok\n" {
		t.Errorf("healthz = %d %q, want 200 ok", code, body)
	}
	if code, body := get(t, empty.URL+"/readyz"); code != 503 || !strings.Contains(body, "no configuration") {
		t.Errorf("readyz without config = %d %q, want 503", code, body)
	}

	var failing atomic.Bool
	failing.Store(true)
	srv := httptest.NewServer(api.NewAdminHandler(adminRegistry(t), api.WithReadyCheck("store", func(context.Context) error {
		if failing.Load() {
			return errors.New("restoring snapshot")
		}
		return nil
	})))
	defer srv.Close()
	if code, body := get(t, srv.URL+"/readyz"); code != 503 || !strings.Contains(body, "store: restoring snapshot") {
		t.Errorf("readyz with failing check = %d %q, want 503 naming the check", code, body)
	}
	failing.Store(false)
	if code, _ := get(t, srv.URL+"/readyz"); code != 200 {
		t.Errorf("readyz = %d, want 200", code)
	}
}

func TestAdminServicesAndInstances(t *testing.T) {
	srv := httptest.NewServer(api.NewAdminHandler(adminRegistry(t)))
	defer srv.Close()

	code, body := get(t, srv.URL+"/v1/services")
	if code != 200 {
		t.Fatalf("GET /v1/services = %d %s", code, body)
	}
	var list api.ServiceList
	if err := json.Unmarshal([]byte(body), &list); err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, s := range list.Services {
		names = append(names, s.Name)
	}
	if diff := cmp.Diff([]string{"api", "web"}, names); diff != "" {
		t.Errorf("service names (-want +got):\n%s", diff)
	}
	web := list.Services[1]
	if web.Affinity != "cookie" || web.SessionTTL != "6h0m0s" || web.IdleTimeout != "30m0s" || web.Cookie.Name != "tether-session" || web.Instances != 2 {
		t.Errorf("web settings = %+v", web)
	}

	code, body = get(t, srv.URL+"/v1/services/web/instances")
	if code != 200 {
		t.Fatalf("GET instances = %d %s", code, body)
	}
	var il tetherv1.ListInstancesResponse
	if err := protojson.Unmarshal([]byte(body), &il); err != nil {
		t.Fatal(err)
	}
	want := &tetherv1.ListInstancesResponse{Instances: []*tetherv1.Instance{
		{Service: "web", Id: "a", Address: "127.0.0.1", HttpPort: 8081, Weight: 2, Zone: "z1",
			State: tetherv1.InstanceState_INSTANCE_STATE_ACTIVE, Health: tetherv1.InstanceHealth_INSTANCE_HEALTH_UNKNOWN},
		{Service: "web", Id: "b", Address: "127.0.0.1", HttpPort: 8082, Weight: 1,
			State: tetherv1.InstanceState_INSTANCE_STATE_STANDBY, Health: tetherv1.InstanceHealth_INSTANCE_HEALTH_UNKNOWN},
	}}
	if diff := cmp.Diff(want, &il, protocmp.Transform()); diff != "" {
		t.Errorf("instances (-want +got):\n%s", diff)
	}
	if !strings.Contains(body, `"sipPort": 0,`) {
		t.Errorf("zero scalars should be present in the JSON: %s", body)
	}

	code, body = get(t, srv.URL+"/v1/services/nope/instances")
	if code != 404 || !strings.Contains(body, `"errorCode":"NotFound"`) {
		t.Errorf("unknown service = %d %s, want 404 NotFound", code, body)
	}
}
