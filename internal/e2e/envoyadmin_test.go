package e2e

import (
	"net/http"
	"net/http/httptest"
	"testing"

	adminv3 "github.com/envoyproxy/go-control-plane/envoy/admin/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	"google.golang.org/protobuf/encoding/protojson"
)

// TestEnvoyProcReadsClusterHosts: EnvoyProc's admin reads of one cluster's hosts — health,
// per-host counters, the endpoint set — from an envoy.admin.v3.Clusters rendered as Envoy's
// /clusters?format=json renders it (proto field names, uint64 as strings). No Envoy runs
// here: this checks the mapping from Envoy's admin types, not Envoy.
func TestEnvoyProcReadsClusterHosts(t *testing.T) {
	host := func(port uint32, hs *adminv3.HostHealthStatus, rq uint64) *adminv3.HostStatus {
		return &adminv3.HostStatus{
			Address: &corev3.Address{Address: &corev3.Address_SocketAddress{SocketAddress: &corev3.SocketAddress{
				Address: "127.0.0.1", PortSpecifier: &corev3.SocketAddress_PortValue{PortValue: port}}}},
			HealthStatus: hs,
			Stats:        []*adminv3.SimpleMetric{{Name: "rq_total", Value: rq, Type: adminv3.SimpleMetric_COUNTER}},
		}
	}
	doc := &adminv3.Clusters{ClusterStatuses: []*adminv3.ClusterStatus{
		{Name: "other", HostStatuses: []*adminv3.HostStatus{host(9, nil, 99)}},
		{Name: "tether_ext_proc", HostStatuses: []*adminv3.HostStatus{
			host(1, &adminv3.HostHealthStatus{EdsHealthStatus: corev3.HealthStatus_HEALTHY}, 1<<40),
			host(2, &adminv3.HostHealthStatus{EdsHealthStatus: corev3.HealthStatus_HEALTHY, FailedActiveHealthCheck: true}, 3),
			host(3, &adminv3.HostHealthStatus{PendingActiveHc: true}, 0),
			host(4, &adminv3.HostHealthStatus{}, 0), // a static host never checked: UNKNOWN
			host(5, &adminv3.HostHealthStatus{FailedOutlierCheck: true}, 0),
			host(6, &adminv3.HostHealthStatus{EdsHealthStatus: corev3.HealthStatus_DRAINING}, 0),
		}},
	}}
	js, err := protojson.MarshalOptions{UseProtoNames: true}.Marshal(doc)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/clusters" || r.URL.Query().Get("format") != "json" {
			http.NotFound(w, r)
			return
		}
		_, _ = w.Write(js)
	}))
	defer srv.Close()
	d := &EnvoyProc{admin: srv.URL}
	for _, tc := range []struct {
		addr    string
		healthy bool
	}{
		{"127.0.0.1:1", true}, {"127.0.0.1:2", false}, {"127.0.0.1:3", false}, {"127.0.0.1:4", true},
		{"127.0.0.1:5", false}, {"127.0.0.1:6", false}, {"127.0.0.1:9", false}, {"127.0.0.1:7", false},
	} {
		if got := d.HostHealthy("tether_ext_proc", tc.addr); got != tc.healthy {
			t.Errorf("HostHealthy(%s) = %v, want %v", tc.addr, got, tc.healthy)
		}
	}
	if n, err := d.HostCounter("tether_ext_proc", "127.0.0.1:1", "rq_total"); err != nil || n != 1<<40 {
		t.Errorf("HostCounter rq_total = %d, %v; want %d", n, err, uint64(1<<40))
	}
	hosts, err := d.hosts("tether_ext_proc")
	if err != nil || len(hosts) != 6 || hosts[0] != "127.0.0.1:1" {
		t.Errorf("hosts = %v, %v; want the six of tether_ext_proc", hosts, err)
	}
}
