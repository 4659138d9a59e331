package sipdecide_test

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime/pprof"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tether-dev/tether/pkg/affinity"
	"github.com/tether-dev/tether/pkg/affinity/affinitytest"
	"github.com/tether-dev/tether/pkg/calls"
	"github.com/tether-dev/tether/pkg/config"
	"github.com/tether-dev/tether/pkg/dcr/dcrtest"
	"github.com/tether-dev/tether/pkg/gcfloor"
	"github.com/tether-dev/tether/pkg/registry"
	"github.com/tether-dev/tether/pkg/session"
	"github.com/tether-dev/tether/pkg/session/memstore"
	"github.com/tether-dev/tether/pkg/sipdecide"
	"github.com/tether-dev/tether/pkg/status"
)

// serveEnv makes the test binary a server process for BenchmarkDecideVsTrivialHTTP:
// "tether" serves the decision endpoint over a real engine, "trivial" reads the body and
// answers a constant. The process prints its address and serves until stdin closes.
const serveEnv = "TETHER_SIPDECIDE_BENCH_SERVE"

// profileEnv, when set for the benchmark, makes each server process write a CPU profile of
// its whole run to "<value>.<server>.pprof" (go tool pprof reads it with the test binary).
const profileEnv = "TETHER_SIPDECIDE_BENCH_CPUPROFILE"

func TestBenchServerProcess(t *testing.T) {
	kind := os.Getenv(serveEnv)
	if kind == "" {
		t.Skip("only a server process for BenchmarkDecideVsTrivialHTTP")
	}
	var h http.Handler
	var srv *http.Server
	if kind == "tether" || kind == "calls" {
		// The process settings of tether serve (cmd/tether planGC): the default heap-goal floor
		// unless GOGC is set. The trivial server keeps Go's defaults.
		if os.Getenv("GOGC") == "" {
			defer gcfloor.Start(uint64(config.DefaultGCHeapFloorMiB)<<20, 100).Stop()
		}
	}
	switch kind {
	case "tether":
		// tether serve's default: a call tracker, "voice" not tracked (calls.track false).
		srv = productionServer(t, calls.New())
	case "calls":
		// The call-load and failover endpoints: calls tracked for "voice", no cap.
		tr := calls.New()
		tr.SetCap("voice", 0)
		srv = productionServer(t, tr)
	case "trivial":
		h = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			_, _ = io.Copy(io.Discard, r.Body)
			w.Header().Set("Content-Type", "text/plain; charset=utf-8")
			_, _ = io.WriteString(w, "sip:192.0.2.1:5060")
		})
	default:
		t.Fatalf("unknown server %q", kind)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	if srv == nil {
		srv = &http.Server{Handler: h, ReadHeaderTimeout: time.Minute}
	}
	go func() { _ = srv.Serve(ln) }()
	if prefix := os.Getenv(profileEnv); prefix != "" {
		f, err := os.Create(prefix + "." + kind + ".pprof")
		if err != nil {
			t.Fatal(err)
		}
		if err := pprof.StartCPUProfile(f); err != nil {
			t.Fatal(err)
		}
		defer func() { pprof.StopCPUProfile(); _ = f.Close() }()
	}
	fmt.Printf("ADDR %s\n", ln.Addr())
	_, _ = io.Copy(io.Discard, os.Stdin)
	_ = srv.Close()
}

// productionServer is the decision endpoint as tether serve builds it (cmd/tether/services.go):
// the engine behind the metrics' timing wrapper, the handler with a logger and the call tracker,
// and the endpoint's http.Server with its timeouts.
func productionServer(t testing.TB, tr *calls.Tracker) *http.Server {
	f := benchFixture(t)
	outcomes := status.NewOutcomes()
	a := status.New(f.Registry, f.Engine, status.WithOutcomes(outcomes), status.WithCalls(tr.Loads))
	decider := status.NewMetrics(a, nil, outcomes).TimedDecider(f.Engine, f.Registry)
	log := slog.New(slog.NewTextHandler(io.Discard, nil)).With("component", "sipdecide")
	return sipdecide.NewServer(sipdecide.NewHandler(decider, sipdecide.WithLogger(log), sipdecide.WithCalls(tr)), log)
}

// benchFixture is the engine of a bench server: the example DCR rules over five instances, its
// background loops at tether's default intervals (the test fixture's 5 ms ones would be work a
// running tether does not do), on the wall clock as in tether serve.
func benchFixture(t testing.TB) *affinitytest.Fixture {
	path := filepath.Join(t.TempDir(), "data-centric-rules.xml")
	if err := os.WriteFile(path, []byte(dcrtest.ExampleRules), 0o644); err != nil {
		t.Fatal(err)
	}
	svc := affinitytest.Service("voice", registry.AffinityHash)
	svc.DCRFile = path
	return affinitytest.New(t, []registry.Service{svc}, affinitytest.Instances("voice", 5),
		affinitytest.WithEngineOptions(affinity.WithSweepInterval(affinity.DefaultSweepInterval), affinity.WithClock(time.Now)),
		affinitytest.WithStoreOptions(memstore.WithReapInterval(session.DefaultReapInterval), memstore.WithClock(time.Now)))
}

type benchServer struct {
	cmd   *exec.Cmd
	stdin io.WriteCloser
	base  string // ".../v1/sip/voice/"
	url   string // the decision endpoint
}

// baselineEnv, when set for BenchmarkDecideVsTrivialHTTP or BenchmarkCallEndpointsHTTP, names another build of this test
// binary (e.g. of the previous commit: go test -c -o old.test ./pkg/sipdecide) whose server
// runs beside this one's in alternating rounds, for a before/after ratio in one run.
const baselineEnv = "TETHER_SIPDECIDE_BENCH_BASELINE"

func startBenchServer(b *testing.B, kind string) *benchServer {
	return startBenchServerBin(b, os.Args[0], kind)
}

func startBenchServerBin(b *testing.B, bin, kind string) *benchServer {
	b.Helper()
	cmd := exec.Command(bin, "-test.run=^TestBenchServerProcess$", "-test.count=1")
	cmd.Env = append(os.Environ(), serveEnv+"="+kind)
	stdin, err := cmd.StdinPipe()
	if err != nil {
		b.Fatal(err)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		b.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	s := &benchServer{cmd: cmd, stdin: stdin}
	b.Cleanup(func() { _ = stdin.Close(); _ = cmd.Wait() })
	sc := bufio.NewScanner(out)
	for sc.Scan() {
		if addr, ok := strings.CutPrefix(sc.Text(), "ADDR "); ok {
			s.base = "http://" + addr + "/v1/sip/voice/"
			s.url = s.base + "decide"
			go func() { _, _ = io.Copy(io.Discard, out) }()
			return s
		}
	}
	b.Fatalf("%s server printed no address", kind)
	return nil
}

// cpu is the server process's user+system CPU time so far (/proc/PID/stat, clock ticks of
// 10 ms on Linux).
func (s *benchServer) cpu(b *testing.B) time.Duration {
	b.Helper()
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", s.cmd.Process.Pid))
	if err != nil {
		b.Fatal(err)
	}
	f := strings.Fields(string(data[bytes.LastIndexByte(data, ')')+2:]))
	ut, _ := strconv.ParseInt(f[11], 10, 64)
	st, _ := strconv.ParseInt(f[12], 10, 64)
	return time.Duration(ut+st) * 10 * time.Millisecond
}

// round posts n messages over conc keep-alive connections and returns the wall time and
// the server's CPU time they took.
func (s *benchServer) round(b *testing.B, client *http.Client, msgs [][]byte, n, conc int) (wall, cpu time.Duration) {
	b.Helper()
	c0, t0 := s.cpu(b), time.Now()
	var wg sync.WaitGroup
	var failed sync.Once
	for w := range conc {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := w; i < n; i += conc {
				resp, err := client.Post(s.url, "message/sip", bytes.NewReader(msgs[i%len(msgs)]))
				if err != nil {
					failed.Do(func() { b.Error(err) })
					return
				}
				_, _ = io.Copy(io.Discard, resp.Body)
				_ = resp.Body.Close()
				if resp.StatusCode != http.StatusOK {
					failed.Do(func() { b.Errorf("status %d", resp.StatusCode) })
					return
				}
			}
		}()
	}
	wg.Wait()
	return time.Since(t0), s.cpu(b) - c0
}

// BenchmarkDecideVsTrivialHTTP is the SIP decision as Kamailio sees it: the decision endpoint
// (a real Handler over a real engine with the example DCR rules, net/http on loopback, its own
// process) against a trivial net/http server that reads the same body and answers a constant
// (its own process), driven by the same client in alternating rounds. It reports decisions/s
// and server CPU per decision for both, and their ratios (tether / trivial); with
// TETHER_SIPDECIDE_BENCH_BASELINE, an older build's decision server too (old-cpu-ratio,
// new/old-cpu).
func BenchmarkDecideVsTrivialHTTP(b *testing.B) {
	const conc, perRound = 8, 4000
	servers := []*benchServer{startBenchServer(b, "tether"), startBenchServer(b, "trivial")}
	if old := os.Getenv(baselineEnv); old != "" {
		servers = append(servers, startBenchServerBin(b, old, "tether"))
	}
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: conc}}
	b.Cleanup(client.CloseIdleConnections)
	msgs := benchMessages(1024)
	// Warm them up (connections, engine tables, GC).
	for _, s := range servers {
		s.round(b, client, msgs, 500, conc)
	}
	wall := make([]time.Duration, len(servers))
	cpu := make([]time.Duration, len(servers))
	var n int
	for b.Loop() {
		for i, s := range servers {
			w, c := s.round(b, client, msgs, perRound, conc)
			wall[i] += w
			cpu[i] += c
		}
		n += perRound
	}
	rate := func(i int) float64 { return float64(n) / wall[i].Seconds() }
	perOp := func(i int) float64 { return float64(cpu[i].Microseconds()) / float64(n) }
	b.ReportMetric(rate(0), "tether-decisions/s")
	b.ReportMetric(rate(1), "trivial-requests/s")
	b.ReportMetric(perOp(0), "tether-cpu-µs/op")
	b.ReportMetric(perOp(1), "trivial-cpu-µs/op")
	b.ReportMetric(rate(0)/rate(1), "rate-ratio")
	b.ReportMetric(perOp(0)/perOp(1), "cpu-ratio")
	if len(servers) > 2 {
		b.ReportMetric(perOp(2), "old-cpu-µs/op")
		b.ReportMetric(perOp(2)/perOp(1), "old-cpu-ratio")
		b.ReportMetric(perOp(0)/perOp(2), "new/old-cpu")
	}
}

// exchange sends one request and fails b unless it gets want.
func exchange(b *testing.B, client *http.Client, method, url, body string, want int) string {
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	if err != nil {
		b.Error(err)
		return ""
	}
	resp, err := client.Do(req)
	if err != nil {
		b.Error(err)
		return ""
	}
	defer func() { _ = resp.Body.Close() }()
	got, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != want {
		b.Errorf("%s %s: status %d (%s), want %d", method, url, resp.StatusCode, got, want)
	}
	return string(got)
}

// callRound runs n requests of one endpoint over conc connections and returns the server CPU
// they took. do(i) sends request i.
func (s *benchServer) callRound(b *testing.B, n, conc int, do func(i int)) time.Duration {
	c0 := s.cpu(b)
	var wg sync.WaitGroup
	for w := range conc {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := w; i < n; i += conc {
				do(i)
			}
		}()
	}
	wg.Wait()
	return s.cpu(b) - c0
}

// BenchmarkCallEndpointsHTTP is the call-load and failover endpoints as Kamailio uses them,
// each server its own process: per call, the decision of its INVITE, then POST calls/answered
// and POST calls/ended with its Call-ID; per dialog failover, POST failover with a token; and
// GET calls. It reports the server CPU per request of each kind, and the trivial server's
// per request (the same client, alternating rounds) with the ratios to it. With
// TETHER_SIPDECIDE_BENCH_BASELINE naming an older build of this test binary, that build's
// server runs too, and the ratios to it are reported as well (old-ratio-*: this / old).
func BenchmarkCallEndpointsHTTP(b *testing.B) {
	const conc, perRound = 8, 2000
	servers := []*benchServer{startBenchServer(b, "calls")}
	if old := os.Getenv(baselineEnv); old != "" {
		servers = append(servers, startBenchServerBin(b, old, "calls"))
	}
	trivial := startBenchServer(b, "trivial")
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: conc}}
	b.Cleanup(client.CloseIdleConnections)
	msgs := benchMessages(perRound)
	tokens := make([]string, len(servers))
	for i, s := range servers {
		// A token for the failover rounds: the answer's ";tk=" parameter.
		uri := exchange(b, client, http.MethodPost, s.url+"?token=1", string(msgs[0]), http.StatusOK)
		_, tok, ok := strings.Cut(uri, ";"+sipdecide.TokenParam+"=")
		if !ok {
			b.Fatalf("no token in %q", uri)
		}
		tokens[i] = tok
	}
	kinds := []string{"decide", "answered", "ended", "failover", "list"}
	cpu := make([][]time.Duration, len(servers))
	for i := range cpu {
		cpu[i] = make([]time.Duration, len(kinds))
	}
	var trivialCPU time.Duration
	round := 0
	for b.Loop() {
		for si, s := range servers {
			// Call-IDs unique per round, so every call is new.
			callID := func(i int) string { return fmt.Sprintf("r%d-%d", round, i) }
			invite := func(i int) string {
				m := msgs[i]
				return strings.Replace(string(m), "Call-ID: "+strconv.Itoa(i)+"-bench@192.0.2.10", "Call-ID: "+callID(i), 1)
			}
			cpu[si][0] += s.callRound(b, perRound, conc, func(i int) {
				exchange(b, client, http.MethodPost, s.url, invite(i), http.StatusOK)
			})
			cpu[si][1] += s.callRound(b, perRound, conc, func(i int) {
				exchange(b, client, http.MethodPost, s.base+"calls/answered", callID(i), http.StatusNoContent)
			})
			cpu[si][2] += s.callRound(b, perRound, conc, func(i int) {
				exchange(b, client, http.MethodPost, s.base+"calls/ended", callID(i), http.StatusNoContent)
			})
			cpu[si][3] += s.callRound(b, perRound, conc, func(int) {
				exchange(b, client, http.MethodPost, s.base+"failover", tokens[si], http.StatusOK)
			})
			cpu[si][4] += s.callRound(b, perRound, conc, func(int) {
				exchange(b, client, http.MethodGet, s.base+"calls", "", http.StatusOK)
			})
		}
		trivialCPU += trivial.callRound(b, perRound, conc, func(i int) {
			exchange(b, client, http.MethodPost, trivial.url, callID0(i), http.StatusOK)
		})
		round++
	}
	n := float64(round * perRound)
	perOp := func(d time.Duration) float64 { return float64(d.Microseconds()) / n }
	b.ReportMetric(perOp(trivialCPU), "trivial-cpu-µs/op")
	for k, kind := range kinds {
		b.ReportMetric(perOp(cpu[0][k]), kind+"-cpu-µs/op")
		b.ReportMetric(perOp(cpu[0][k])/perOp(trivialCPU), kind+"-cpu-ratio")
		if len(servers) > 1 {
			b.ReportMetric(perOp(cpu[1][k]), "old-"+kind+"-cpu-µs/op")
			b.ReportMetric(perOp(cpu[0][k])/perOp(cpu[1][k]), "old-ratio-"+kind)
		}
	}
}

func callID0(i int) string { return "c" + strconv.Itoa(i) }
