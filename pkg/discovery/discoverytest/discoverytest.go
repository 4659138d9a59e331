// Package discoverytest puts a data plane in front of an engine whose registry a discovery
// source feeds, for the sources' tests: tether's ext_proc and xDS servers on loopback gRPC and
// the Envoy-faithful harness (internal/envoyharness) following that xDS, so requests reach the
// real upstreams the source discovered (test hosts in network namespaces, see
// internal/kubetest.Host).
package discoverytest

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"slices"
	"testing"
	"time"

	"google.golang.org/grpc"

	"github.com/tether-dev/tether/internal/envoyharness"
	"github.com/tether-dev/tether/internal/kubetest"
	"github.com/tether-dev/tether/internal/upstream"
	"github.com/tether-dev/tether/pkg/affinity/affinitytest"
	"github.com/tether-dev/tether/pkg/extproc"
	"github.com/tether-dev/tether/pkg/registry"
	"github.com/tether-dev/tether/pkg/wire"
	"github.com/tether-dev/tether/pkg/xds"
)

// DataPlane is the harness in front of a fixture's engine.
type DataPlane struct {
	URL string
	x   *envoyharness.XDSEndpoints
}

// Start runs ext_proc and xDS over f and a harness whose routes are those of the services f's
// registry publishes now (the harness's routes are static, as a listener's RDS would be until
// the next update: start it once the source has delivered the services). Everything stops when
// tb ends.
func Start(tb testing.TB, f *affinitytest.Fixture) *DataPlane {
	tb.Helper()
	ep := extproc.NewServer(f.Engine)
	gs := grpc.NewServer(extproc.ServerOptions()...)
	extproc.Register(gs, ep)
	epLis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	go func() { _ = gs.Serve(epLis) }()
	tb.Cleanup(gs.Stop)

	xs := xds.NewServer(f.Registry, xds.WithDebounce(5*time.Millisecond))
	xdsLis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = xs.Run(ctx, xdsLis) }()
	tb.Cleanup(func() { cancel(); <-done })

	rc, err := xds.RouteConfiguration(xds.RouteConfigName, f.Registry.Snapshot().Services())
	if err != nil {
		tb.Fatal(err)
	}
	vhosts, err := envoyharness.RoutesFromConfig(rc, wire.ServiceMetadataKey)
	if err != nil {
		tb.Fatal(err)
	}
	x, err := envoyharness.WatchXDS(ctx, xdsLis.Addr().String(), xds.DefaultNodeID)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { _ = x.Close() })
	h, err := envoyharness.New(epLis.Addr().String(), x, vhosts,
		envoyharness.WithEarlyHeaderRemoval(wire.DestinationHeader))
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { _ = h.Close() })
	return &DataPlane{URL: h.URL(), x: x}
}

// WaitEndpoints waits until the harness's EDS for cluster is exactly addrs (ip:port, any order).
func (d *DataPlane) WaitEndpoints(tb testing.TB, cluster string, addrs ...string) {
	tb.Helper()
	want := slices.Sorted(slices.Values(addrs))
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := d.x.Wait(ctx, func() bool { return slices.Equal(d.x.Addresses(cluster), want) }); err != nil {
		tb.Fatalf("discoverytest: EDS of %s: got %v, want %v: %v", cluster, d.x.Addresses(cluster), want, err)
	}
}

// Response is what a request through the data plane got.
type Response struct {
	Status   int
	Header   http.Header
	Instance string // the upstream that served it (upstream.InstanceHeader)
}

// Do sends one request through the data plane on a fresh connection. headers are name, value
// pairs.
func (d *DataPlane) Do(tb testing.TB, method, path string, headers ...string) Response {
	tb.Helper()
	req, err := http.NewRequest(method, d.URL+path, nil)
	if err != nil {
		tb.Fatal(err)
	}
	for i := 0; i+1 < len(headers); i += 2 {
		req.Header.Add(headers[i], headers[i+1])
	}
	c := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	resp, err := c.Do(req)
	if err != nil {
		tb.Fatalf("%s %s: %v", method, path, err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	_ = resp.Body.Close()
	return Response{Status: resp.StatusCode, Header: resp.Header, Instance: resp.Header.Get(upstream.InstanceHeader)}
}

// Cookie returns the Set-Cookie named name in r, or nil.
func (r Response) Cookie(name string) *http.Cookie {
	for _, c := range (&http.Response{Header: r.Header}).Cookies() {
		if c.Name == name {
			return c
		}
	}
	return nil
}

// HostUpstream runs an upstream HTTP server named id on port of test host h (its socket lives
// in h's network namespace) until tb ends. Its address is h.Addr:port.
func HostUpstream(tb testing.TB, h *kubetest.Host, id string, port int) *upstream.Server {
	tb.Helper()
	var u *upstream.Server
	if err := h.Do(func() (err error) {
		u, err = upstream.StartOn(id, net.JoinHostPort(h.Addr.String(), fmt.Sprint(port)))
		return err
	}); err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { _ = u.Close() })
	return u
}

// Service returns the named service of f's registry, failing tb if it is not published.
func Service(tb testing.TB, f *affinitytest.Fixture, name string) registry.Service {
	tb.Helper()
	s, ok := f.Registry.Snapshot().Service(name)
	if !ok {
		tb.Fatalf("discoverytest: no service %s", name)
	}
	return s
}
