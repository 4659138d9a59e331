package discovery_test

import (
	"context"
	"crypto/tls"
	"fmt"
	"net"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	"github.com/envoyproxy/go-control-plane/pkg/cache/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"github.com/envoyproxy/go-control-plane/pkg/server/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"

	"github.com/tether-dev/tether/pkg/config"
	"github.com/tether-dev/tether/pkg/discovery"
	"github.com/tether-dev/tether/pkg/registry"
	"github.com/tether-dev/tether/pkg/servertls/servertlstest"
)

// streams counts ADS streams opened on the mesh server, so a test sees whether a source was
// restarted.
type streams struct{ n atomic.Int32 }

func startMesh(t *testing.T, opts ...grpc.ServerOption) (string, *streams) {
	t.Helper()
	c := cache.NewSnapshotCache(false, cache.IDHash{}, nil)
	cla := &endpointv3.ClusterLoadAssignment{ClusterName: "mesh-web", Endpoints: []*endpointv3.LocalityLbEndpoints{{
		LbEndpoints: []*endpointv3.LbEndpoint{{HostIdentifier: &endpointv3.LbEndpoint_Endpoint{Endpoint: &endpointv3.Endpoint{
			Address: &corev3.Address{Address: &corev3.Address_SocketAddress{SocketAddress: &corev3.SocketAddress{
				Address: "198.18.9.1", PortSpecifier: &corev3.SocketAddress_PortValue{PortValue: 8080}}}},
		}}}},
	}}}
	cl := &clusterv3.Cluster{Name: "mesh-web", ClusterDiscoveryType: &clusterv3.Cluster_Type{Type: clusterv3.Cluster_EDS}}
	snap, err := cache.NewSnapshot("1", map[resource.Type][]types.Resource{resource.ClusterType: {cl}, resource.EndpointType: {cla}})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.SetSnapshot(context.Background(), "tether", snap); err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	cb := &streams{}
	srv := grpc.NewServer(opts...)
	discoveryv3.RegisterAggregatedDiscoveryServiceServer(srv, server.NewServer(context.Background(), c, server.CallbackFuncs{
		StreamOpenFunc: func(context.Context, int64, string) error { cb.n.Add(1); return nil },
	}))
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(srv.Stop)
	return ln.Addr().String(), cb
}

func parse(t *testing.T, yaml string) *config.Config {
	t.Helper()
	c, err := config.Parse([]byte(yaml), "tether.yaml")
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func waitInstances(t *testing.T, r *registry.Registry, service string, n int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for len(r.Snapshot().Instances(service)) != n {
		if time.Now().After(deadline) {
			t.Fatalf("%s has %d instances, want %d; sources %+v", service, len(r.Snapshot().Instances(service)), n, r.Sources())
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// A config with an xds source feeds the registry; re-applying the same config (a reload that
// changed something else) keeps the running source; dropping the source removes its instances
// while the config file's and the API's stay; a source that cannot start says so.
func TestManagerFollowsConfig(t *testing.T) {
	addr, cb := startMesh(t)
	cfgText := fmt.Sprintf(`apiVersion: tether/v1
registry: {allowedNetworks: [127.0.0.1/32, 198.18.0.0/15]}
discovery:
  xds: {server: %q}
services:
- name: web
  instances: [{id: static, address: 198.18.9.9, ports: {http: 80}}]
  discovery:
    xds: {cluster: mesh-web}
`, addr)
	cfg := parse(t, cfgText)
	reg := registry.New()
	if err := reg.Apply(cfg.Registry()); err != nil {
		t.Fatal(err)
	}
	m := discovery.New(reg)
	defer m.Stop()
	ctx := context.Background()
	m.Apply(ctx, cfg)
	waitInstances(t, reg, "web", 2)
	if err := reg.Register(registry.Instance{Service: "web", ID: "api", Address: "198.18.9.8", HTTPPort: 80}); err != nil {
		t.Fatal(err)
	}
	opened := cb.n.Load()

	// Reload with a change elsewhere: the source keeps its stream.
	cfg2 := parse(t, cfgText+"  sessionsPerInstance: 5\n")
	if err := reg.Apply(cfg2.Registry()); err != nil {
		t.Fatal(err)
	}
	m.Apply(ctx, cfg2)
	if got := cb.n.Load(); got != opened {
		t.Errorf("an unrelated reload restarted the xds source (%d streams, was %d)", got, opened)
	}
	waitInstances(t, reg, "web", 3)

	// The source leaves the config: its instance goes, the config's and the API's stay.
	cfg3 := parse(t, fmt.Sprintf(`apiVersion: tether/v1
registry: {allowedNetworks: [127.0.0.1/32, 198.18.0.0/15]}
discovery:
  xds: {server: %q}
services:
- name: web
  instances: [{id: static, address: 198.18.9.9, ports: {http: 80}}]
`, addr))
	if err := reg.Apply(cfg3.Registry()); err != nil {
		t.Fatal(err)
	}
	m.Apply(ctx, cfg3)
	var ids []string
	for _, in := range reg.Snapshot().Instances("web") {
		ids = append(ids, in.ID)
	}
	if fmt.Sprint(ids) != "[api static]" {
		t.Errorf("after dropping the source: instances %v, want [api static]", ids)
	}
	for _, s := range reg.Sources() {
		if s.Kind == "xds" {
			t.Errorf("removed source still listed: %+v", s)
		}
	}

	// A kubernetes source without a cluster to reach reports why instead of running.
	cfg4 := parse(t, `apiVersion: tether/v1
registry: {allowedNetworks: [127.0.0.1/32, 198.18.0.0/15]}
discovery:
  kubernetes: {kubeconfig: /nonexistent/kubeconfig}
services:
- name: web
  discovery:
    kubernetes: {namespace: shop, service: web}
`)
	m.Apply(ctx, cfg4)
	var st registry.SourceStatus
	for _, s := range reg.Sources() {
		if s.Name == "kubernetes/web" {
			st = s
		}
	}
	if !st.Failing || st.Synced || st.LastError == "" {
		t.Errorf("kubernetes source with a missing kubeconfig: %+v, want failing with the reason", st)
	}
}

// discovery.xds.tls: tether dials the mesh's control plane over TLS, checks its certificate
// against caFile and serverName and presents its client certificate; a control plane that
// requires mTLS refuses tether without one, and a wrong server name or plain text fails too —
// each reported through the source's status, not silently.
func TestADSOverMutualTLS(t *testing.T) {
	ca := servertlstest.NewCA(t, "mesh")
	srvCert := ca.Server(t, "istiod", "istiod.mesh.example")
	client := ca.Client(t, "tether")
	addr, _ := startMesh(t, grpc.Creds(credentials.NewTLS(&tls.Config{
		Certificates: []tls.Certificate{srvCert.TLS},
		ClientCAs:    ca.Pool(),
		ClientAuth:   tls.RequireAndVerifyClientCert,
		MinVersion:   tls.VersionTLS12,
	})))
	run := func(t *testing.T, tlsYAML string) *registry.Registry {
		t.Helper()
		cfg := parse(t, fmt.Sprintf(`apiVersion: tether/v1
registry: {allowedNetworks: [127.0.0.1/32, 198.18.0.0/15]}
discovery:
  xds:
    server: %q
%s
services:
- name: web
  discovery:
    xds: {cluster: mesh-web}
`, addr, tlsYAML))
		reg := registry.New()
		if err := reg.Apply(cfg.Registry()); err != nil {
			t.Fatal(err)
		}
		m := discovery.New(reg)
		t.Cleanup(m.Stop)
		m.Apply(context.Background(), cfg)
		return reg
	}
	t.Run("mutual TLS", func(t *testing.T) {
		reg := run(t, fmt.Sprintf("    tls: {enabled: true, caFile: %q, certFile: %q, keyFile: %q, serverName: istiod.mesh.example}",
			ca.File, client.CertFile, client.KeyFile))
		waitInstances(t, reg, "web", 1)
	})
	for _, c := range []struct{ name, tls, why string }{
		// TLS 1.3: the server refuses after the client's handshake is done, so the error is
		// whatever the next write meets (a reset, a broken pipe, "bad certificate").
		{"no client certificate", fmt.Sprintf("    tls: {enabled: true, caFile: %q}", ca.File), ""},
		{"wrong server name", fmt.Sprintf("    tls: {enabled: true, caFile: %q, certFile: %q, keyFile: %q, serverName: other.example}",
			ca.File, client.CertFile, client.KeyFile), "other.example"},
		{"untrusted server (system roots)", fmt.Sprintf("    tls: {enabled: true, certFile: %q, keyFile: %q}", client.CertFile, client.KeyFile), "certificate"},
		{"plain text", "", ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			reg := run(t, c.tls)
			deadline := time.Now().Add(10 * time.Second)
			for {
				var st registry.SourceStatus
				for _, s := range reg.Sources() {
					if s.Kind == "xds" {
						st = s
					}
				}
				if st.Failing && st.LastError != "" {
					if st.Synced || !strings.Contains(st.LastError, c.why) {
						t.Errorf("status %+v: want failing, never synced, with an error about %q", st, c.why)
					}
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("no failure reported: %+v", reg.Sources())
				}
				time.Sleep(5 * time.Millisecond)
			}
			if n := len(reg.Snapshot().Instances("web")); n != 0 {
				t.Errorf("%d instances arrived over a connection that should have failed", n)
			}
		})
	}
}
