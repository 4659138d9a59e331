package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/tether-dev/tether/internal/testutil"
)

// floodConns is the slow flood of issue 25's finding 5: 1,500 connections that each send a
// request's headers and then its body one byte at a time.
const floodConns = 1500

// floodRedial is how long a flood connection tether cut waits before it dials again: the
// flood keeps its 1,500 connections coming (every one tether takes evicts an older one).
const floodRedial = 5 * time.Second

// floodNofile is the child tether's descriptor limit: the flood needs six times as many.
const floodNofile = 256

// TestAPIFloodLeavesExtProcAndHealth is the regression test for finding 5: under a slow-body
// flood of the API (1,500 connections, no token needed on loopback) a tether limited to 256
// descriptors keeps them (the API's connection cap evicts the flood's oldest connections
// instead of accepting until EMFILE), ext_proc accepts a new connection and serves it, and
// /healthz answers on a new connection. The build before ran out of descriptors: ext_proc
// stopped accepting and /healthz failed until the flood left. It also measures an independent
// ext_proc client's exchange rate during the flood against the same client's rate without it,
// in alternating rounds (logged as a ratio with the load average; not asserted).
func TestAPIFloodLeavesExtProcAndHealth(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a tether process and 1,500 connections")
	}
	dir := t.TempDir()
	config := filepath.Join(dir, "tether.yaml")
	writeFile(t, config, `apiVersion: tether/v1
listeners: {api: 127.0.0.1:0, extProc: 127.0.0.1:0, xds: '', sip: ''}
log: {level: warn}
registry: {allowedNetworks: [127.0.0.1/32]}
services:
- name: web
  affinity: cookie
  requestSlotsPerInstance: 10000
  instances:
  - {id: i0, address: 127.0.0.1, ports: {http: 18001}}
  - {id: i1, address: 127.0.0.1, ports: {http: 18002}}
`)
	c, ok := startChild(t, config, faultChildNofileEnv+fmt.Sprint("=", floodNofile))
	if !ok {
		t.Fatalf("tether exited %d:\n%s", c.exitCode, c.stderr.String())
	}
	// Exchanges return to one session (its cookie), as a browser does: no new session each.
	resp, err := testutil.PostJSON("http://"+c.api+"/v1/services/web/sessions", "{}")
	if err != nil {
		t.Fatal(err)
	}
	var created struct {
		ID string `json:"id"`
	}
	err = json.NewDecoder(resp.Body).Decode(&created)
	_ = resp.Body.Close()
	if err != nil || resp.StatusCode != http.StatusCreated {
		t.Fatalf("create a session: %d %v", resp.StatusCode, err)
	}
	cookie := "tether-session=" + created.ID

	// The independent client: its own connection, dialed before the flood.
	cc := dialExtProc(t, c.extProc)
	req := floodExchangeRequest(cookie)
	// rate runs one round of n exchanges and returns their rate and tether's CPU per exchange.
	rate := func(n int) (perSec float64, cpu time.Duration) {
		start, cpu0 := time.Now(), procCPU(c.cmd.Process.Pid)
		defer func() { cpu = (procCPU(c.cmd.Process.Pid) - cpu0) / time.Duration(n) }()
		var wg sync.WaitGroup
		var failed atomic.Int64
		for w := range 8 {
			wg.Go(func() {
				for i := w; i < n; i += 8 {
					ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
					if err := floodExchange(ctx, cc, req); err != nil {
						failed.Add(1)
					}
					cancel()
				}
			})
		}
		wg.Wait()
		if f := failed.Load(); f > 0 {
			t.Errorf("%d of %d exchanges failed", f, n)
		}
		return float64(n) / time.Since(start).Seconds(), 0
	}
	const roundSize = 4000
	rate(500) // warm up
	var quiet, flooded []float64
	var quietCPU, floodedCPU []float64
	round := func(rates, cpus *[]float64) {
		r, cpu := rate(roundSize)
		*rates, *cpus = append(*rates, r), append(*cpus, float64(cpu))
	}
	for range 3 {
		round(&quiet, &quietCPU)
	}

	fds := func() int {
		open, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", c.cmd.Process.Pid))
		if err != nil {
			t.Fatal(err)
		}
		return len(open)
	}
	quietFDs := fds()
	ctx, stopFlood := context.WithCancel(context.Background())
	var fl flood
	fl.start(ctx, c.api)
	defer func() { stopFlood(); fl.wg.Wait() }()
	// The flood is in place once every connection is sending its body and tether has taken
	// at least a cap's worth (the build before took them all, to its descriptor limit).
	waitFor(t, "every flood connection dialed and sending its body, and held by tether", func() bool {
		return fl.trickling.Load() >= floodConns && fds() >= quietFDs+floodNofile/5*3/4
	}, func() string {
		return fmt.Sprintf("%d of %d sending, tether holds %d descriptors (%d before the flood), %d cut", fl.trickling.Load(), floodConns, fds(), quietFDs, fl.cut.Load())
	})

	// A new client of each other listener gets in while the flood holds on.
	hctx, hcancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer hcancel()
	if err := healthz(hctx, c.api); err != nil {
		t.Errorf("/healthz on a new connection during the flood: %v", err)
	}
	fresh := dialExtProc(t, c.extProc)
	if err := floodExchange(hctx, fresh, req); err != nil {
		t.Errorf("an exchange on a new ext_proc connection during the flood: %v", err)
	}
	if open := fds(); open >= floodNofile-16 {
		t.Errorf("tether holds %d of its %d descriptors under the flood", open, floodNofile)
	}

	for range 5 {
		round(&flooded, &floodedCPU)
	}
	t.Logf("during the flood: tether holds %d descriptors (limit %d, %d before the flood); the flood dialed %d connections, %d cut by tether",
		fds(), floodNofile, quietFDs, fl.dials.Load(), fl.cut.Load())
	stopFlood()
	fl.wg.Wait()
	for range 3 {
		round(&quiet, &quietCPU)
	}
	t.Logf("ext_proc exchanges/s of an independent client (%d per round, 8 at a time): quiet %.0f (rounds %.0f), flooded %.0f (rounds %.0f): ratio %.2f; "+
		"tether CPU per exchange quiet %v, flooded %v (load average %.1f)",
		roundSize, median(quiet), quiet, median(flooded), flooded, median(flooded)/median(quiet),
		time.Duration(median(quietCPU)), time.Duration(median(floodedCPU)), loadAverage())
}

// flood holds floodConns slow-body connections to an API, redialing (after floodRedial) any that
// tether cuts, until its context ends.
type flood struct {
	wg                    sync.WaitGroup
	dials, trickling, cut atomic.Int64
}

func (f *flood) start(ctx context.Context, api string) {
	head := "POST /v1/services/web/sessions HTTP/1.1\r\nHost: " + api + "\r\nContent-Type: application/json\r\nX-Tether-Client: flood\r\nContent-Length: 100000\r\n\r\n{"
	for range floodConns {
		f.wg.Go(func() {
			first := true
			for ctx.Err() == nil {
				d := net.Dialer{Timeout: 5 * time.Second}
				conn, err := d.DialContext(ctx, "tcp", api)
				if err != nil {
					sleepCtx(ctx, time.Second)
					continue
				}
				f.dials.Add(1)
				stop := context.AfterFunc(ctx, func() { _ = conn.Close() })
				_, err = io.WriteString(conn, head)
				for err == nil && ctx.Err() == nil {
					if first {
						first = false
						f.trickling.Add(1)
					}
					sleepCtx(ctx, 500*time.Millisecond)
					_, err = conn.Write([]byte(" "))
				}
				stop()
				_ = conn.Close()
				if ctx.Err() == nil {
					f.cut.Add(1)
					sleepCtx(ctx, floodRedial)
				}
			}
		})
	}
}

func sleepCtx(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}

func healthz(ctx context.Context, api string) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+api+"/healthz", nil)
	if err != nil {
		return err
	}
	tr := &http.Transport{DisableKeepAlives: true}
	defer tr.CloseIdleConnections()
	resp, err := (&http.Client{Transport: tr}).Do(req)
	if err != nil {
		return err
	}
	defer func() { _ = resp.Body.Close() }()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("HTTP %d", resp.StatusCode)
	}
	return nil
}

func dialExtProc(t *testing.T, addr string) extprocv3.ExternalProcessorClient {
	t.Helper()
	conn, err := grpc.NewClient("passthrough:///"+addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return extprocv3.NewExternalProcessorClient(conn)
}

// floodExchangeRequest is a browser GET's request_headers with the session cookie.
func floodExchangeRequest(cookie string) *extprocv3.ProcessingRequest {
	kv := []string{":authority", "app.example", ":path", "/", ":method", "GET", ":scheme", "http"}
	if cookie != "" {
		kv = append(kv, "cookie", cookie)
	}
	h := &corev3.HeaderMap{}
	for i := 0; i+1 < len(kv); i += 2 {
		h.Headers = append(h.Headers, &corev3.HeaderValue{Key: kv[i], RawValue: []byte(kv[i+1])})
	}
	return &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: &extprocv3.HttpHeaders{Headers: h, EndOfStream: true}}}
}

// floodExchange runs one exchange's side stream: request_headers, its answer, the end.
func floodExchange(ctx context.Context, c extprocv3.ExternalProcessorClient, req *extprocv3.ProcessingRequest) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	st, err := c.Process(ctx, grpc.WaitForReady(true))
	if err != nil {
		return err
	}
	if err := st.Send(req); err != nil {
		return err
	}
	r, err := st.Recv()
	if err != nil {
		return err
	}
	if r.GetRequestHeaders() == nil {
		return fmt.Errorf("answer %v, want request_headers", r)
	}
	if err := st.CloseSend(); err != nil {
		return err
	}
	if _, err := st.Recv(); !errors.Is(err, io.EOF) {
		return fmt.Errorf("end of stream: %w", err)
	}
	return nil
}

func median(v []float64) float64 {
	s := slices.Clone(v)
	slices.Sort(s)
	return s[len(s)/2]
}

func loadAverage() float64 {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return -1
	}
	var l float64
	_, _ = fmt.Sscan(string(b), &l)
	return l
}

// procCPU is a process's user+system CPU time (/proc/PID/stat, clock ticks of 10 ms).
func procCPU(pid int) time.Duration {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+2:]))
	var u, s int64
	_, _ = fmt.Sscan(f[11], &u)
	_, _ = fmt.Sscan(f[12], &s)
	return time.Duration(u+s) * 10 * time.Millisecond
}
