// Command demo is tether's quick start (`make demo`): it runs the real tether binary on the
// embedded store with examples/demo/tether.yaml, three small sample instances on loopback, and
// — in place of Envoy — the Envoy-faithful test harness (internal/envoyharness), which asks
// tether over ext_proc where every request goes and takes its endpoints from tether over xDS.
// It then prints curl commands that show a cookie session sticking to one instance, a 429 when
// the instance's request slots are full, a new session landing on the standby instance when
// the others are full and the sessions on the standby coming back to it, and runs until Ctrl-C (SIGINT) or SIGTERM, when it stops everything it
// started and exits 0.
//
// The harness is a test tool standing in for Envoy so the demo needs nothing installed. It is
// never meant for production: put a real Envoy in front of tether (envoy/, examples/compose).
//
// Flags:
//
//	-tether PATH      the tether binary (default bin/tether; `make demo` builds it)
//	-config FILE      the tether config (default examples/demo/tether.yaml)
//	-listen ADDR      the data plane's address (default 127.0.0.1:8080)
//	-control ADDR     the demo's control endpoint (default 127.0.0.1:8089)
//	-random-ports     every listener and instance on a free port (tests run side by side)
//	-dir DIR          where cookie jars, the generated config and tether's log go (default:
//	                  $TMPDIR/tether-demo, removed at exit when the demo created it)
package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"net"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/tether-dev/tether/internal/envoyharness"
	"github.com/tether-dev/tether/internal/upstream"
	"github.com/tether-dev/tether/pkg/config"
	"github.com/tether-dev/tether/pkg/registry"
	"github.com/tether-dev/tether/pkg/wire"
	"github.com/tether-dev/tether/pkg/xds"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Args[1:], os.Stdout, os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, "demo:", err)
		os.Exit(1)
	}
}

type options struct {
	tether, config, listen, control, dir string
	randomPorts                          bool
}

// startTimeout bounds how long tether and the data plane may take to come up.
const startTimeout = 30 * time.Second

func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	flags := flag.NewFlagSet("demo", flag.ContinueOnError)
	flags.SetOutput(stderr)
	var o options
	flags.StringVar(&o.tether, "tether", "bin/tether", "the tether `binary`")
	flags.StringVar(&o.config, "config", "examples/demo/tether.yaml", "the tether config `file`")
	flags.StringVar(&o.listen, "listen", "127.0.0.1:8080", "the data plane's `address`")
	flags.StringVar(&o.control, "control", "127.0.0.1:8089", "the demo control endpoint's `address`")
	flags.StringVar(&o.dir, "dir", "", "`directory` for cookie jars, the generated config and tether's log (default: $TMPDIR/tether-demo, removed at exit if the demo made it)")
	flags.BoolVar(&o.randomPorts, "random-ports", false, "put every listener and instance on a free port")
	if err := flags.Parse(args); err != nil {
		return err
	}
	if o.randomPorts {
		o.listen, o.control = "127.0.0.1:0", "127.0.0.1:0"
	}
	if o.dir == "" {
		// A short, fixed path keeps the printed commands easy to read and copy.
		o.dir = filepath.Join(os.TempDir(), "tether-demo")
		if _, err := os.Stat(o.dir); errors.Is(err, fs.ErrNotExist) {
			defer func() { _ = os.RemoveAll(o.dir) }()
		}
		if err := os.MkdirAll(o.dir, 0o700); err != nil {
			return err
		}
	}

	cfg, err := config.Load(o.config)
	if err != nil {
		return err
	}
	services, instances := cfg.Registry()

	// The sample instances, on the config's ports (or free ones).
	ups := map[string]*upstream.Server{}
	var order []*upstream.Server
	defer func() {
		for _, u := range order {
			_ = u.Close()
		}
	}()
	for _, in := range instances {
		addr := in.HTTPAddr()
		if o.randomPorts {
			addr = net.JoinHostPort(in.Address, "0")
		}
		u, err := upstream.StartOn(in.ID, addr)
		if err != nil {
			return err
		}
		ups[in.Service+"/"+in.ID] = u
		order = append(order, u)
	}

	// tether itself, on a copy of the config carrying the real ports and a JSON log.
	runCfg := filepath.Join(o.dir, "tether.yaml")
	if err := writeRunConfig(o.config, runCfg, ups, o.randomPorts); err != nil {
		return err
	}
	logPath := filepath.Join(o.dir, "tether.log")
	t, err := startTether(o.tether, runCfg, logPath)
	if err != nil {
		return err
	}
	defer func() { _ = t.stop() }()
	addrs, err := t.waitServing(ctx, startTimeout)
	if err != nil {
		return err
	}

	// The stand-in data plane: routes built like tether's generated Envoy config, endpoints
	// from tether's xDS, ext_proc against tether.
	dpCtx, cancel := context.WithCancel(context.Background())
	defer cancel()
	rc, err := xds.RouteConfiguration(xds.RouteConfigName, services)
	if err != nil {
		return err
	}
	vhosts, err := envoyharness.RoutesFromConfig(rc, wire.ServiceMetadataKey)
	if err != nil {
		return err
	}
	x, err := envoyharness.WatchXDS(dpCtx, addrs.xds, xds.DefaultNodeID)
	if err != nil {
		return err
	}
	defer func() { _ = x.Close() }()
	if err := waitEndpoints(ctx, x, services, instances); err != nil {
		return err
	}
	h, err := envoyharness.New(addrs.extProc, x, vhosts,
		envoyharness.WithMessageTimeout(cfg.ExtProc.MessageTimeout),
		envoyharness.WithEarlyHeaderRemoval(cfg.ExtProc.DestinationHeader))
	if err != nil {
		return err
	}
	defer func() { _ = h.Close() }()
	dp, err := serveHTTP(o.listen, h)
	if err != nil {
		return err
	}
	defer dp.close()
	ctl, err := serveHTTP(o.control, controlHandler(order))
	if err != nil {
		return err
	}
	defer ctl.close()

	printIntro(stdout, o, cfg, instances, ups, dp.addr, ctl.addr, addrs, logPath)

	select {
	case <-ctx.Done():
	case err := <-t.exited:
		t.done, t.err = true, err
		if err == nil {
			err = errors.New("exit status 0")
		}
		return fmt.Errorf("tether exited: %w (log: %s)", err, logPath)
	}
	_, _ = fmt.Fprintln(stdout, "\nstopping: data plane, tether, sample instances")
	dp.close()
	ctl.close()
	_ = h.Close()
	if err := t.stop(); err != nil {
		return fmt.Errorf("tether: %w", err)
	}
	_, _ = fmt.Fprintln(stdout, "demo stopped")
	return nil
}

// writeRunConfig copies the config at src to dst with every listener on a free port (when
// random) and every instance's http port set to its sample server's, and the log as JSON (the
// demo reads tether's bound addresses from it). Comments and everything else stay as written.
func writeRunConfig(src, dst string, ups map[string]*upstream.Server, random bool) error {
	data, err := os.ReadFile(src)
	if err != nil {
		return err
	}
	var doc yaml.Node
	if err := yaml.Unmarshal(data, &doc); err != nil {
		return err
	}
	root := doc.Content[0]
	if random {
		l := mapping(root, "listeners")
		for _, k := range []string{"extProc", "xds", "api"} {
			set(l, k, "127.0.0.1:0")
		}
	}
	set(mapping(root, "log"), "format", "json")
	for _, svc := range get(root, "services").Content {
		name := get(svc, "name").Value
		for _, in := range get(svc, "instances").Content {
			u := ups[name+"/"+get(in, "id").Value]
			set(mapping(in, "ports"), "http", strconv.Itoa(u.Port()))
		}
	}
	out, err := yaml.Marshal(&doc)
	if err != nil {
		return err
	}
	return os.WriteFile(dst, out, 0o600)
}

// get returns the value of key in the mapping node m (nil when absent).
func get(m *yaml.Node, key string) *yaml.Node {
	for i := 0; i+1 < len(m.Content); i += 2 {
		if m.Content[i].Value == key {
			return m.Content[i+1]
		}
	}
	return nil
}

// mapping returns the mapping under key in m, adding an empty one when absent.
func mapping(m *yaml.Node, key string) *yaml.Node {
	if v := get(m, key); v != nil {
		v.Kind, v.Style, v.Tag = yaml.MappingNode, 0, "!!map"
		return v
	}
	v := &yaml.Node{Kind: yaml.MappingNode, Tag: "!!map"}
	m.Content = append(m.Content, &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!str", Value: key}, v)
	return v
}

// set sets key in the mapping m to the scalar value.
func set(m *yaml.Node, key, value string) {
	if v := get(m, key); v != nil {
		v.Kind, v.Tag, v.Value, v.Style = yaml.ScalarNode, "", value, 0
		return
	}
	m.Content = append(m.Content, &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!str", Value: key},
		&yaml.Node{Kind: yaml.ScalarNode, Value: value})
}

// tetherProc is the tether child process.
type tetherProc struct {
	cmd     *exec.Cmd
	serving chan serving
	exited  chan error
	err     error
	done    bool
}

// serving is what tether's "tether serving" log line says about its listeners.
type serving struct {
	api, extProc, xds string
}

func startTether(bin, cfgPath, logPath string) (*tetherProc, error) {
	logf, err := os.Create(logPath)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(bin, "serve", "-c", cfgPath)
	stderr, err := cmd.StderrPipe()
	if err != nil {
		_ = logf.Close()
		return nil, err
	}
	cmd.Stdout = logf
	if err := cmd.Start(); err != nil {
		_ = logf.Close()
		return nil, fmt.Errorf("start %s (make build): %w", bin, err)
	}
	t := &tetherProc{cmd: cmd, serving: make(chan serving, 1), exited: make(chan error, 1)}
	go func() {
		sc := bufio.NewScanner(stderr)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		for sc.Scan() {
			line := sc.Bytes()
			_, _ = logf.Write(append(line, '\n'))
			var rec struct {
				Msg               string
				API, ExtProc, XDS string
			}
			if json.Unmarshal(line, &rec) == nil && rec.Msg == "tether serving" {
				t.serving <- serving{api: rec.API, extProc: rec.ExtProc, xds: rec.XDS}
			}
		}
		_, _ = io.Copy(logf, stderr)
		t.exited <- cmd.Wait()
		_ = logf.Close()
	}()
	return t, nil
}

func (t *tetherProc) waitServing(ctx context.Context, timeout time.Duration) (serving, error) {
	select {
	case s := <-t.serving:
		return s, nil
	case err := <-t.exited:
		t.done, t.err = true, err
		if err == nil {
			err = errors.New("exit status 0")
		}
		return serving{}, fmt.Errorf("tether exited before serving: %w", err)
	case <-ctx.Done():
		return serving{}, ctx.Err()
	case <-time.After(timeout):
		return serving{}, errors.New("tether did not start serving in time")
	}
}

// stop asks tether to shut down (SIGINT, as Ctrl-C does) and waits for it to exit; a tether
// that does not stop within 15 s is killed. It is safe to call more than once.
func (t *tetherProc) stop() error {
	if t.done {
		return t.err
	}
	t.done = true
	_ = t.cmd.Process.Signal(os.Interrupt)
	select {
	case t.err = <-t.exited:
	case <-time.After(15 * time.Second):
		_ = t.cmd.Process.Kill()
		t.err = <-t.exited
	}
	return t.err
}

// waitEndpoints waits until the data plane's xDS view carries every instance of every service.
func waitEndpoints(ctx context.Context, x *envoyharness.XDSEndpoints, services []registry.Service, instances []registry.Instance) error {
	ctx, cancel := context.WithTimeout(ctx, startTimeout)
	defer cancel()
	want := map[string]int{}
	for _, in := range instances {
		want[in.Service]++
	}
	return x.Wait(ctx, func() bool {
		for _, svc := range services {
			if len(x.Addresses(svc.Name)) != want[svc.Name] {
				return false
			}
		}
		return true
	})
}

// server is an HTTP server on its own listener.
type server struct {
	addr string
	srv  *http.Server
}

func serveHTTP(addr string, h http.Handler) (*server, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, err
	}
	s := &server{addr: ln.Addr().String(), srv: &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}}
	go func() { _ = s.srv.Serve(ln) }()
	return s, nil
}

func (s *server) close() { _ = s.srv.Close() }

// controlHandler serves the demo's two control calls: GET /held?n=N waits (up to 30 s) until N
// requests are parked on the instances' /block path, and POST /release lets them all finish.
func controlHandler(ups []*upstream.Server) http.Handler {
	held := func() int64 {
		var n int64
		for _, u := range ups {
			n += u.Blocked()
		}
		return n
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /held", func(w http.ResponseWriter, r *http.Request) {
		n, err := strconv.ParseInt(r.URL.Query().Get("n"), 10, 64)
		if err != nil || n < 1 {
			http.Error(w, "n: a positive number of requests", http.StatusBadRequest)
			return
		}
		deadline := time.After(30 * time.Second)
		tick := time.NewTicker(5 * time.Millisecond)
		defer tick.Stop()
		for held() < n {
			select {
			case <-r.Context().Done():
				return
			case <-deadline:
				http.Error(w, fmt.Sprintf("%d of %d requests held", held(), n), http.StatusGatewayTimeout)
				return
			case <-tick.C:
			}
		}
		_, _ = fmt.Fprintf(w, "%d requests held\n", held())
	})
	mux.HandleFunc("POST /release", func(w http.ResponseWriter, _ *http.Request) {
		n := held()
		for _, u := range ups {
			u.Release()
		}
		_, _ = fmt.Fprintf(w, "released %d requests\n", n)
	})
	return mux
}

func printIntro(w io.Writer, o options, cfg *config.Config, instances []registry.Instance, ups map[string]*upstream.Server, dpAddr, ctlAddr string, addrs serving, logPath string) {
	apiAddr := addrs.api
	svc := cfg.Services[0]
	dp, ctl := "http://"+dpAddr, "http://"+ctlAddr
	jar := func(name string) string { return filepath.Join(o.dir, name) }
	var ins []string
	for _, in := range instances {
		s := in.ID + " " + ups[in.Service+"/"+in.ID].Addr()
		if in.State != registry.StateActive {
			s += " (" + string(in.State) + ")"
		}
		ins = append(ins, s)
	}
	var b strings.Builder
	p := func(format string, a ...any) { fmt.Fprintf(&b, format+"\n", a...) }
	p("tether demo: tether (embedded store, %s), three sample instances and a stand-in data plane, all on loopback.", o.config)
	p("")
	p("The data plane here is tether's Envoy-faithful TEST HARNESS standing in for Envoy. It is for")
	p("trying tether and for tests, never for production: put Envoy in front of tether (envoy/,")
	p("examples/compose/).")
	p("")
	p("  dashboard   http://%s/ui/   (open it in a browser: slots, sessions, scale events, live)", apiAddr)
	p("  data plane  %s   (where Envoy would be: send your requests here)", dp)
	p("  tether API  http://%s   (curl http://%s/v1/services/%s/instances shows the slots)", apiAddr, apiAddr, svc.Name)
	p("  instances   %s", strings.Join(ins, ", "))
	p("  control     %s   (the demo's own: holds and releases the sample instances' requests, step 2)", ctl)
	p("  tether      ext_proc %s, xDS %s (the data plane asks and subscribes there)", addrs.extProc, addrs.xds)
	p("  tether log  %s", logPath)
	p("")
	p("Each instance takes %d sessions and %d requests in flight. Try (Ctrl-C stops the demo):", svc.SessionsPerInstance, svc.RequestSlotsPerInstance)
	p("")
	p("# 1. A cookie session sticks: alice's first request gets a session cookie, the next ones follow it.")
	p("curl -s -o /dev/null -c %s -w '%%{http_code} %%header{x-upstream-instance}  set-cookie: %%header{set-cookie}\\n' %s/", jar("alice"), dp)
	p("for i in 1 2 3; do curl -s -b %s %s/; done", jar("alice"), dp)
	p("")
	p("# 2. Two of alice's requests wait on the instance and fill its request slots; the next one gets 429.")
	p("curl -s -o /dev/null -b %s %s/block & curl -s -o /dev/null -b %s %s/block &", jar("alice"), dp, jar("alice"), dp)
	p("curl -s '%s/held?n=%d'", ctl, svc.RequestSlotsPerInstance)
	p("curl -s -o /dev/null -b %s -w '%%{http_code} retry-after: %%header{retry-after}\\n' %s/", jar("alice"), dp)
	p("curl -s -X POST %s/release; wait", ctl)
	p("")
	p("# 3. New sessions fill web-1 and web-2 first; when both are full the next lands on the standby web-3 (scale-out).")
	p("#    Each is provisional until its client sends the cookie back; one that never does frees its slot after")
	p("#    newSessions.provisionalIdleTimeout (%s here, 30s by default) and shows Expired.", shortDuration(cfg.NewSessions.ProvisionalIdleTimeout))
	p("for u in bob carol dave erin; do curl -s -c %s/$u %s/; done", o.dir, dp)
	p("")
	p("# 4. frank fills web-3; erin and frank come back with their cookies and stay on web-3: a session keeps")
	p("#    the standby instance scale-out gave it (and is no longer provisional).")
	p("curl -s -c %s/frank %s/; for u in erin frank; do curl -s -o /dev/null -b %s/$u -w '%%{http_code} %%header{x-upstream-instance}\\n' %s/; done", o.dir, dp, o.dir, dp)
	_, _ = io.WriteString(w, b.String())
}

// shortDuration prints whole minutes as "5m" rather than time.Duration's "5m0s".
func shortDuration(d time.Duration) string {
	if d >= time.Minute && d%time.Minute == 0 {
		return strconv.Itoa(int(d/time.Minute)) + "m"
	}
	return d.String()
}
