package sipdecide_test

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"runtime/pprof"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tether-dev/tether/pkg/affinity/affinitytest"
	"github.com/tether-dev/tether/pkg/sipdecide"
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
	switch kind {
	case "tether":
		h = sipdecide.NewHandler(hashFixture(t, affinitytest.Instances("voice", 5)).Engine)
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
	srv := &http.Server{Handler: h, ReadHeaderTimeout: time.Minute}
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

type benchServer struct {
	cmd   *exec.Cmd
	stdin io.WriteCloser
	url   string
}

func startBenchServer(b *testing.B, kind string) *benchServer {
	b.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^TestBenchServerProcess$", "-test.count=1")
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
			s.url = "http://" + addr + "/v1/sip/voice/decide"
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
// and server CPU per decision for both, and their ratios (tether / trivial).
func BenchmarkDecideVsTrivialHTTP(b *testing.B) {
	const conc, perRound = 8, 4000
	tether, trivial := startBenchServer(b, "tether"), startBenchServer(b, "trivial")
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: conc}}
	b.Cleanup(client.CloseIdleConnections)
	msgs := benchMessages(1024)
	// Warm both up (connections, engine tables, GC).
	tether.round(b, client, msgs, 500, conc)
	trivial.round(b, client, msgs, 500, conc)
	var wall, cpu [2]time.Duration
	var n int
	for b.Loop() {
		for i, s := range []*benchServer{tether, trivial} {
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
}
