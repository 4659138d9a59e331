// Command replicas runs one MCP server replica (built with the official Go SDK) for every
// instance of the MCP services in a tether config file, at the instance's address and HTTP
// port, so the example deployment can be tried without other software:
//
//	go run ./examples/mcp/replicas -c examples/mcp/tether.yaml
//
// Each replica is named after its instance id and serves Streamable HTTP at /mcp, HTTP+SSE at
// /sse (endpoint /sse?sessionid=…) and /healthz. Its tools "whoami" and "roots" answer with
// the replica's name, and its Streamable HTTP session ids start with it, so a client can see
// which replica served each call. Ctrl-C stops them all.
package main

import (
	"context"
	"flag"
	"fmt"
	"net"
	"os"
	"os/signal"
	"strconv"
	"syscall"

	"github.com/tether-dev/tether/examples/mcp/replicas/mcpreplica"
	"github.com/tether-dev/tether/pkg/config"
	"github.com/tether-dev/tether/pkg/registry"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "replicas:", err)
		os.Exit(1)
	}
}

func run() error {
	path := flag.String("c", "examples/mcp/tether.yaml", "tether config `file`")
	flag.Parse()
	cfg, err := config.Load(*path)
	if err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	services, instances := cfg.Registry()
	mcp := map[string]bool{}
	for _, s := range services {
		mcp[s.Name] = s.Affinity == registry.AffinityMCPStreamable || s.Affinity == registry.AffinityMCPSSE
	}
	started := 0
	for _, in := range instances {
		if !mcp[in.Service] || in.HTTPPort == 0 {
			continue
		}
		addr := net.JoinHostPort(in.Address, strconv.Itoa(in.HTTPPort))
		s, err := mcpreplica.Start(ctx, in.ID, mcpreplica.Options{Addr: addr})
		if err != nil {
			return fmt.Errorf("instance %s/%s: %w", in.Service, in.ID, err)
		}
		defer s.Close()
		fmt.Printf("%s/%s listening on http://%s (/mcp, /sse, /healthz)\n", in.Service, in.ID, s.Addr)
		started++
	}
	if started == 0 {
		return fmt.Errorf("%s has no MCP service instance with an HTTP port", *path)
	}
	<-ctx.Done()
	return nil
}
