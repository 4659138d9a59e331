package extproc_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	filterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/proto"

	"github.com/tether-dev/tether/pkg/affinity"
	"github.com/tether-dev/tether/pkg/affinity/affinitytest"
	"github.com/tether-dev/tether/pkg/extproc"
	"github.com/tether-dev/tether/pkg/registry"
	"github.com/tether-dev/tether/pkg/session/memstore"
)

// nullProcessor answers every message with an empty CONTINUE of the matching kind and does no
// other work: the baseline for the ext_proc round trip.
type nullProcessor struct {
	extprocv3.UnimplementedExternalProcessorServer
}

func (nullProcessor) Process(st extprocv3.ExternalProcessor_ProcessServer) error {
	for {
		req, err := st.Recv()
		if err != nil {
			return nil
		}
		var resp *extprocv3.ProcessingResponse
		switch req.GetRequest().(type) {
		case *extprocv3.ProcessingRequest_RequestHeaders:
			resp = &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_RequestHeaders{RequestHeaders: &extprocv3.HeadersResponse{}}}
		case *extprocv3.ProcessingRequest_ResponseHeaders:
			resp = &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ResponseHeaders{ResponseHeaders: &extprocv3.HeadersResponse{}}}
		default:
			resp = &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ResponseTrailers{ResponseTrailers: &extprocv3.TrailersResponse{}}}
		}
		if err := st.Send(resp); err != nil {
			return nil
		}
	}
}

// answeringNull is the null processor answering request_headers with a fixed copy of tether's
// routing answer (destination header and envoy.lb metadata): it separates the cost of the
// answer the wire contract mandates (encoding it, and decoding it in the client) from the cost
// of tether's decision.
type answeringNull struct {
	extprocv3.UnimplementedExternalProcessorServer
	answer *extprocv3.ProcessingResponse
}

func (a answeringNull) Process(st extprocv3.ExternalProcessor_ProcessServer) error {
	for {
		req, err := st.Recv()
		if err != nil {
			return nil
		}
		resp := &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ResponseHeaders{ResponseHeaders: &extprocv3.HeadersResponse{}}}
		if req.GetRequestHeaders() != nil {
			resp = a.answer
		}
		if err := st.Send(resp); err != nil {
			return nil
		}
	}
}

func serveBench(b *testing.B, register func(*grpc.Server)) extprocv3.ExternalProcessorClient {
	b.Helper()
	gs := grpc.NewServer(extproc.ServerOptions()...) // the same options for both servers
	register(gs)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	go func() { _ = gs.Serve(ln) }()
	conn, err := grpc.NewClient(ln.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = conn.Close(); gs.Stop() })
	return extprocv3.NewExternalProcessorClient(conn)
}

// roundTripOnce is the client driver shared by both servers: one HTTP exchange as Envoy runs it
// with tether's processing mode — request_headers → answer, response_headers → answer, close.
func roundTripOnce(ctx context.Context, c extprocv3.ExternalProcessorClient, reqH *extprocv3.ProcessingRequest) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	st, err := c.Process(ctx)
	if err != nil {
		return err
	}
	if err := st.Send(reqH); err != nil {
		return err
	}
	r1, err := st.Recv()
	if err != nil {
		return err
	}
	// Envoy reports the served host (selected_host_key) whatever the processor answered; the
	// driver sends the same message shape to both servers.
	served := destination(r1)
	if served == "" {
		served = "127.0.0.1:8001"
	}
	if err := st.Send(respHeaders("200", served, false)); err != nil {
		return err
	}
	if _, err := st.Recv(); err != nil {
		return err
	}
	if err := st.CloseSend(); err != nil {
		return err
	}
	switch _, err := st.Recv(); {
	case errors.Is(err, io.EOF):
		return nil
	case err == nil:
		return errors.New("close: got a message, want the end of the stream")
	default:
		return fmt.Errorf("close: %w", err)
	}
}

// BenchmarkExtProcRoundTrip compares tether deciding for existing cookie sessions with the null
// processor, on the same loopback gRPC client driver and the same parallelism. Metrics: req/s,
// p50 and p99 latency of one whole exchange (µs).
func BenchmarkExtProcRoundTrip(b *testing.B) {
	for _, par := range []int{1, 4} {
		b.Run(fmt.Sprintf("null/par=%d", par), func(b *testing.B) {
			c := serveBench(b, func(g *grpc.Server) { extprocv3.RegisterExternalProcessorServer(g, nullProcessor{}) })
			runRoundTrips(b, c, par, nullRequest)
		})
		b.Run(fmt.Sprintf("tether/par=%d", par), func(b *testing.B) {
			c, srv, reqs := tetherBench(b)
			runRoundTrips(b, c, par, func(i int) *extprocv3.ProcessingRequest { return reqs[i%len(reqs)] })
			if s := srv.Stats(); s.Decisions < uint64(b.N) || s.Rejects != (extproc.RejectCounts{}) {
				b.Fatalf("stats %+v after %d round trips: every request must be decided, none rejected", s, b.N)
			}
		})
	}
}

// nullRequest is what the driver sends the null processor: the same shape as tether's requests.
func nullRequest(int) *extprocv3.ProcessingRequest {
	return reqHeaders("GET", "/", true, "cookie", "tether-session=0123456789abcdef0123456789abcdef")
}

// tetherBench starts tether (real engine, registry, memstore) with 256 existing cookie sessions
// over 4 instances and returns a client, the server and one request per session.
func tetherBench(b *testing.B) (extprocv3.ExternalProcessorClient, *extproc.Server, []*extprocv3.ProcessingRequest) {
	b.Helper()
	svc := affinitytest.Service("web", registry.AffinityCookie)
	svc.SessionsPerInstance = 200
	svc.RequestSlotsPerInstance = 10000
	// Production-like background intervals (the fixture's 5 ms ones are for tests).
	f := affinitytest.New(b, []registry.Service{svc}, affinitytest.Instances("web", 4),
		affinitytest.WithEngineOptions(affinity.WithSweepInterval(time.Second)),
		affinitytest.WithStoreOptions(memstore.WithReapInterval(time.Second)))
	srv := extproc.NewServer(f.Engine)
	c := serveBench(b, func(g *grpc.Server) { extproc.Register(g, srv) })
	var reqs []*extprocv3.ProcessingRequest
	for range 256 {
		st, err := c.Process(context.Background())
		if err != nil {
			b.Fatal(err)
		}
		_ = st.Send(reqHeaders("GET", "/", true))
		r1, _ := st.Recv()
		_ = st.Send(respHeaders("200", destination(r1), false))
		r2, err := st.Recv()
		if err != nil {
			b.Fatal(err)
		}
		v, _, _ := setHeader(r2.GetResponseHeaders().GetResponse().GetHeaderMutation(), "set-cookie")
		kv, _, _ := strings.Cut(v, ";")
		if kv == "" {
			b.Fatal("no session cookie")
		}
		reqs = append(reqs, reqHeaders("GET", "/", true, "cookie", kv))
		_ = st.CloseSend()
		_, _ = st.Recv()
	}
	return c, srv, reqs
}

// BenchmarkExtProcRoundTripPaired runs the null processor and tether in alternating rounds of
// 100 exchanges on the same driver and parallelism, so load drift on a shared machine hits both
// alike; b.N exchanges go to each. A third server, "answer", is the null processor sending
// tether's routing answer: null → answer is the cost of the answer the wire contract mandates,
// answer → tether the cost of deciding. Metrics per server: req/s over all rounds and the median
// round's req/s (robust to stalls caused by other processes), p50 and p99 latency of a whole
// exchange, and process CPU per exchange (client and server together, same driver); plus
// tether-%-of-null from the median rounds (target ≥ 80).
func BenchmarkExtProcRoundTripPaired(b *testing.B) {
	for _, par := range []int{1, 4} {
		b.Run(fmt.Sprintf("par=%d", par), func(b *testing.B) {
			nullC := serveBench(b, func(g *grpc.Server) { extprocv3.RegisterExternalProcessorServer(g, nullProcessor{}) })
			tc, srv, reqs := tetherBench(b)
			ans := firstAnswer(b, tc, reqs[0])
			ansC := serveBench(b, func(g *grpc.Server) { extprocv3.RegisterExternalProcessorServer(g, answeringNull{answer: ans}) })
			workers := par * runtime.GOMAXPROCS(0)
			type side struct {
				name      string
				lat       []time.Duration
				wall, cpu time.Duration
				rounds    []float64 // req/s per round
				run       func(n int) (time.Duration, []time.Duration)
			}
			sides := []*side{
				{name: "null", run: func(n int) (time.Duration, []time.Duration) { return round(b, nullC, workers, n, nullRequest) }},
				{name: "answer", run: func(n int) (time.Duration, []time.Duration) { return round(b, ansC, workers, n, nullRequest) }},
				{name: "tether", run: func(n int) (time.Duration, []time.Duration) {
					return round(b, tc, workers, n, func(i int) *extprocv3.ProcessingRequest { return reqs[i%len(reqs)] })
				}},
			}
			b.ReportAllocs()
			b.ResetTimer()
			for done := 0; done < b.N; {
				n := min(100, b.N-done)
				for _, sd := range sides {
					c0 := processCPU()
					d, l := sd.run(n)
					sd.cpu += processCPU() - c0
					sd.wall += d
					sd.lat = append(sd.lat, l...)
					sd.rounds = append(sd.rounds, float64(n)/d.Seconds())
				}
				done += n
			}
			b.StopTimer()
			if s := srv.Stats(); s.Decisions < uint64(b.N) || s.Rejects != (extproc.RejectCounts{}) {
				b.Fatalf("stats %+v: every request must be decided, none rejected", s)
			}
			median := map[string]float64{}
			for _, sd := range sides {
				slices.Sort(sd.lat)
				slices.Sort(sd.rounds)
				median[sd.name] = sd.rounds[len(sd.rounds)/2]
				b.ReportMetric(float64(b.N)/sd.wall.Seconds(), sd.name+"-req/s")
				b.ReportMetric(median[sd.name], sd.name+"-median-req/s")
				b.ReportMetric(float64(sd.lat[len(sd.lat)/2].Microseconds()), sd.name+"-p50-µs")
				b.ReportMetric(float64(sd.lat[len(sd.lat)*99/100].Microseconds()), sd.name+"-p99-µs")
				b.ReportMetric(float64(sd.cpu.Microseconds())/float64(b.N), sd.name+"-cpu-µs/op")
			}
			b.ReportMetric(100*median["tether"]/median["null"], "tether-%-of-null")
		})
	}
}

// firstAnswer returns tether's answer to one request_headers message.
func firstAnswer(b *testing.B, c extprocv3.ExternalProcessorClient, req *extprocv3.ProcessingRequest) *extprocv3.ProcessingResponse {
	b.Helper()
	st, err := c.Process(context.Background())
	if err != nil {
		b.Fatal(err)
	}
	if err := st.Send(req); err != nil {
		b.Fatal(err)
	}
	r, err := st.Recv()
	if err != nil || destination(r) == "" {
		b.Fatalf("no routing answer: %v %v", r, err)
	}
	_ = st.CloseSend()
	_, _ = st.Recv()
	return r
}

// processCPU returns the user and system CPU time the process has used.
func processCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// round runs n exchanges on workers goroutines and returns the wall time and the latencies.
func round(b *testing.B, c extprocv3.ExternalProcessorClient, workers, n int, req func(int) *extprocv3.ProcessingRequest) (time.Duration, []time.Duration) {
	var next atomic.Int64
	lat := make([]time.Duration, n)
	var wg sync.WaitGroup
	start := time.Now()
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1) - 1)
				if i >= n {
					return
				}
				t0 := time.Now()
				if err := roundTripOnce(context.Background(), c, req(i)); err != nil {
					b.Error(err)
					return
				}
				lat[i] = time.Since(t0)
			}
		}()
	}
	wg.Wait()
	return time.Since(start), lat
}

// runRoundTrips runs b.N exchanges with par goroutines per GOMAXPROCS and reports req/s, p50
// and p99.
func runRoundTrips(b *testing.B, c extprocv3.ExternalProcessorClient, par int, req func(i int) *extprocv3.ProcessingRequest) {
	b.Helper()
	var mu sync.Mutex
	var lat []time.Duration
	b.SetParallelism(par)
	b.ReportAllocs()
	b.ResetTimer()
	start := time.Now()
	var seq sync.Mutex
	next := 0
	b.RunParallel(func(pb *testing.PB) {
		local := make([]time.Duration, 0, 1024)
		for pb.Next() {
			seq.Lock()
			i := next
			next++
			seq.Unlock()
			t0 := time.Now()
			if err := roundTripOnce(context.Background(), c, req(i)); err != nil {
				b.Error(err)
				return
			}
			local = append(local, time.Since(t0))
		}
		mu.Lock()
		lat = append(lat, local...)
		mu.Unlock()
	})
	elapsed := time.Since(start)
	b.StopTimer()
	if len(lat) == 0 {
		return
	}
	slices.Sort(lat)
	b.ReportMetric(float64(len(lat))/elapsed.Seconds(), "req/s")
	b.ReportMetric(float64(lat[len(lat)/2].Microseconds()), "p50-µs")
	b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds()), "p99-µs")
}

// fullDuplexOnce is one exchange as Envoy runs it with FULL_DUPLEX_STREAMED bodies: request
// headers (no body) → answer, response headers → answer, chunks response-body chunks of
// chunkSize bytes each answered, the last with end_of_stream; the stream then ends.
func fullDuplexOnce(ctx context.Context, c extprocv3.ExternalProcessorClient, reqH *extprocv3.ProcessingRequest, chunk []byte, chunks int) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	st, err := c.Process(ctx)
	if err != nil {
		return err
	}
	if err := st.Send(reqH); err != nil {
		return err
	}
	r1, err := st.Recv()
	if err != nil {
		return err
	}
	if err := st.Send(respHeaders("200", destination(r1), false)); err != nil {
		return err
	}
	if _, err := st.Recv(); err != nil {
		return err
	}
	for i := range chunks {
		if err := st.Send(respBody(string(chunk), i == chunks-1)); err != nil {
			return err
		}
		r, err := st.Recv()
		if err != nil {
			return err
		}
		if len(r.GetResponseBody().GetResponse().GetBodyMutation().GetStreamedResponse().GetBody()) != len(chunk) {
			return fmt.Errorf("chunk %d not streamed back: %v", i, r)
		}
	}
	if err := st.CloseSend(); err != nil {
		return err
	}
	if _, err := st.Recv(); !errors.Is(err, io.EOF) {
		return fmt.Errorf("close: %w", err)
	}
	return nil
}

// BenchmarkFullDuplexCost measures what bodyMode full-duplex costs against headers-only on the
// same tether server and driver, in alternating rounds of 100 exchanges: the headers-only
// exchange (request and response headers) against the same exchange whose 4 KiB response body
// streams through ext_proc in 4 chunks of 1 KiB. Metrics: exchanges/s per mode (median round)
// and fullduplex-%-of-headers.
func BenchmarkFullDuplexCost(b *testing.B) {
	c, _, reqs := tetherBench(b)
	fd := make([]*extprocv3.ProcessingRequest, len(reqs))
	for i, r := range reqs {
		fd[i] = proto.Clone(r).(*extprocv3.ProcessingRequest)
		fd[i].ProtocolConfig = &extprocv3.ProtocolConfiguration{
			RequestBodyMode:  filterv3.ProcessingMode_FULL_DUPLEX_STREAMED,
			ResponseBodyMode: filterv3.ProcessingMode_FULL_DUPLEX_STREAMED,
		}
	}
	chunk := []byte(strings.Repeat("x", 1024))
	workers := 4 * runtime.GOMAXPROCS(0)
	modes := []struct {
		name string
		one  func(i int) error
	}{
		{"headers", func(i int) error { return roundTripOnce(context.Background(), c, reqs[i%len(reqs)]) }},
		{"fullduplex", func(i int) error { return fullDuplexOnce(context.Background(), c, fd[i%len(fd)], chunk, 4) }},
	}
	rounds := make([][]float64, len(modes))
	b.ResetTimer()
	for done := 0; done < b.N; {
		n := min(100, b.N-done)
		for m, mode := range modes {
			var next atomic.Int64
			var wg sync.WaitGroup
			start := time.Now()
			for range workers {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for i := int(next.Add(1) - 1); i < n; i = int(next.Add(1) - 1) {
						if err := mode.one(i); err != nil {
							b.Error(err)
							return
						}
					}
				}()
			}
			wg.Wait()
			rounds[m] = append(rounds[m], float64(n)/time.Since(start).Seconds())
		}
		done += n
	}
	b.StopTimer()
	med := make([]float64, len(modes))
	for m, mode := range modes {
		slices.Sort(rounds[m])
		med[m] = rounds[m][len(rounds[m])/2]
		b.ReportMetric(med[m], mode.name+"-median-exchanges/s")
	}
	b.ReportMetric(100*med[1]/med[0], "fullduplex-%-of-headers")
}
