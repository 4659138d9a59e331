package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	adminv3 "github.com/envoyproxy/go-control-plane/envoy/admin/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	"google.golang.org/protobuf/encoding/protojson"

	"github.com/tether-dev/tether/internal/envoyharness"
	"github.com/tether-dev/tether/pkg/registry"
	"github.com/tether-dev/tether/pkg/wire"
	"github.com/tether-dev/tether/pkg/xds"
)

// MessageTimeout is the ext_proc message_timeout of both data planes in these tests. The
// shipped default is 500 ms; tests run under the race detector on shared CI cores with 200
// requests arriving at once, where a 500 ms budget measures the machine, not tether.
const MessageTimeout = 5 * time.Second

// harnessDP is the Envoy-faithful harness fed over xDS.
type harnessDP struct {
	h *envoyharness.Harness
	x *envoyharness.XDSEndpoints
}

// startHarness configures the harness as tether's generated Envoy config does: the route table
// from xds.RouteConfiguration, endpoints from tether's ADS server, the destination header
// removed early, and the ext_proc filter settings of the wire contract (the harness defaults).
func startHarness(ctx context.Context, services []registry.Service, xdsAddr, extProcAddr string, earlyRemoval bool, opts ...envoyharness.Option) (DataPlane, error) {
	rc, err := xds.RouteConfiguration(xds.RouteConfigName, services)
	if err != nil {
		return nil, err
	}
	vhosts, err := envoyharness.RoutesFromConfig(rc, wire.ServiceMetadataKey)
	if err != nil {
		return nil, err
	}
	x, err := envoyharness.WatchXDS(ctx, xdsAddr, xds.DefaultNodeID)
	if err != nil {
		return nil, err
	}
	base := []envoyharness.Option{envoyharness.WithMessageTimeout(MessageTimeout)}
	if earlyRemoval {
		base = append(base, envoyharness.WithEarlyHeaderRemoval(wire.DestinationHeader))
	}
	opts = append(base, opts...)
	h, err := envoyharness.New(extProcAddr, x, vhosts, opts...)
	if err != nil {
		_ = x.Close()
		return nil, err
	}
	return &harnessDP{h: h, x: x}, nil
}

func (d *harnessDP) URL() string { return d.h.URL() }

func (d *harnessDP) WaitEndpoints(ctx context.Context, cluster string, addrs []string) error {
	want := slices.Sorted(slices.Values(addrs))
	return d.x.Wait(ctx, func() bool { return slices.Equal(d.x.Addresses(cluster), want) })
}

func (d *harnessDP) Close() error {
	err := d.h.Close()
	if xerr := d.x.Close(); err == nil {
		err = xerr
	}
	return err
}

// Harness returns the harness behind a harness data plane (nil for Envoy), for its stats.
func (e *Env) Harness() *envoyharness.Harness {
	if d, ok := e.DP.(*harnessDP); ok {
		return d.h
	}
	return nil
}

// EnvoyProc is a real Envoy process started from a bootstrap tether generates. It is a
// DataPlane; its admin interface also answers what a test asks of its clusters (HostHealthy,
// HostCounter, Counter).
type EnvoyProc struct {
	cmd     *exec.Cmd
	url     string
	admin   string
	logPath string
	exited  chan struct{}
}

// FreeAddr returns a loopback ip:port that was free a moment ago (for a listener a process
// started later binds, such as Envoy's).
func FreeAddr() (string, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	addr := l.Addr().String()
	return addr, l.Close()
}

// startEnvoy writes xds.BootstrapYAML for services to a temporary file and runs bin on it,
// with the data-plane listener and admin on free loopback ports, waiting until the admin
// interface reports the server LIVE.
func startEnvoy(t *testing.T, bin string, services []registry.Service, xdsAddr, extProcAddr string) (DataPlane, error) {
	listen, err := FreeAddr()
	if err != nil {
		return nil, err
	}
	admin, err := FreeAddr()
	if err != nil {
		return nil, err
	}
	y, err := xds.BootstrapYAML(services, xds.BootstrapParams{
		Params:         xds.Params{ListenerAddress: listen, MessageTimeout: MessageTimeout},
		XDSAddress:     xdsAddr,
		ExtProcAddress: extProcAddr,
		AdminAddress:   admin,
	})
	if err != nil {
		return nil, err
	}
	d, err := StartEnvoy(t, bin, y, listen, admin)
	if err != nil {
		return nil, err
	}
	return d, nil
}

// StartEnvoy runs the Envoy binary bin on bootstrap (YAML, written to a temporary file), whose
// data-plane listener is listen and admin interface admin (both ip:port, as the bootstrap
// names them), and returns once the admin interface reports the server LIVE. The caller
// closes it (Close: SIGTERM, then SIGKILL after 5 s).
func StartEnvoy(t testing.TB, bin string, bootstrap []byte, listen, admin string) (*EnvoyProc, error) {
	dir := t.TempDir()
	cfg := filepath.Join(dir, "envoy.yaml")
	if err := os.WriteFile(cfg, bootstrap, 0o600); err != nil {
		return nil, err
	}
	logPath := filepath.Join(dir, "envoy.log")
	logf, err := os.Create(logPath)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(bin, "-c", cfg, "--disable-hot-restart", "--log-level", "warn", "--concurrency", "2")
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		_ = logf.Close() // the Start error is the one to report
		return nil, fmt.Errorf("e2e: start envoy: %w", err)
	}
	d := &EnvoyProc{cmd: cmd, url: "http://" + listen, admin: "http://" + admin, logPath: logPath, exited: make(chan struct{})}
	go func() {
		_ = cmd.Wait() // the exit shows in the log tail and in d.exited
		_ = logf.Close()
		close(d.exited)
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for {
		resp, err := http.Get(d.admin + "/ready")
		if err == nil {
			b, _ := io.ReadAll(resp.Body)
			_ = resp.Body.Close()
			if resp.StatusCode == http.StatusOK && bytes.Contains(b, []byte("LIVE")) {
				return d, nil
			}
		}
		select {
		case <-d.exited:
			return nil, fmt.Errorf("e2e: envoy exited during startup:\n%s", d.LogTail())
		case <-ctx.Done():
			_ = d.Close()
			return nil, fmt.Errorf("e2e: envoy not ready after 30s:\n%s", d.LogTail())
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// LogTail returns the last 4,000 bytes of what Envoy logged.
func (d *EnvoyProc) LogTail() string {
	b, _ := os.ReadFile(d.logPath)
	if len(b) > 4000 {
		b = b[len(b)-4000:]
	}
	return string(b)
}

func (d *EnvoyProc) URL() string { return d.url }

// WaitEndpoints polls the admin /clusters?format=json view of the cluster's hosts.
func (d *EnvoyProc) WaitEndpoints(ctx context.Context, cluster string, addrs []string) error {
	want := slices.Sorted(slices.Values(addrs))
	var last []string
	for {
		got, err := d.hosts(cluster)
		if err == nil && slices.Equal(got, want) {
			return nil
		}
		last = got
		select {
		case <-ctx.Done():
			return fmt.Errorf("e2e: envoy cluster %s has %v, want %v: %w", cluster, last, want, ctx.Err())
		case <-time.After(20 * time.Millisecond):
		}
	}
}

func (d *EnvoyProc) hosts(cluster string) ([]string, error) {
	hs, err := d.clusterHosts(cluster)
	if err != nil {
		return nil, err
	}
	var out []string
	for _, h := range hs {
		out = append(out, h.addr)
	}
	slices.Sort(out)
	return out, nil
}

// envoyHost is one host of a cluster as the admin interface's /clusters?format=json shows it.
type envoyHost struct {
	addr    string
	healthy bool
	stats   map[string]uint64
}

// clusterHosts reads the hosts of cluster from the admin interface (/clusters?format=json,
// an envoy.admin.v3.Clusters).
func (d *EnvoyProc) clusterHosts(cluster string) ([]envoyHost, error) {
	resp, err := http.Get(d.admin + "/clusters?format=json")
	if err != nil {
		return nil, err
	}
	defer func() { _ = resp.Body.Close() }()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, fmt.Errorf("e2e: envoy /clusters: %w", err)
	}
	var body adminv3.Clusters
	if err := (protojson.UnmarshalOptions{DiscardUnknown: true}).Unmarshal(b, &body); err != nil {
		return nil, fmt.Errorf("e2e: envoy /clusters: %w", err)
	}
	var out []envoyHost
	for _, c := range body.GetClusterStatuses() {
		if c.GetName() != cluster {
			continue
		}
		for _, h := range c.GetHostStatuses() {
			sa := h.GetAddress().GetSocketAddress()
			hs := h.GetHealthStatus()
			eds := hs.GetEdsHealthStatus()
			eh := envoyHost{addr: net.JoinHostPort(sa.GetAddress(), strconv.Itoa(int(sa.GetPortValue()))),
				healthy: (eds == corev3.HealthStatus_UNKNOWN || eds == corev3.HealthStatus_HEALTHY) &&
					!hs.GetFailedActiveHealthCheck() && !hs.GetFailedOutlierCheck() && !hs.GetPendingActiveHc() &&
					!hs.GetPendingDynamicRemoval() && !hs.GetExcludedViaImmediateHcFail() && !hs.GetActiveHcTimeout(),
				stats: map[string]uint64{}}
			for _, st := range h.GetStats() {
				eh.stats[st.GetName()] = st.GetValue()
			}
			out = append(out, eh)
		}
	}
	return out, nil
}

// HostHealthy reports whether Envoy routes to the host addr (ip:port) of cluster: its EDS
// health is HEALTHY (or UNKNOWN, a static host's) and no active health check, outlier
// detection or other reason holds it out. An unknown host, or an admin interface that does
// not answer, is not healthy.
func (d *EnvoyProc) HostHealthy(cluster, addr string) bool {
	hs, err := d.clusterHosts(cluster)
	if err != nil {
		return false
	}
	for _, h := range hs {
		if h.addr == addr {
			return h.healthy
		}
	}
	return false
}

// HostCounter returns the per-host counter name (rq_total, rq_error, cx_connect_fail, …) of
// the host addr of cluster (0 when Envoy does not show it).
func (d *EnvoyProc) HostCounter(cluster, addr, name string) (uint64, error) {
	hs, err := d.clusterHosts(cluster)
	if err != nil {
		return 0, err
	}
	for _, h := range hs {
		if h.addr == addr {
			return h.stats[name], nil
		}
	}
	return 0, nil
}

// Counter returns the value of the statistic named exactly name (e.g.
// cluster.tether_ext_proc.upstream_rq_retry; 0 when Envoy has none of that name).
func (d *EnvoyProc) Counter(name string) (uint64, error) {
	resp, err := http.Get(d.admin + "/stats?format=json&filter=" + url.QueryEscape("^"+regexp.QuoteMeta(name)+"$"))
	if err != nil {
		return 0, err
	}
	defer func() { _ = resp.Body.Close() }()
	var body struct {
		Stats []struct {
			Name  string          `json:"name"`
			Value json.RawMessage `json:"value"`
		} `json:"stats"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&body); err != nil {
		return 0, fmt.Errorf("e2e: envoy /stats: %w", err)
	}
	for _, st := range body.Stats {
		if st.Name == name {
			return strconv.ParseUint(strings.Trim(string(st.Value), `"`), 10, 64)
		}
	}
	return 0, nil
}

func (d *EnvoyProc) Close() error {
	select {
	case <-d.exited:
		return nil
	default:
	}
	_ = d.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-d.exited:
	case <-time.After(5 * time.Second):
		_ = d.cmd.Process.Kill()
		<-d.exited
	}
	return nil
}
