package replicatest

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/redis/rueidis"

	"github.com/tether-dev/tether/internal/e2e"
	"github.com/tether-dev/tether/internal/envoyharness"
	"github.com/tether-dev/tether/internal/testutil"
	"github.com/tether-dev/tether/pkg/config"
	"github.com/tether-dev/tether/pkg/quota"
	"github.com/tether-dev/tether/pkg/registry"
	"github.com/tether-dev/tether/pkg/wire"
	"github.com/tether-dev/tether/pkg/xds"
)

// The tether binary is built once per test process (BuildTether) into a temporary directory
// that RemoveBuilt deletes (call it from TestMain).
var built struct {
	once sync.Once
	dir  string
	bin  string
	err  error
}

// BuildTether builds cmd/tether once per test process and returns the binary's path. The
// build is not instrumented by the race detector: the processes are the system under test of
// fault tests, not of race tests, and run several times faster without it.
func BuildTether(t testing.TB) string {
	t.Helper()
	built.once.Do(func() {
		built.dir, built.err = os.MkdirTemp("", "tether-replicatest-")
		if built.err != nil {
			return
		}
		built.bin = filepath.Join(built.dir, "tether")
		cmd := exec.Command("go", "build", "-o", built.bin, "github.com/tether-dev/tether/cmd/tether")
		if out, err := cmd.CombinedOutput(); err != nil {
			built.err = fmt.Errorf("go build cmd/tether: %w\n%s", err, out)
		}
	})
	if built.err != nil {
		t.Fatal(built.err)
	}
	return built.bin
}

// RemoveBuilt deletes what BuildTether built (safe to call when nothing was).
func RemoveBuilt() {
	if built.dir != "" {
		_ = os.RemoveAll(built.dir)
	}
}

// ProcConfig is what the tether processes of one fleet share.
type ProcConfig struct {
	// RedisAddr is the redis-server every process uses.
	RedisAddr string
	// KeyPrefix is the fleet's key prefix (default: a fresh one per StartProcs call).
	KeyPrefix string
	// LeaseTTL is store.redis.leaseTTL (default 2 s: short, so tests see a dead replica's
	// leases expire).
	LeaseTTL time.Duration
	// DegradedFor is store.redis.degradedFor (default: LeaseTTL).
	DegradedFor time.Duration
	// Unseeded: as Options.Unseeded.
	Unseeded bool
	// TouchDelay is store.redis.touchDelay (default 100 ms).
	TouchDelay time.Duration
	// Services is the YAML of the config's services list (the text after "services:").
	Services string
	// Shutdown is the config's shutdown section as flow YAML (default: none, the defaults).
	Shutdown string
	// MessageTimeout is extProc.messageTimeout (default: tether's, 500 ms); ClusterDataPlane's
	// message_timeout is e2e.MessageTimeout, so a test that wants the two to agree, as the
	// generated bootstrap makes them, sets e2e.MessageTimeout here.
	MessageTimeout time.Duration
	// Memory runs each process on its own memory store (store.backend memory, a snapshot file
	// of its own that a restart reads back) instead of the shared Redis.
	Memory bool
	// Bin is the tether binary to run (default BuildTether's: this tree's).
	Bin string
	// E11d6a0 writes the config as the build of commit e11d6a0 accepts it (it refuses unknown
	// fields): without store.redis.degradedFor and the shutdown section.
	E11d6a0 bool
}

// Proc is one tether replica running as its own process (tether serve) on ephemeral ports.
type Proc struct {
	Name string
	// Replica is the replica's lease name in Redis (from its log).
	Replica string
	// APIAddr, ExtProcAddr and XDSAddr are the bound listener addresses.
	APIAddr, ExtProcAddr, XDSAddr string
	// Services are the config's services, as the registry holds them.
	Services []registry.Service
	// Instances are the config's instances.
	Instances []registry.Instance

	cmd    *exec.Cmd
	logs   *testutil.SyncBuffer
	exited chan struct{}
	err    error // the process's exit status, set before exited closes

	// bin, pc and dir start the process again (Restart); cfgText is its config as this
	// build reads it (Bootstrap).
	bin     string
	pc      ProcConfig
	dir     string
	cfgText string
}

// StartProcs starts n tether processes of one fleet (replicas "a", "b", … sharing Redis under
// one key prefix) and returns once every one answers /readyz. They are stopped (SIGTERM) when
// the test ends; their logs are printed if it failed.
func StartProcs(t testing.TB, n int, pc ProcConfig) []*Proc {
	t.Helper()
	bin := pc.Bin
	if bin == "" {
		bin = BuildTether(t)
	}
	if pc.KeyPrefix == "" {
		pc.KeyPrefix = "p" + newPrefix()
	}
	if pc.LeaseTTL <= 0 {
		pc.LeaseTTL = 2 * time.Second
	}
	if pc.TouchDelay <= 0 {
		pc.TouchDelay = 100 * time.Millisecond
	}
	if pc.DegradedFor <= 0 {
		pc.DegradedFor = pc.LeaseTTL
	}
	procs := make([]*Proc, n)
	var wg sync.WaitGroup
	errs := make([]error, n)
	for i := range n {
		wg.Go(func() { procs[i], errs[i] = startProc(t, bin, string(rune('a'+i)), pc) })
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	if !pc.Unseeded && !pc.Memory {
		seedLeases(t, pc.RedisAddr, pc.KeyPrefix, procs[0].Services)
	}
	return procs
}

// seedLeases marks the fresh Redis's lease data sets of services fresh (quota.Leases.Seed),
// before any traffic, so that the fleet's first epoch needs no learning window.
func seedLeases(t testing.TB, addr, prefix string, services []registry.Service) {
	t.Helper()
	c, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{addr}, DisableCache: true})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	l := quota.New(c, prefix, "seed")
	for _, svc := range services {
		if err := l.Seed(context.Background(), svc.Name); err != nil {
			t.Fatal(err)
		}
	}
}

func startProc(t testing.TB, bin, name string, pc ProcConfig) (*Proc, error) {
	return startProcIn(t, bin, name, pc, t.TempDir(), "127.0.0.1:0", "127.0.0.1:0")
}

// startProcIn starts replica name with its files in dir and its ext_proc and xDS listeners on
// extProc and xdsAddr.
func startProcIn(t testing.TB, bin, name string, pc ProcConfig, dir, extProc, xdsAddr string) (*Proc, error) {
	store := fmt.Sprintf(`store:
  backend: redis
  redis:
    addresses: [%s]
    keyPrefix: %q
    touchDelay: %s
    leaseTTL: %s
`, pc.RedisAddr, pc.KeyPrefix, pc.TouchDelay, pc.LeaseTTL)
	if !pc.E11d6a0 {
		store += fmt.Sprintf("    degradedFor: %s\n", pc.DegradedFor)
	}
	if pc.Memory {
		store = fmt.Sprintf("store: {backend: memory, snapshotPath: %q, snapshotInterval: 1s}\n", filepath.Join(dir, "sessions.snap"))
	}
	shutdown := ""
	if pc.Shutdown != "" && !pc.E11d6a0 {
		shutdown = "shutdown: " + pc.Shutdown + "\n"
	}
	if pc.MessageTimeout > 0 {
		shutdown += "extProc: {messageTimeout: " + pc.MessageTimeout.String() + "}\n"
	}
	text := func(registry string) string {
		return fmt.Sprintf(`apiVersion: tether/v1
%slisteners:
  extProc: %s
  xds: %s
  api: 127.0.0.1:0
  sip: ""
log:
  format: json
  level: info
%s%sservices:
%s`, registry, extProc, xdsAddr, store, shutdown, pc.Services)
	}
	const allowLoopback = "registry: {allowedNetworks: [127.0.0.1/32]}\n"
	cfgText := text(allowLoopback)
	if pc.E11d6a0 {
		cfgText = text("") // e11d6a0 has no registry section (and no address policy)
	}
	path := filepath.Join(dir, "tether-"+name+".yaml")
	if err := os.WriteFile(path, []byte(cfgText), 0o600); err != nil {
		return nil, err
	}
	cfg, err := config.Parse([]byte(text(allowLoopback)), path) // this build's reading of the same fleet
	if err != nil {
		return nil, fmt.Errorf("replicatest: the generated config of replica %s: %w", name, err)
	}
	p := &Proc{Name: name, logs: &testutil.SyncBuffer{}, exited: make(chan struct{}), bin: bin, pc: pc, dir: dir,
		cfgText: text(allowLoopback)}
	p.Services, p.Instances = cfg.Registry()

	p.cmd = exec.Command(bin, "serve", "-c", path)
	p.cmd.Stdout = p.logs
	stderr, err := p.cmd.StderrPipe()
	if err != nil {
		return nil, err
	}
	if err := p.cmd.Start(); err != nil {
		return nil, fmt.Errorf("replicatest: starting replica %s: %w", name, err)
	}
	serving := make(chan struct{})
	go p.scan(stderr, serving)
	t.Cleanup(func() {
		p.stop()
		if t.Failed() {
			t.Logf("replica %s (process %d) log:\n%s", p.Name, p.cmd.Process.Pid, p.logs.String())
		}
	})
	select {
	case <-serving:
	case <-p.exited:
		return nil, fmt.Errorf("replicatest: replica %s exited at start (%w):\n%s", name, p.err, p.logs.String())
	case <-time.After(30 * time.Second):
		return nil, fmt.Errorf("replicatest: replica %s did not report its listeners:\n%s", name, p.logs.String())
	}
	if err := p.waitReady(30 * time.Second); err != nil {
		return nil, err
	}
	return p, nil
}

// scan copies the process's log into p.logs, learns its addresses from the "tether serving"
// line and its lease name from the "session store: redis" line, and records the exit.
func (p *Proc) scan(r io.Reader, serving chan<- struct{}) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	signalled := false
	for sc.Scan() {
		line := sc.Bytes()
		_, _ = p.logs.Write(append(line, '\n'))
		if signalled {
			continue
		}
		var m struct {
			Msg, API, ExtProc, XDS, Replica string
		}
		if json.Unmarshal(line, &m) != nil {
			continue
		}
		switch m.Msg {
		case "session store: redis":
			p.Replica = m.Replica
		case "tether serving":
			p.APIAddr, p.ExtProcAddr, p.XDSAddr = m.API, m.ExtProc, m.XDS
			signalled = true
			close(serving)
		}
	}
	_, _ = io.Copy(p.logs, r)
	p.err = p.cmd.Wait()
	close(p.exited)
}

func (p *Proc) waitReady(d time.Duration) error {
	deadline := time.Now().Add(d)
	pause := time.Millisecond
	for {
		resp, err := http.Get("http://" + p.APIAddr + "/readyz")
		if err == nil {
			_ = resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("replicatest: replica %s not ready at %s (%w):\n%s", p.Name, p.APIAddr, err, p.logs.String())
		}
		select {
		case <-p.exited:
			return fmt.Errorf("replicatest: replica %s exited (%w):\n%s", p.Name, p.err, p.logs.String())
		case <-time.After(pause):
		}
		pause = min(2*pause, 20*time.Millisecond)
	}
}

// Pid returns the process id.
func (p *Proc) Pid() int { return p.cmd.Process.Pid }

// Kill sends SIGKILL (kill -9) and waits until the process is gone: it returns, flushes and
// closes nothing.
func (p *Proc) Kill() {
	_ = p.cmd.Process.Signal(syscall.SIGKILL)
	<-p.exited
}

// Exited reports whether the process has ended.
func (p *Proc) Exited() bool {
	select {
	case <-p.exited:
		return true
	default:
		return false
	}
}

// stop ends the process gracefully (SIGTERM, then SIGKILL after 10 s).
func (p *Proc) stop() {
	if p.Exited() {
		return
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.exited:
	case <-time.After(10 * time.Second):
		p.Kill()
	}
}

// Terminate sends SIGTERM (tether's drain) and waits up to within for the process to exit; it
// returns the exit error (nil: exit code 0).
func (p *Proc) Terminate(within time.Duration) error {
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.exited:
		return p.err
	case <-time.After(within):
		return fmt.Errorf("replicatest: replica %s did not exit within %v of SIGTERM:\n%s", p.Name, within, p.logs.String())
	}
}

// Restart starts the (exited) replica again with the same config, store files, ext_proc and
// xDS addresses (as a restarted process on the same host binds the ports the data plane's
// static clusters name), and returns the new process once it answers /readyz. With Redis it is a new
// replica (a new lease name); with the memory store it reads back its snapshot.
func (p *Proc) Restart(t testing.TB) *Proc {
	t.Helper()
	if !p.Exited() {
		t.Fatalf("replicatest: replica %s restarted while running", p.Name)
	}
	np, err := startProcIn(t, p.bin, p.Name, p.pc, p.dir, p.ExtProcAddr, p.XDSAddr)
	if err != nil {
		t.Fatal(err)
	}
	return np
}

// Config returns the process's config (with StartProcs's defaults filled in).
func (p *Proc) Config() ProcConfig { return p.pc }

// RestartAs is Restart with pc's binary (pc.Bin, default BuildTether's) and config: a rolling
// upgrade's step. pc's fleet fields (Redis, key prefix, services) must be the process's own
// (start from Config).
func (p *Proc) RestartAs(t testing.TB, pc ProcConfig) *Proc {
	t.Helper()
	if !p.Exited() {
		t.Fatalf("replicatest: replica %s restarted while running", p.Name)
	}
	bin := pc.Bin
	if bin == "" {
		bin = BuildTether(t)
	}
	np, err := startProcIn(t, bin, p.Name, pc, p.dir, p.ExtProcAddr, p.XDSAddr)
	if err != nil {
		t.Fatal(err)
	}
	return np
}

// Logs returns what the process logged so far.
func (p *Proc) Logs() string { return p.logs.String() }

// Serve starts an Envoy-faithful harness data plane in front of the process (its ext_proc
// and xDS), configured as tether's generated Envoy config does, and waits until the harness
// has every instance's endpoint from the process's xDS.
func (p *Proc) Serve(t testing.TB) *envoyharness.Harness {
	t.Helper()
	want := map[string][]string{}
	for _, in := range p.Instances {
		want[in.Service] = append(want[in.Service], in.HTTPAddr())
	}
	h, err := dataPlane(t, p.ExtProcAddr, p.XDSAddr, p.Services, want)
	if err != nil {
		t.Fatalf("replicatest: data plane of replica %s: %v", p.Name, err)
	}
	return h
}

// waitCtx bounds the data plane's start.
func waitCtx() (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.Background(), 30*time.Second)
}

// ClusterDataPlane starts one Envoy-faithful data plane in front of every process, as the
// bootstrap tether generates for several replicas (`envoy.replicas`) configures Envoy: an
// ext_proc cluster of every replica's ext_proc address (with standby, the first is active
// and the others priority-1 standbys, envoy.replicaMode active-standby), health checked with
// hc, the generated retry_policy, routes from the config's services, and the config's
// instances as each service cluster's endpoints (static: the test is about the replicas, not
// xDS). The processes must share one config's services. It returns once the first health
// check round is done; it is closed when the test ends. BootstrapDataPlane is the same data
// plane configured from the generated bootstrap itself.
func ClusterDataPlane(t testing.TB, procs []*Proc, standby bool, hc envoyharness.HealthCheck) *envoyharness.Harness {
	t.Helper()
	var active, standbys []string
	for i, p := range procs {
		if standby && i > 0 {
			standbys = append(standbys, p.ExtProcAddr)
		} else {
			active = append(active, p.ExtProcAddr)
		}
	}
	return clusterDataPlane(t, procs, envoyharness.WithExtProcCluster(active, standbys, hc))
}

// BootstrapDataPlane is ClusterDataPlane with the ext_proc side of the harness — the cluster's
// hosts by priority, its health check, the grpc_service retry_policy and the message_timeout —
// read from bp, the ext_proc settings of the bootstrap tether generated for procs
// (FleetBootstrap, envoyharness.ExtProcFromBootstrap): what a real Envoy would be given.
func BootstrapDataPlane(t testing.TB, procs []*Proc, bp envoyharness.BootstrapExtProc) *envoyharness.Harness {
	t.Helper()
	if bp.HealthCheck == nil {
		t.Fatalf("replicatest: the bootstrap's ext_proc cluster %s has no health check", bp.Cluster)
	}
	return clusterDataPlane(t, procs, bp.Options()...)
}

// clusterDataPlane starts the harness of ClusterDataPlane with the ext_proc options opts.
func clusterDataPlane(t testing.TB, procs []*Proc, opts ...envoyharness.Option) *envoyharness.Harness {
	t.Helper()
	rc, err := xds.RouteConfiguration(xds.RouteConfigName, procs[0].Services)
	if err != nil {
		t.Fatal(err)
	}
	vhosts, err := envoyharness.RoutesFromConfig(rc, wire.ServiceMetadataKey)
	if err != nil {
		t.Fatal(err)
	}
	eps := map[string][]envoyharness.Endpoint{}
	for _, in := range procs[0].Instances {
		eps[in.Service] = append(eps[in.Service], envoyharness.Endpoint{Address: in.HTTPAddr(), Healthy: true})
	}
	base := []envoyharness.Option{
		envoyharness.WithMessageTimeout(e2e.MessageTimeout),
		envoyharness.WithEarlyHeaderRemoval(wire.DestinationHeader),
	}
	h, err := envoyharness.New("", envoyharness.EndpointsFunc(func(c string) []envoyharness.Endpoint { return eps[c] }), vhosts,
		append(base, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = h.Close() })
	return h
}

// FleetBootstrap returns the Envoy bootstrap tether generates for the fleet of procs: the
// output of `tether bootstrap -c` (this tree's build, BuildTether) on procs[0]'s config with an
// envoy section naming every process as a replica (envoy.replicas: each one's xDS and
// ext_proc listener; envoy.replicaMode active-standby with standby, else active-active), the
// data-plane listener on listen and Envoy's admin on admin. The processes must share one
// config's services.
func FleetBootstrap(t testing.TB, procs []*Proc, standby bool, listen, admin string) []byte {
	t.Helper()
	mode := config.ReplicasActiveActive
	if standby {
		mode = config.ReplicasActiveStandby
	}
	var b strings.Builder
	b.WriteString(procs[0].cfgText)
	fmt.Fprintf(&b, "envoy:\n  listenerAddress: %q\n  adminAddress: %q\n  replicaMode: %s\n  replicas:\n", listen, admin, mode)
	for _, p := range procs {
		fmt.Fprintf(&b, "    - {xds: %q, extProc: %q}\n", p.XDSAddr, p.ExtProcAddr)
	}
	path := filepath.Join(t.TempDir(), "tether-fleet.yaml")
	if err := os.WriteFile(path, []byte(b.String()), 0o600); err != nil {
		t.Fatal(err)
	}
	var stderr bytes.Buffer
	cmd := exec.Command(BuildTether(t), "bootstrap", "-c", path)
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("replicatest: tether bootstrap -c %s: %v\n%s\nconfig:\n%s", path, err, stderr.String(), b.String())
	}
	return out
}
