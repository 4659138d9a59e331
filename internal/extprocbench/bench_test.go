package extprocbench_test

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/types/known/structpb"
)

// Rounds and exchanges per round; EXTPROC_BENCH_ROUNDS and EXTPROC_BENCH_ROUND_SIZE override.
const (
	defaultRounds    = 6
	defaultRoundSize = 3000
)

// tetherConfig is one cookie service over four instances (nothing needs to listen on them:
// no health checks, the benchmark never proxies) and ext_proc alone on an ephemeral port. The
// API listener (%s) is on only when profiling (EXTPROC_BENCH_PROFILE): it serves /debug/pprof.
// Everything else is tether serve's default, the GC heap-goal floor (runtime.gcHeapFloorMiB)
// included; the null server runs on Go's default GC pacing.
const tetherConfig = `apiVersion: tether/v1
registry: {allowedNetworks: [127.0.0.1/32]}
listeners: {extProc: "127.0.0.1:0", xds: "", api: "%s", sip: ""}
log: {format: json, level: info}
services:
- name: web
  affinity: cookie
  sessionsPerInstance: 200
  requestSlotsPerInstance: 10000
  instances:
  - {id: i1, address: 127.0.0.1, ports: {http: 8001}}
  - {id: i2, address: 127.0.0.1, ports: {http: 8002}}
  - {id: i3, address: 127.0.0.1, ports: {http: 8003}}
  - {id: i4, address: 127.0.0.1, ports: {http: 8004}}
`

// server is one ext_proc server process.
type server struct {
	name string
	cmd  *exec.Cmd
	addr string
	cc   []*grpc.ClientConn
	reqs []*extprocv3.ProcessingRequest // request_headers messages to send, round robin
}

// cpu returns the process's user + system CPU time so far.
func (s *server) cpu(b *testing.B) time.Duration {
	b.Helper()
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", s.cmd.Process.Pid))
	if err != nil {
		b.Fatal(err)
	}
	// Fields after the command name, which is in parentheses and may contain spaces.
	f := strings.Fields(string(raw[strings.LastIndexByte(string(raw), ')')+2:]))
	ut, _ := strconv.ParseInt(f[11], 10, 64) // utime, field 14
	st, _ := strconv.ParseInt(f[12], 10, 64) // stime, field 15
	return time.Duration(ut+st) * time.Second / clockTicks
}

// peakRSS returns the process's peak resident set size so far (VmHWM), in MiB.
func (s *server) peakRSS(b *testing.B) float64 {
	b.Helper()
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", s.cmd.Process.Pid))
	if err != nil {
		b.Fatal(err)
	}
	for line := range strings.Lines(string(raw)) {
		if v, ok := strings.CutPrefix(line, "VmHWM:"); ok {
			kb, _ := strconv.ParseFloat(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 64)
			return kb / 1024
		}
	}
	b.Fatalf("%s: no VmHWM in /proc/%d/status", s.name, s.cmd.Process.Pid)
	return 0
}

// clockTicks is sysconf(_SC_CLK_TCK) on Linux.
const clockTicks = 100

func build(b *testing.B, dir, out, pkg string) string {
	b.Helper()
	path := filepath.Join(dir, out)
	cmd := exec.Command("go", "build", "-o", path, pkg)
	cmd.Dir = repoRoot(b)
	if msg, err := cmd.CombinedOutput(); err != nil {
		b.Fatalf("go build %s: %v\n%s", pkg, err, msg)
	}
	return path
}

func repoRoot(b *testing.B) string {
	b.Helper()
	wd, err := os.Getwd()
	if err != nil {
		b.Fatal(err)
	}
	return filepath.Join(wd, "..", "..")
}

// start runs bin with args and returns once addr(line) found the bound address on its output.
func start(b *testing.B, name, bin string, args []string, fromStderr bool, addr func(line string) string) *server {
	b.Helper()
	cmd := exec.Command(bin, args...)
	var pipe io.ReadCloser
	var err error
	if fromStderr {
		pipe, err = cmd.StderrPipe()
	} else {
		pipe, err = cmd.StdoutPipe()
	}
	if err != nil {
		b.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	found := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(pipe)
		sent := false
		for sc.Scan() {
			if a := addr(sc.Text()); a != "" && !sent {
				found <- a
				sent = true
			}
		}
	}()
	select {
	case a := <-found:
		return &server{name: name, cmd: cmd, addr: a}
	case <-time.After(60 * time.Second):
		b.Fatalf("%s did not report its address", name)
		return nil
	}
}

func (s *server) dial(b *testing.B, conns int) {
	b.Helper()
	for range conns {
		cc, err := grpc.NewClient(s.addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { _ = cc.Close() })
		s.cc = append(s.cc, cc)
	}
}

func headers(kv ...string) *corev3.HeaderMap {
	m := &corev3.HeaderMap{}
	for i := 0; i+1 < len(kv); i += 2 {
		m.Headers = append(m.Headers, &corev3.HeaderValue{Key: kv[i], RawValue: []byte(kv[i+1])})
	}
	return m
}

// requestHeaders is request_headers as Envoy sends it for a browser GET: pseudo headers,
// typical browser headers, x-request-id, the request attributes tether's config asks for.
func requestHeaders(cookie, peer string) *extprocv3.ProcessingRequest {
	kv := []string{":authority", "app.example", ":path", "/index.html", ":method", "GET", ":scheme", "https",
		"user-agent", "Mozilla/5.0 (X11; Linux x86_64) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/130.0 Safari/537.36",
		"accept", "text/html,application/xhtml+xml,application/xml;q=0.9,*/*;q=0.8",
		"accept-language", "en-US,en;q=0.9", "accept-encoding", "gzip, deflate, br",
		"x-forwarded-proto", "https", "x-request-id", "5f0c8a4e-4a7b-4f4e-9c55-3b1d2f6e8a90"}
	if cookie != "" {
		kv = append(kv, "cookie", "_ga=GA1.2.1; "+cookie)
	}
	return &extprocv3.ProcessingRequest{
		Request: &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: &extprocv3.HttpHeaders{
			Headers: headers(kv...), EndOfStream: true,
		}},
		Attributes: map[string]*structpb.Struct{"envoy.filters.http.ext_proc": {Fields: map[string]*structpb.Value{
			"source.address": structpb.NewStringValue(peer + ":40001"),
			"source.port":    structpb.NewNumberValue(40001),
			"request.id":     structpb.NewStringValue("5f0c8a4e-4a7b-4f4e-9c55-3b1d2f6e8a90"),
		}}},
		ProtocolConfig: &extprocv3.ProtocolConfiguration{},
	}
}

func responseHeaders(served string) *extprocv3.ProcessingRequest {
	return &extprocv3.ProcessingRequest{
		Request: &extprocv3.ProcessingRequest_ResponseHeaders{ResponseHeaders: &extprocv3.HttpHeaders{
			Headers: headers(":status", "200", "content-type", "text/html; charset=utf-8", "content-length", "5120",
				"cache-control", "no-cache", "date", "Tue, 01 Dec 2026 09:00:00 GMT", "x-envoy-upstream-service-time", "1"),
		}},
		MetadataContext: &corev3.Metadata{FilterMetadata: map[string]*structpb.Struct{"envoy.lb": {Fields: map[string]*structpb.Value{
			"x-gateway-destination-endpoint-served": structpb.NewStringValue(served),
		}}}},
	}
}

// instanceAddrs are the endpoints of tetherConfig's instances.
var instanceAddrs = []string{"127.0.0.1:8001", "127.0.0.1:8002", "127.0.0.1:8003", "127.0.0.1:8004"}

// servedHeaders are the response_headers messages Envoy sends after proxying to each instance:
// its override_host policy reports the host it used (selected_host_key), the one the
// request_headers answer chose. Answers without a destination (the null server's) get the
// first instance's, so both servers receive messages of the same size.
type servedHeaders map[string]*extprocv3.ProcessingRequest

func newServedHeaders() servedHeaders {
	m := servedHeaders{}
	for _, a := range instanceAddrs {
		m[a] = responseHeaders(a)
	}
	return m
}

// after returns the response_headers message for a request_headers answer.
func (m servedHeaders) after(r1 *extprocv3.ProcessingResponse) *extprocv3.ProcessingRequest {
	for _, h := range r1.GetRequestHeaders().GetResponse().GetHeaderMutation().GetSetHeaders() {
		if h.GetHeader().GetKey() == "x-gateway-destination-endpoint" {
			if r := m[string(h.GetHeader().GetRawValue())]; r != nil {
				return r
			}
		}
	}
	return m[instanceAddrs[0]]
}

// exchange runs one HTTP exchange's side stream; it returns the request_headers answer.
func exchange(ctx context.Context, c extprocv3.ExternalProcessorClient, req *extprocv3.ProcessingRequest, served servedHeaders) (*extprocv3.ProcessingResponse, *extprocv3.ProcessingResponse, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	st, err := c.Process(ctx)
	if err != nil {
		return nil, nil, err
	}
	if err := st.Send(req); err != nil {
		return nil, nil, err
	}
	r1, err := st.Recv()
	if err != nil {
		return nil, nil, err
	}
	if err := st.Send(served.after(r1)); err != nil {
		return nil, nil, err
	}
	r2, err := st.Recv()
	if err != nil {
		return nil, nil, err
	}
	if err := st.CloseSend(); err != nil {
		return nil, nil, err
	}
	if _, err := st.Recv(); !errors.Is(err, io.EOF) {
		return nil, nil, fmt.Errorf("end of stream: %w", err)
	}
	return r1, r2, nil
}

// seedSessions opens n cookie sessions on tether and returns requests carrying their cookies.
func seedSessions(b *testing.B, s *server, n int) {
	b.Helper()
	c := extprocv3.NewExternalProcessorClient(s.cc[0])
	for i := range n {
		// One client address per session: tether rate-limits new sessions per address.
		peer := fmt.Sprintf("10.%d.%d.%d", i>>16&255, i>>8&255, i&255+1)
		r1, r2, err := exchange(context.Background(), c, requestHeaders("", peer), newServedHeaders())
		if err != nil || r1.GetImmediateResponse() != nil {
			b.Fatalf("seeding session %d: %v %v", i, r1, err)
		}
		cookie := ""
		for _, h := range r2.GetResponseHeaders().GetResponse().GetHeaderMutation().GetSetHeaders() {
			if h.GetHeader().GetKey() == "set-cookie" {
				cookie, _, _ = strings.Cut(string(h.GetHeader().GetRawValue()), ";")
			}
		}
		if cookie == "" {
			b.Fatal("seeding: no session cookie")
		}
		s.reqs = append(s.reqs, requestHeaders(cookie, peer))
	}
}

// round runs n exchanges on conc goroutines and returns the wall time and latencies.
func round(b *testing.B, s *server, conc, n int) (time.Duration, []time.Duration) {
	clients := make([]extprocv3.ExternalProcessorClient, len(s.cc))
	for i, cc := range s.cc {
		clients[i] = extprocv3.NewExternalProcessorClient(cc)
	}
	served := newServedHeaders()
	lat := make([]time.Duration, n)
	var next atomic.Int64
	var wg sync.WaitGroup
	var failed atomic.Value
	t0 := time.Now()
	for w := range conc {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c := clients[w%len(clients)]
			for i := int(next.Add(1) - 1); i < n; i = int(next.Add(1) - 1) {
				start := time.Now()
				r1, _, err := exchange(context.Background(), c, s.reqs[i%len(s.reqs)], served)
				if err == nil && r1.GetImmediateResponse() != nil {
					err = fmt.Errorf("rejected: %v", r1.GetImmediateResponse())
				}
				if err != nil {
					failed.Store(err)
					return
				}
				lat[i] = time.Since(start)
			}
		}()
	}
	wg.Wait()
	if err, _ := failed.Load().(error); err != nil {
		b.Fatalf("%s: %v", s.name, err)
	}
	return time.Since(t0), lat
}

func envInt(name string, def int) int {
	if v, err := strconv.Atoi(os.Getenv(name)); err == nil && v > 0 {
		return v
	}
	return def
}

// loadAvg is the 1-minute load average (/proc/loadavg), or -1.
func loadAvg() float64 {
	raw, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return -1
	}
	f := strings.Fields(string(raw))
	if len(f) == 0 {
		return -1
	}
	v, err := strconv.ParseFloat(f[0], 64)
	if err != nil {
		return -1
	}
	return v
}

// fetch saves GET http://addr/path into file.
func fetch(b *testing.B, addr, path, file string) {
	b.Helper()
	resp, err := http.Get("http://" + addr + path)
	if err != nil {
		b.Fatalf("fetch %s: %v", path, err)
	}
	defer func() { _ = resp.Body.Close() }()
	raw, err := io.ReadAll(resp.Body)
	if err == nil {
		err = os.WriteFile(file, raw, 0o600)
	}
	if err != nil {
		b.Fatalf("fetch %s: %v", path, err)
	}
}

// profile fetches a CPU profile of secs seconds from tether's /debug/pprof into path, in the
// background; wait blocks until it is written.
func profile(b *testing.B, api, path string, secs int) (wait func()) {
	b.Helper()
	done := make(chan struct{})
	go func() {
		defer close(done)
		resp, err := http.Get(fmt.Sprintf("http://%s/debug/pprof/profile?seconds=%d", api, secs))
		if err != nil {
			b.Errorf("profile: %v", err)
			return
		}
		defer func() { _ = resp.Body.Close() }()
		raw, err := io.ReadAll(resp.Body)
		if err == nil && resp.StatusCode != http.StatusOK {
			err = fmt.Errorf("status %s: %s", resp.Status, raw)
		}
		if err == nil {
			err = os.WriteFile(path, raw, 0o600)
		}
		if err != nil {
			b.Errorf("profile: %v", err)
		}
	}()
	return func() { <-done }
}

// memStats reads a server's runtime.MemStats totals (bytes allocated, allocations) over its
// debug endpoint: tether's /metrics (Prometheus Go collector) or nullproc's /debug/vars.
func memStats(b *testing.B, kind, addr string) (bytes, mallocs, gcs float64) {
	b.Helper()
	path := map[string]string{"tether": "/metrics", "null": "/debug/vars"}[kind]
	resp, err := http.Get("http://" + addr + path)
	if err != nil {
		b.Fatalf("%s memstats: %v", kind, err)
	}
	defer func() { _ = resp.Body.Close() }()
	raw, err := io.ReadAll(resp.Body)
	if err != nil {
		b.Fatalf("%s memstats: %v", kind, err)
	}
	if kind == "null" {
		var v struct {
			Memstats struct{ TotalAlloc, Mallocs, NumGC float64 } `json:"memstats"`
		}
		if err := json.Unmarshal(raw, &v); err != nil {
			b.Fatalf("null memstats: %v", err)
		}
		return v.Memstats.TotalAlloc, v.Memstats.Mallocs, v.Memstats.NumGC
	}
	for _, line := range strings.Split(string(raw), "\n") {
		if v, ok := strings.CutPrefix(line, "go_memstats_alloc_bytes_total "); ok {
			bytes, _ = strconv.ParseFloat(v, 64)
		}
		if v, ok := strings.CutPrefix(line, "go_memstats_mallocs_total "); ok {
			mallocs, _ = strconv.ParseFloat(v, 64)
		}
		if v, ok := strings.CutPrefix(line, "go_gc_duration_seconds_count "); ok {
			gcs, _ = strconv.ParseFloat(v, 64)
		}
	}
	return bytes, mallocs, gcs
}

func median(v []float64) float64 {
	v = slices.Clone(v)
	slices.Sort(v)
	return v[len(v)/2]
}

// BenchmarkCrossProcess: tether and the null server, each its own process, driven in
// alternating rounds at concurrency 1, 16 and 64 by this process. Run once (-benchtime 1x):
// the rounds are the measurement. Both servers run grpc-go with tether's ext_proc server
// options (extproc.ServerOptions), so the ratios measure what tether does per exchange, not
// its transport settings.
//
// Reported per concurrency: each server's median exchanges/s over the rounds, p50/p99 of all
// exchanges, CPU µs per exchange over all rounds; the ratios tether/null of those medians and
// totals, and the spread of the per-round ratios (each round of tether paired with the null
// round next to it: min and max); the 1-minute load average before and after.
//
// EXTPROC_BENCH_PROFILE=dir also writes CPU profiles of both processes for each concurrency
// (dir/tether-c<N>.pprof, dir/null-c<N>.pprof; allocation profiles dir/*-allocs-c<N>.pprof;
// tether's API listener and nullproc -pprof serve
// /debug/pprof), e.g. for go tool pprof -diff_base null-c16.pprof tether-c16.pprof, and reports
// each server's bytes and allocations per exchange over the rounds (runtime.MemStats; the
// profiler's own allocations included, small).
//
// EXTPROC_BENCH_BASELINE=/path/to/old-tether runs that build too, reported as old.
func BenchmarkCrossProcess(b *testing.B) {
	dir := os.Getenv("EXTPROC_BENCH_BIN_DIR") // keep the binaries (e.g. for perf report)
	if dir == "" {
		dir = b.TempDir()
	}
	profDir := os.Getenv("EXTPROC_BENCH_PROFILE")
	tetherBin := build(b, dir, "tether", "./cmd/tether")
	nullBin := build(b, dir, "nullproc", "./internal/extprocbench/nullproc")
	cfg := filepath.Join(dir, "tether.yaml")
	apiAddr := ""
	if profDir != "" {
		apiAddr = "127.0.0.1:0"
	}
	if err := os.WriteFile(cfg, []byte(fmt.Sprintf(tetherConfig, apiAddr)), 0o600); err != nil {
		b.Fatal(err)
	}
	var tetherAPI string
	tether := start(b, "tether", tetherBin, []string{"serve", "-c", cfg}, true, func(line string) string {
		var m struct {
			Msg     string `json:"msg"`
			ExtProc string `json:"extProc"`
			API     string `json:"api"`
		}
		if json.Unmarshal([]byte(line), &m) == nil && m.Msg == "tether serving" {
			tetherAPI = m.API
			return m.ExtProc
		}
		return ""
	})
	var nullArgs []string
	var nullAPI string
	if profDir != "" {
		nullArgs = []string{"-pprof", "127.0.0.1:0"}
	}
	null := start(b, "null", nullBin, nullArgs, false, func(line string) string {
		if a, ok := strings.CutPrefix(line, "pprof "); ok {
			nullAPI = strings.TrimSpace(a)
			return ""
		}
		return strings.TrimSpace(line)
	})
	// EXTPROC_BENCH_ALT="flags": a second null server with those nullproc flags (e.g.
	// -grpc-defaults, or a server option to try) runs in the same rounds, reported as alt.
	var alt *server
	if flags := os.Getenv("EXTPROC_BENCH_ALT"); flags != "" {
		alt = start(b, "alt", nullBin, strings.Fields(flags), false, func(line string) string {
			if strings.HasPrefix(line, "pprof ") {
				return ""
			}
			return strings.TrimSpace(line)
		})
	}
	// EXTPROC_BENCH_BASELINE=/path/to/tether: an older tether binary (go build -o old
	// ./cmd/tether at that commit) serves the same config in the same rounds, reported as old,
	// with tether/old ratios: a before/after comparison in one run.
	var old *server
	if bin := os.Getenv("EXTPROC_BENCH_BASELINE"); bin != "" {
		old = start(b, "old", bin, []string{"serve", "-c", cfg}, true, func(line string) string {
			var m struct {
				Msg     string `json:"msg"`
				ExtProc string `json:"extProc"`
			}
			if json.Unmarshal([]byte(line), &m) == nil && m.Msg == "tether serving" {
				return m.ExtProc
			}
			return ""
		})
	}
	rounds := envInt("EXTPROC_BENCH_ROUNDS", defaultRounds)
	size := envInt("EXTPROC_BENCH_ROUND_SIZE", defaultRoundSize)
	for _, conc := range []int{1, 16, 64} {
		b.Run(fmt.Sprintf("c=%d", conc), func(b *testing.B) {
			n := size
			if conc == 1 {
				n = max(1, size/3) // one exchange at a time: keep the round's duration alike
			}
			conns := max(1, conc/32) // Envoy: a connection per worker; 100 streams per connection
			servers := []*server{
				{name: "null", cmd: null.cmd, addr: null.addr},
				{name: "tether", cmd: tether.cmd, addr: tether.addr},
			}
			if alt != nil {
				servers = append(servers, &server{name: "alt", cmd: alt.cmd, addr: alt.addr})
			}
			if old != nil {
				servers = append(servers, &server{name: "old", cmd: old.cmd, addr: old.addr})
			}
			for _, s := range servers {
				s.dial(b, conns)
			}
			seedSessions(b, servers[1], 256)
			for _, s := range servers {
				if s.name == "old" {
					seedSessions(b, s, 256) // its own sessions: messages of the same size
					continue
				}
				s.reqs = servers[1].reqs // the same messages to all
			}
			type tally struct {
				rates, cpus []float64 // per round: exchanges/s, CPU µs per exchange
				lat         []time.Duration
				cpu         time.Duration
				n           int
			}
			tallies := make([]tally, len(servers))
			// Warm both up; the warm-up pace sizes the profile.
			var warm time.Duration
			for _, s := range servers {
				d, _ := round(b, s, conc, n/4)
				warm += d
			}
			load0 := loadAvg()
			var mem0 [2][3]float64 // null, tether: bytes, mallocs, GC cycles
			if profDir != "" {
				mem0[0][0], mem0[0][1], mem0[0][2] = memStats(b, "null", nullAPI)
				mem0[1][0], mem0[1][1], mem0[1][2] = memStats(b, "tether", tetherAPI)
			}
			var waitProfile func()
			t0 := time.Now()
			for range b.N {
				for r := range rounds {
					if r == 0 && profDir != "" {
						// Long enough for every round at the warm-up's pace (both servers).
						secs := int(4*float64(rounds)*warm.Seconds()) + 1
						w1 := profile(b, tetherAPI, filepath.Join(profDir, fmt.Sprintf("tether-c%d.pprof", conc)), secs)
						w2 := profile(b, nullAPI, filepath.Join(profDir, fmt.Sprintf("null-c%d.pprof", conc)), secs)
						waitProfile = func() { w1(); w2() }
					}
					for k := range servers {
						i := (k + r) % len(servers) // alternate which goes first
						s := servers[i]
						c0 := s.cpu(b)
						d, lat := round(b, s, conc, n)
						c := s.cpu(b) - c0
						tallies[i].cpu += c
						tallies[i].cpus = append(tallies[i].cpus, float64(c.Microseconds())/float64(n))
						tallies[i].rates = append(tallies[i].rates, float64(n)/d.Seconds())
						tallies[i].lat = append(tallies[i].lat, lat...)
						tallies[i].n += n
					}
				}
			}
			elapsed := time.Since(t0)
			load1 := loadAvg()
			if profDir != "" {
				for i, s := range servers[:2] {
					bytes, mallocs, gcs := memStats(b, s.name, map[string]string{"null": nullAPI, "tether": tetherAPI}[s.name])
					n := float64(tallies[i].n)
					b.ReportMetric((bytes-mem0[i][0])/n, s.name+"-B/exchange")
					b.ReportMetric((mallocs-mem0[i][1])/n, s.name+"-allocs/exchange")
					b.ReportMetric(1000*(gcs-mem0[i][2])/n, s.name+"-GCs/1000exchanges")
				}
				// Allocation profiles since start (seeding and warm-up included).
				fetch(b, tetherAPI, "/debug/pprof/allocs", filepath.Join(profDir, fmt.Sprintf("tether-allocs-c%d.pprof", conc)))
				fetch(b, nullAPI, "/debug/pprof/allocs", filepath.Join(profDir, fmt.Sprintf("null-allocs-c%d.pprof", conc)))
			}
			if waitProfile != nil {
				waitProfile()
			}
			med := map[string]float64{}
			cpu := map[string]float64{}
			for i, s := range servers {
				t := &tallies[i]
				slices.Sort(t.lat)
				med[s.name] = median(t.rates)
				cpu[s.name] = float64(t.cpu.Microseconds()) / float64(t.n)
				b.ReportMetric(med[s.name], s.name+"-exchanges/s")
				b.ReportMetric(float64(t.lat[len(t.lat)/2].Microseconds()), s.name+"-p50-µs")
				b.ReportMetric(float64(t.lat[len(t.lat)*99/100].Microseconds()), s.name+"-p99-µs")
				b.ReportMetric(cpu[s.name], s.name+"-cpu-µs/exchange")
				b.ReportMetric(s.peakRSS(b), s.name+"-peak-RSS-MiB") // since the process started
			}
			var rateRatios, cpuRatios []float64
			for r := range tallies[0].rates {
				rateRatios = append(rateRatios, tallies[1].rates[r]/tallies[0].rates[r])
				if tallies[0].cpus[r] > 0 {
					cpuRatios = append(cpuRatios, tallies[1].cpus[r]/tallies[0].cpus[r])
				}
			}
			b.ReportMetric(med["tether"]/med["null"], "tether/null-throughput")
			b.ReportMetric(cpu["tether"]/cpu["null"], "tether/null-cpu")
			if alt != nil {
				b.ReportMetric(med["alt"]/med["null"], "alt/null-throughput")
				b.ReportMetric(cpu["alt"]/cpu["null"], "alt/null-cpu")
			}
			if old != nil {
				b.ReportMetric(med["old"]/med["null"], "old/null-throughput")
				b.ReportMetric(cpu["old"]/cpu["null"], "old/null-cpu")
				b.ReportMetric(cpu["tether"]/cpu["old"], "tether/old-cpu")
			}
			b.ReportMetric(load0, "loadavg-before")
			b.ReportMetric(load1, "loadavg-after")
			b.Logf("c=%d: %d rounds of %d exchanges each in %v; per-round tether/null throughput %.2f–%.2f (median %.2f), CPU %.2f–%.2f (median %.2f); load average %.2f → %.2f",
				conc, len(rateRatios), n, elapsed.Round(time.Millisecond), slices.Min(rateRatios), slices.Max(rateRatios), median(rateRatios),
				slices.Min(cpuRatios), slices.Max(cpuRatios), median(cpuRatios), load0, load1)
		})
	}
}
