// Command nullproc is the baseline of tether's cross-process ext_proc benchmark: a null
// envoy.service.ext_proc.v3.ExternalProcessor that answers every message with an empty
// CONTINUE of the matching kind and does no other work — the server a new user would write in
// a few lines. It runs on grpc-go with tether's ext_proc server options (extproc.ServerOptions:
// keepalive policy, stream workers, the codec), the same grpc-go version as tether, so that the
// benchmark's ratios measure what tether does per exchange, not its transport settings;
// -grpc-defaults runs it on grpc-go's defaults instead. It keeps Go's default GC pacing unless
// -gc-floor-mib gives it tether serve's heap-goal floor (pkg/gcfloor). It prints its bound address on stdout
// (after the pprof address with -pprof) and serves until killed.
package main

import (
	_ "expvar" // -pprof: /debug/vars (memstats) too
	"flag"
	"fmt"
	"log"
	"net"
	"net/http"
	_ "net/http/pprof" // -pprof
	"os"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc"

	"github.com/tether-dev/tether/pkg/extproc"
	"github.com/tether-dev/tether/pkg/gcfloor"
)

type null struct {
	extprocv3.UnimplementedExternalProcessorServer
}

func (null) Process(st extprocv3.ExternalProcessor_ProcessServer) error {
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
		case *extprocv3.ProcessingRequest_RequestBody:
			resp = &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_RequestBody{RequestBody: &extprocv3.BodyResponse{}}}
		case *extprocv3.ProcessingRequest_ResponseBody:
			resp = &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ResponseBody{ResponseBody: &extprocv3.BodyResponse{}}}
		case *extprocv3.ProcessingRequest_RequestTrailers:
			resp = &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_RequestTrailers{RequestTrailers: &extprocv3.TrailersResponse{}}}
		default:
			resp = &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ResponseTrailers{ResponseTrailers: &extprocv3.TrailersResponse{}}}
		}
		if err := st.Send(resp); err != nil {
			return nil
		}
	}
}

func main() {
	listen := flag.String("listen", "127.0.0.1:0", "address to serve ext_proc on")
	defaults := flag.Bool("grpc-defaults", false, "serve with grpc-go's default server options, not tether's")
	// Server options to try against tether's (applied after them), for EXTPROC_BENCH_ALT.
	workers := flag.Int("stream-workers", -1, "grpc.NumStreamWorkers (0: a goroutine per stream)")
	writeBuf := flag.Int("write-buffer", -1, "grpc.WriteBufferSize")
	readBuf := flag.Int("read-buffer", -1, "grpc.ReadBufferSize")
	window := flag.Int("window", -1, "grpc.InitialWindowSize and InitialConnWindowSize (disables BDP estimation)")
	gcFloor := flag.Int("gc-floor-mib", 0, "a heap-goal floor in MiB, as tether serve's runtime.gcHeapFloorMiB (0: Go's default pacing)")
	pprofAddr := flag.String("pprof", "", "also serve /debug/pprof and /debug/vars on this address; its bound address is printed first, as \"pprof ADDR\"")
	flag.Parse()
	if *pprofAddr != "" {
		pl, err := net.Listen("tcp", *pprofAddr)
		if err != nil {
			log.Fatal(err)
		}
		_, _ = fmt.Fprintln(os.Stdout, "pprof", pl.Addr().String())
		go func() { log.Fatal(http.Serve(pl, nil)) }() //nolint:gosec // a benchmark's loopback debug listener
	}
	if *gcFloor > 0 {
		gcfloor.Start(uint64(*gcFloor)<<20, 100)
	}
	ln, err := net.Listen("tcp", *listen)
	if err != nil {
		log.Fatal(err)
	}
	var opts []grpc.ServerOption
	if !*defaults {
		opts = extproc.ServerOptions()
	}
	if *workers >= 0 {
		opts = append(opts, grpc.NumStreamWorkers(uint32(*workers)))
	}
	if *writeBuf >= 0 {
		opts = append(opts, grpc.WriteBufferSize(*writeBuf))
	}
	if *readBuf >= 0 {
		opts = append(opts, grpc.ReadBufferSize(*readBuf))
	}
	if *window > 0 {
		opts = append(opts, grpc.InitialWindowSize(int32(*window)), grpc.InitialConnWindowSize(int32(*window)))
	}
	gs := grpc.NewServer(opts...)
	extprocv3.RegisterExternalProcessorServer(gs, null{})
	_, _ = fmt.Fprintln(os.Stdout, ln.Addr().String())
	if err := gs.Serve(ln); err != nil {
		log.Fatal(err)
	}
}
