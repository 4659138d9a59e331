package xds_test

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"runtime/pprof"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	"github.com/tether-dev/tether/pkg/registry"
	"github.com/tether-dev/tether/pkg/xds"
)

// Environment of the fleet's client process (TestHelperFleetClients).
const (
	fleetAddrEnv    = "TETHER_FLEET_ADDR"
	fleetClientsEnv = "TETHER_FLEET_CLIENTS"
)

// BenchmarkXDSFleet connects a fleet of ADS clients (default 1,000; TETHER_FLEET_CLIENTS to
// change) to one tether xDS server, at the 1,000-service × 10-instance model of
// BenchmarkRegistryChangeToClient. The clients run in a separate process (this test binary
// re-executed as TestHelperFleetClients), each with its own gRPC connection and one
// state-of-the-world ADS stream subscribed like Envoy: CDS wildcard, then EDS for every cluster,
// every response ACKed. Reported:
//
//   - heap-KB/client: tether's live heap (after GC) with the fleet connected and in sync, minus
//     before it connected, per client. tether's process holds only the server and the registry.
//   - connect-s: until every client held every cluster and endpoint.
//   - cpu-us/connect: tether's process CPU (user+system) over that time, per client: the figure
//     that does not depend on how much of the 2 cores the client process takes.
//   - ns/op: one instance's health flips; the time until all clients have the new endpoints
//     (debounce off, as in one-endpoint; the default 50 ms debounce adds up to 50 ms). On a
//     loaded machine this is mostly the time the two processes wait for a core.
//   - cpu-ms/change: tether's process CPU over the changes, per change (every client's EDS
//     response and ACK): the fan-out's cost, whatever the load.
//   - fleet-cpu-ms/change: the client process's CPU per change (decoding the response,
//     sending the ACK of 1,000 names), which shares the cores with tether.
func BenchmarkXDSFleet(b *testing.B) {
	n := 1000
	if v := os.Getenv(fleetClientsEnv); v != "" {
		var err error
		if n, err = strconv.Atoi(v); err != nil || n < 1 {
			b.Fatalf("%s=%q", fleetClientsEnv, v)
		}
	}
	reg := registry.New()
	svcs, ins := benchModel(1)
	if err := reg.Apply(svcs, ins); err != nil {
		b.Fatal(err)
	}
	srv := xds.NewServer(reg, xds.WithDebounce(0))
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Run(ctx, lis) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			b.Error(err)
		}
	}()
	for srv.Stats().Publishes == 0 {
		time.Sleep(time.Millisecond)
	}
	before := heapMB()

	cmd := exec.Command(os.Args[0], "-test.run=^TestHelperFleetClients$", "-test.timeout=30m")
	cmd.Env = append(os.Environ(), fleetAddrEnv+"="+lis.Addr().String(), fleetClientsEnv+"="+strconv.Itoa(n))
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		b.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		b.Fatal(err)
	}
	cpuBefore := processCPU(b)
	start := time.Now()
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	defer func() {
		_ = stdin.Close() // the helper exits when its stdin closes
		if err := cmd.Wait(); err != nil {
			b.Errorf("fleet process: %v", err)
		}
	}()
	lines := bufio.NewScanner(stdout)
	expect := func(want string) {
		b.Helper()
		for lines.Scan() {
			l := lines.Text()
			if !strings.HasPrefix(l, "fleet: ") {
				fmt.Fprintln(os.Stderr, l) // the helper's test output: why it failed, if it did
				continue
			}
			if l != "fleet: "+want {
				b.Fatalf("fleet process said %q, want %q", l, "fleet: "+want)
			}
			return
		}
		b.Fatalf("fleet process ended before %q: %v", want, lines.Err())
	}
	expect("ready")
	connected := time.Since(start)
	cpuPerConnect := float64((processCPU(b) - cpuBefore).Microseconds()) / float64(n)
	after := heapMB()
	perClient := (after - before) * 1024 / float64(n)
	if path := os.Getenv("TETHER_FLEET_HEAPPROFILE"); path != "" { // inuse_space with the fleet connected
		f, err := os.Create(path)
		if err != nil {
			b.Fatal(err)
		}
		if err := pprof.WriteHeapProfile(f); err != nil {
			b.Fatal(err)
		}
		_ = f.Close()
	}
	b.Logf("%d clients: tether heap %.1f MB before, %.1f MB connected (%.0f KB per client); connected and in sync in %s, tether CPU %.0f µs per connect",
		n, before, after, perClient, connected.Round(time.Millisecond), cpuPerConnect)

	if path := os.Getenv("TETHER_FLEET_CPUPROFILE"); path != "" { // tether's CPU during the fan-outs
		f, err := os.Create(path)
		if err != nil {
			b.Fatal(err)
		}
		if err := pprof.StartCPUProfile(f); err != nil {
			b.Fatal(err)
		}
		defer func() { pprof.StopCPUProfile(); _ = f.Close() }()
	}
	cpuFanout, fleetFanout := processCPU(b), childCPU(b, cmd.Process.Pid)
	i := 0
	for b.Loop() {
		svc := fmt.Sprintf("svc-%04d", i%benchServices)
		h, want := registry.HealthUnhealthy, benchInstances-1
		if (i/benchServices)%2 == 1 {
			h, want = registry.HealthHealthy, benchInstances
		}
		i++
		if _, err := fmt.Fprintf(stdin, "wait %s %d\n", svc, want); err != nil {
			b.Fatal(err)
		}
		expect("armed")
		if _, err := reg.SetHealth(registry.Key{Service: svc, ID: "i00"}, h); err != nil {
			b.Fatal(err)
		}
		expect("done")
	}
	changes := float64(i)
	b.ReportMetric(float64((processCPU(b)-cpuFanout).Milliseconds())/changes, "cpu-ms/change")
	b.ReportMetric(float64((childCPU(b, cmd.Process.Pid)-fleetFanout).Milliseconds())/changes, "fleet-cpu-ms/change")
	b.ReportMetric(perClient, "heap-KB/client")
	b.ReportMetric(connected.Seconds(), "connect-s")
	b.ReportMetric(cpuPerConnect, "cpu-us/connect")
}

// processCPU is this process's user plus system CPU time so far.
func processCPU(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// childCPU is the user plus system CPU time so far of the child process pid (the fleet), from
// /proc/pid/stat (utime and stime, in the kernel's USER_HZ of 100 ticks per second).
func childCPU(b *testing.B, pid int) time.Duration {
	stat, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		b.Fatal(err)
	}
	// The fields after the command name, which is in parentheses and may hold spaces: state is
	// field 3, utime 14, stime 15.
	f := strings.Fields(string(stat[bytes.LastIndexByte(stat, ')')+1:]))
	utime, err1 := strconv.ParseInt(f[14-3], 10, 64)
	stime, err2 := strconv.ParseInt(f[15-3], 10, 64)
	if err := errors.Join(err1, err2); err != nil {
		b.Fatalf("/proc/%d/stat: %v", pid, err)
	}
	return time.Duration(utime+stime) * 10 * time.Millisecond
}

// claEndpoints reads a ClusterLoadAssignment's cluster_name and number of lb_endpoints from its
// wire form without decoding the rest: on 2 cores the fleet's 10,000 clients share the CPU with
// tether, and decoding 10,000 copies of every CLA would measure the clients.
func claEndpoints(b []byte) (name string, count int, err error) {
	err = wireFields(b, func(num protowire.Number, v []byte) error {
		switch num {
		case 1: // cluster_name
			name = string(v)
		case 2: // endpoints (LocalityLbEndpoints)
			return wireFields(v, func(num protowire.Number, _ []byte) error {
				if num == 2 { // lb_endpoints
					count++
				}
				return nil
			})
		}
		return nil
	})
	return name, count, err
}

// wireFields calls f with each length-delimited field of a message's wire form, skipping the rest.
func wireFields(b []byte, f func(protowire.Number, []byte) error) error {
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return protowire.ParseError(n)
		}
		b = b[n:]
		if typ != protowire.BytesType {
			n = protowire.ConsumeFieldValue(num, typ, b)
			if n < 0 {
				return protowire.ParseError(n)
			}
			b = b[n:]
			continue
		}
		v, n := protowire.ConsumeBytes(b)
		if n < 0 {
			return protowire.ParseError(n)
		}
		if err := f(num, v); err != nil {
			return err
		}
		b = b[n:]
	}
	return nil
}

// fleetTarget is what the fleet waits for: every client holding count endpoints for svc.
type fleetTarget struct {
	svc     string
	count   int
	reached atomic.Int64
	done    chan struct{}
}

// fleetClient is one raw ADS stream subscribed the way Envoy subscribes.
type fleetClient struct {
	counts   map[string]int // endpoints per CLA
	clusters int
	last     *fleetTarget
}

// TestHelperFleetClients is BenchmarkXDSFleet's client process; it does nothing unless started
// by the benchmark. It prints "fleet: ready" once every client is in sync, then for each line
// "wait SVC N" on stdin prints "fleet: armed", and "fleet: done" once every client holds N
// endpoints for SVC. It exits when stdin closes.
func TestHelperFleetClients(t *testing.T) {
	addr := os.Getenv(fleetAddrEnv)
	if addr == "" {
		t.Skip("the client process of BenchmarkXDSFleet")
	}
	n, err := strconv.Atoi(os.Getenv(fleetClientsEnv))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var (
		target atomic.Pointer[fleetTarget]
		synced sync.WaitGroup
		errs   = make(chan error, n)
	)
	synced.Add(n)
	sem := make(chan struct{}, 32) // connect 32 at a time
	for c := range n {
		sem <- struct{}{}
		conn, err := grpc.NewClient("passthrough:///"+addr, grpc.WithTransportCredentials(insecure.NewCredentials()),
			grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(64<<20)))
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = conn.Close() }()
		go func() {
			err := runFleetClient(ctx, conn, fmt.Sprintf("fleet-%04d", c), &target, func() { <-sem; synced.Done() }, n)
			if err != nil && ctx.Err() == nil {
				errs <- err
			}
		}()
	}
	waitSync := make(chan struct{})
	go func() { synced.Wait(); close(waitSync) }()
	select {
	case <-waitSync:
	case err := <-errs:
		t.Fatal(err)
	}
	fmt.Println("fleet: ready")
	in := bufio.NewScanner(os.Stdin)
	for in.Scan() {
		var svc string
		var count int
		if _, err := fmt.Sscanf(in.Text(), "wait %s %d", &svc, &count); err != nil {
			t.Fatal(err)
		}
		tg := &fleetTarget{svc: svc, count: count, done: make(chan struct{})}
		target.Store(tg)
		fmt.Println("fleet: armed")
		select {
		case <-tg.done:
		case err := <-errs:
			t.Fatal(err)
		}
		fmt.Println("fleet: done")
	}
}

// runFleetClient runs one client until ctx ends. synced is called once the client holds every
// cluster and every CLA.
func runFleetClient(ctx context.Context, conn *grpc.ClientConn, id string, target *atomic.Pointer[fleetTarget], synced func(), n int) error {
	stream, err := discoveryv3.NewAggregatedDiscoveryServiceClient(conn).StreamAggregatedResources(ctx)
	if err != nil {
		return err
	}
	node := &corev3.Node{Id: id, Cluster: "fleet", UserAgentName: "envoy"}
	if err := stream.Send(&discoveryv3.DiscoveryRequest{Node: node, TypeUrl: resource.ClusterType}); err != nil {
		return err
	}
	c := &fleetClient{counts: map[string]int{}}
	var edsNames []string
	isSynced := false
	for {
		resp, err := stream.Recv()
		if err != nil {
			if errors.Is(err, io.EOF) {
				return nil
			}
			return err
		}
		ack := &discoveryv3.DiscoveryRequest{TypeUrl: resp.GetTypeUrl(), VersionInfo: resp.GetVersionInfo(), ResponseNonce: resp.GetNonce()}
		switch resp.GetTypeUrl() {
		case resource.ClusterType:
			c.clusters = len(resp.GetResources())
			first := edsNames == nil
			edsNames = make([]string, 0, c.clusters)
			for i := range c.clusters {
				edsNames = append(edsNames, fmt.Sprintf("svc-%04d", i))
			}
			if err := stream.Send(ack); err != nil {
				return err
			}
			if first {
				if err := stream.Send(&discoveryv3.DiscoveryRequest{TypeUrl: resource.EndpointType, ResourceNames: edsNames}); err != nil {
					return err
				}
			}
			continue
		case resource.EndpointType:
			for _, a := range resp.GetResources() {
				name, cnt, err := claEndpoints(a.GetValue())
				if err != nil {
					return err
				}
				c.counts[name] = cnt
			}
			ack.ResourceNames = edsNames
		}
		// The change has reached this client once it is decoded; the ACK follows.
		if tg := target.Load(); tg != nil && tg != c.last && c.counts[tg.svc] == tg.count {
			c.last = tg
			if tg.reached.Add(1) == int64(n) {
				close(tg.done)
			}
		}
		if err := stream.Send(ack); err != nil {
			return err
		}
		if !isSynced && c.clusters == benchServices && len(c.counts) == benchServices {
			isSynced = true
			synced()
		}
	}
}

// The fleet's clients count endpoints from the wire form; it must agree with decoding it.
func TestFleetClientsCountEndpointsLikeTheDecoder(t *testing.T) {
	_, ins := benchModel(1)
	cla := xds.ClusterLoadAssignment("svc-0000", ins[:benchInstances])
	b, err := proto.Marshal(cla)
	if err != nil {
		t.Fatal(err)
	}
	want := 0
	for _, l := range cla.GetEndpoints() {
		want += len(l.GetLbEndpoints())
	}
	name, got, err := claEndpoints(b)
	if err != nil || name != cla.GetClusterName() || got != want || want != benchInstances {
		t.Errorf("claEndpoints = %q, %d, %v; want %q, %d (of %d instances)", name, got, err, cla.GetClusterName(), want, benchInstances)
	}
	if _, _, err := claEndpoints(b[:len(b)-1]); err == nil {
		t.Error("claEndpoints accepted a truncated CLA")
	}
	if name, n, err := claEndpoints(nil); name != "" || n != 0 || err != nil { // an empty CLA's wire form
		t.Errorf("empty CLA: %q, %d, %v", name, n, err)
	}
}
