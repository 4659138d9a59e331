package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"syscall"
	"testing"
	"time"

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

// envoyDP is a real Envoy process started from the bootstrap tether generates.
type envoyDP struct {
	cmd     *exec.Cmd
	url     string
	admin   string
	logPath string
	exited  chan struct{}
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	port := l.Addr().(*net.TCPAddr).Port
	return port, l.Close()
}

// startEnvoy writes xds.BootstrapYAML for services to a temporary file and runs bin on it,
// with the data-plane listener and admin on free loopback ports, waiting until the admin
// interface reports the server LIVE.
func startEnvoy(t *testing.T, bin string, services []registry.Service, xdsAddr, extProcAddr string) (DataPlane, error) {
	listenPort, err := freePort()
	if err != nil {
		return nil, err
	}
	adminPort, err := freePort()
	if err != nil {
		return nil, err
	}
	admin := net.JoinHostPort("127.0.0.1", strconv.Itoa(adminPort))
	y, err := xds.BootstrapYAML(services, xds.BootstrapParams{
		Params: xds.Params{ListenerAddress: net.JoinHostPort("127.0.0.1", strconv.Itoa(listenPort)),
			MessageTimeout: MessageTimeout},
		XDSAddress:     xdsAddr,
		ExtProcAddress: extProcAddr,
		AdminAddress:   admin,
	})
	if err != nil {
		return nil, err
	}
	dir := t.TempDir()
	cfg := filepath.Join(dir, "envoy.yaml")
	if err := os.WriteFile(cfg, y, 0o600); err != nil {
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
	d := &envoyDP{cmd: cmd, url: "http://" + net.JoinHostPort("127.0.0.1", strconv.Itoa(listenPort)),
		admin: "http://" + admin, logPath: logPath, exited: make(chan struct{})}
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
			return nil, fmt.Errorf("e2e: envoy exited during startup:\n%s", d.logTail())
		case <-ctx.Done():
			_ = d.Close()
			return nil, fmt.Errorf("e2e: envoy not ready after 30s:\n%s", d.logTail())
		case <-time.After(50 * time.Millisecond):
		}
	}
}

func (d *envoyDP) logTail() string {
	b, _ := os.ReadFile(d.logPath)
	if len(b) > 4000 {
		b = b[len(b)-4000:]
	}
	return string(b)
}

func (d *envoyDP) URL() string { return d.url }

// WaitEndpoints polls the admin /clusters?format=json view of the cluster's hosts.
func (d *envoyDP) WaitEndpoints(ctx context.Context, cluster string, addrs []string) error {
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

func (d *envoyDP) hosts(cluster string) ([]string, error) {
	resp, err := http.Get(d.admin + "/clusters?format=json")
	if err != nil {
		return nil, err
	}
	defer func() { _ = resp.Body.Close() }()
	var body struct {
		ClusterStatuses []struct {
			Name         string `json:"name"`
			HostStatuses []struct {
				Address struct {
					SocketAddress struct {
						Address   string `json:"address"`
						PortValue int    `json:"port_value"`
					} `json:"socket_address"`
				} `json:"address"`
			} `json:"host_statuses"`
		} `json:"cluster_statuses"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&body); err != nil {
		return nil, err
	}
	var out []string
	for _, c := range body.ClusterStatuses {
		if c.Name != cluster {
			continue
		}
		for _, h := range c.HostStatuses {
			out = append(out, net.JoinHostPort(h.Address.SocketAddress.Address, strconv.Itoa(h.Address.SocketAddress.PortValue)))
		}
	}
	slices.Sort(out)
	return out, nil
}

func (d *envoyDP) Close() error {
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
